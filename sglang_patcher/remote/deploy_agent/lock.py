"""The host's lock: one ``O_EXCL`` file holding the JSON holder (user, pid, host, start time,
deployment, token) of the one client that may change the host's files and state. Breaking it
(``break_lock``) is refused while its holder is a process of this host that still runs
(:mod:`holder`)."""

from __future__ import annotations

import json
import os

from ..holder import holder_liveness
from .base import Fail
from .files import fsync_dir, read_json


def describe_holder(h):
    if not h:
        return "nobody"
    if h.get("unreadable"):
        return "an unreadable lock file (break it with --break-lock if no deployment is running)"
    return "%s@%s pid %s since %s (deployment %s)" % (h.get("user"), h.get("host"), h.get("pid"),
                                                      h.get("started"), h.get("deployment"))


def refuse_live_holder(path, cur, holder):
    """``--break-lock`` breaks only a lock whose holder no longer runs: raise Fail(lock_held,
    ``running``) when ``cur`` is a process of this host that still runs — unless it is the very
    client process asking (``holder``: same host and pid; its own earlier lock)."""
    state, command = holder_liveness(cur)
    if state != "running":
        return
    if isinstance(holder, dict) and holder.get("host") == cur.get("host") and str(holder.get("pid")) == str(cur.get("pid")):
        return
    raise Fail("lock_held", "another deployment holds the lock %s: %s; its process, pid %s%s, still runs on %s: "
               "--break-lock breaks only a lock whose holder no longer runs"
               % (path, describe_holder(cur), cur.get("pid"), " (%s)" % command if command else "", cur.get("host")),
               holder=cur, running=True, command=command)


class HostLock:
    """The lock of a :class:`HostState` (which sets ``state`` and ``lock_path``)."""

    def read_lock(self):
        return read_json(self.lock_path)

    def acquire(self, holder, break_lock):
        """Take the lock for ``holder`` (a dict with a ``token``). Returns acquired|held|broken."""
        if not isinstance(holder, dict) or not holder.get("token"):
            raise Fail("bad_args", "holder with a token is required")
        data = json.dumps(holder, sort_keys=True).encode()
        broken = False
        for _ in range(3):
            os.makedirs(self.state, exist_ok=True)
            try:
                fd = os.open(self.lock_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileNotFoundError:
                continue   # the state dir went meanwhile (a failed first push removes the one it made)
            except FileExistsError:
                cur = self.read_lock()
                if cur is None:
                    continue
                if cur.get("token") == holder["token"]:
                    return "held"
                if break_lock and not broken:
                    refuse_live_holder(self.lock_path, cur, holder)
                    try:
                        os.unlink(self.lock_path)
                    except FileNotFoundError:
                        pass
                    broken = True
                    continue
                raise Fail("lock_held", "another deployment holds the lock %s: %s"
                           % (self.lock_path, describe_holder(cur)), holder=cur)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            fsync_dir(self.state)
            return "broken" if broken else "acquired"
        raise Fail("lock_held", "could not take the lock %s" % self.lock_path, holder=self.read_lock())

    def release(self, holder=None, force=False):
        cur = self.read_lock()
        if cur is None:
            return False
        if not force and holder is not None and cur.get("token") != holder.get("token"):
            raise Fail("lock_held", "the lock is held by %s, not by us" % describe_holder(cur), holder=cur)
        try:
            os.unlink(self.lock_path)
        except FileNotFoundError:
            return False
        fsync_dir(self.state)
        return True
