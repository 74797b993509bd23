"""The client of the host's deploy agent (:mod:`sglang_patcher.remote.deploy_agent`): one method per
agent operation, one round trip each, the agent's refusals raised as typed errors.

Also what the agent's protocol asks of a client: the lock *holder* it writes on the host
(:func:`make_holder`, and :func:`holder_is_stale` to tell a dead one) and the tar that carries file
contents both ways (:func:`payload_tar`, :func:`untar`).

It lives beside the agent, not in :mod:`sglang_patcher.deploy`: the smoke checks (:mod:`..checks`)
use its ``compile`` op too, and the deploy transaction uses the checks.
"""

from __future__ import annotations

import getpass
import io
import os
import socket
import tarfile
import time
import uuid
from typing import Any

from ..errors import DeployError, DriftError, LockHeldError, StateError
from ..manifest import sha256_bytes
from ..transport.base import Transport
from . import launcher
from .holder import holder_liveness

__all__ = ["AGENT", "AgentClient", "AgentError", "AgentDriftError", "AgentLockHeldError", "AgentStateError",
           "make_holder", "describe_holder", "holder_is_stale", "holder_is_ours", "holder_liveness",
           "describe_running", "not_writable_hint", "payload_tar", "untar"]

AGENT = "deploy_agent"


def _utc_now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


# --------------------------------------------------------------------------------- the lock holder

def make_holder(deployment_id: str | None) -> dict[str, Any]:
    """The lock holder this process writes on a host: user, pid, host, start time, deployment, token."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = str(os.getuid())
    return {"user": user, "pid": os.getpid(), "host": socket.gethostname(), "started": _utc_now(),
            "deployment": deployment_id, "token": uuid.uuid4().hex}


def describe_holder(h: dict[str, Any] | None) -> str:
    """One line naming a lock holder."""
    if not h:
        return "nobody"
    if h.get("unreadable"):
        return "an unreadable lock file"
    return (f"{h.get('user')}@{h.get('host')} pid {h.get('pid')} since {h.get('started')} "
            f"(deployment {h.get('deployment')})")


def holder_is_stale(h: dict[str, Any] | None) -> bool:
    """True when the holder is a process on THIS machine that no longer runs (safe to take over):
    :func:`holder_liveness` says ``gone``."""
    return holder_liveness(h)[0] == "gone"


def holder_is_ours(h: dict[str, Any] | None) -> bool:
    """True when the holder is this very process (an earlier step of ours that failed)."""
    return bool(h) and h.get("host") == socket.gethostname() and str(h.get("pid")) == str(os.getpid())


def describe_running(h: dict[str, Any], command: str | None) -> str:
    """"pid N (COMMAND) still runs on HOST": what a refusal to break a live holder's lock says."""
    return (f"its process, pid {h.get('pid')}" + (f" ({command})" if command else "")
            + f", still runs on {h.get('host')}")


# ------------------------------------------------------------------------------------ the payload

def payload_tar(contents: dict[str, bytes]) -> bytes:
    """A tar (uncompressed, members = site-packages-relative paths) of ``contents``."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for path in sorted(contents):
            data = contents[path]
            ti = tarfile.TarInfo(path)
            ti.size = len(data)
            ti.mode = 0o644
            ti.mtime = int(time.time())
            tf.addfile(ti, io.BytesIO(data))
    return buf.getvalue()


def untar(data: bytes) -> dict[str, bytes]:
    """Inverse of :func:`payload_tar` (regular files only)."""
    out: dict[str, bytes] = {}
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tf:
        for m in tf:
            if m.isfile():
                f = tf.extractfile(m)
                assert f is not None
                out[m.name] = f.read()
    return out


# ------------------------------------------------------------------------------------- the errors

class _AgentFailure:
    """Mixin: an expected failure reported by the host agent, with its ``kind`` and ``details``."""

    def __init__(self, message: str, *, kind: str, details: dict[str, Any], hint: str | None = None):
        super().__init__(message, hint=hint)  # type: ignore[call-arg]
        self.kind = kind
        self.details = details


class AgentError(_AgentFailure, DeployError):
    """The agent refused or failed (disk, permission, push); exit code of DeployError."""


class AgentDriftError(_AgentFailure, DriftError):
    """The agent found live hashes outside the allowed set."""


class AgentLockHeldError(_AgentFailure, LockHeldError):
    """Another deployment holds the host's lock."""


class AgentStateError(_AgentFailure, StateError):
    """The host's deployment records or journal do not allow the operation."""


_HINTS = {
    "lock_held": "wait for that deployment to end; if its process is gone, rerun with --break-lock (it breaks "
                 "only a lock whose holder no longer runs)",
    "journal_pending": "run `sglpatch apply` again (it resumes or rolls back) or `sglpatch rollback`",
    "changed": "another apply or rollback changed the host after this one looked at it; run the command "
               "again: it plans against the host as it is now (a clean no-op when it already carries the revision)",
    "drift": "someone changed these files on the host; inspect them, or rerun with --force to overwrite",
    "no_space": "free disk space on the host and rerun",
    "not_writable": "set `sudo: true` for this host in the inventory file, or fix the permissions",
    "not_regular": "replace the link with a regular file by hand, then rerun",
    "not_resumable": "roll the interrupted deployment back: `sglpatch rollback --host HOST`",
    "not_latest": "roll back the later deployments first (or pass the earliest id to --to)",
    "rollback_failed": "the journal left in the host's state dir lets a rerun finish it: rerun `sglpatch rollback` "
                       "(or `apply`, which rolls the interrupted deployment back first) once the cause is fixed; "
                       "inspect the journal and backups there if it fails again",
    "backup_missing": "put the named backups back on the host (a local copy may be under $SGLPATCH_HOME/backups/), "
                      "then rerun the rollback; nothing was restored",
    "push_failed": "rerun the apply; nothing was left half-written",
}


def not_writable_hint(kinds: Any, user: str | None = None) -> str:
    """What to do about files this user cannot replace, by the kinds of problem found (the agent's
    ``preflight``: immutable, append_only, read_only, permission, owner, state_dir)."""
    kinds = set(kinds or ())
    who = user or "the login user"
    said = []
    if kinds & {"immutable", "append_only"}:
        said.append("as root on the host, clear the flag of each file or directory named (`chattr -i PATH`, "
                    "`chattr -a PATH` for append-only; `lsattr PATH` shows it), then rerun")
    if kinds & {"permission", "owner"} or not kinds:
        said.append(f"set `sudo: true` for this host in the inventory file (the install is another user's), or "
                     f"give {who} write permission on the directories named")
    if "read_only" in kinds:
        said.append("remount that filesystem read-write, or deploy to an install on a writable one")
    if "state_dir" in kinds:
        said.append(f"make the state dir writable by {who}, or set `state_dir:` for this host to a directory "
                    "it can write")
    return "; ".join(said)


# ------------------------------------------------------------------------------------- the client

class AgentClient:
    """Calls :mod:`sglang_patcher.remote.deploy_agent` operations on one host (one round trip each).

    ``site_packages`` is the host's absolute site-packages path; ``state_dir`` overrides
    ``<site-packages>/.sglpatch``. Expected failures become :class:`AgentError` (a DeployError),
    :class:`AgentDriftError` (drift), :class:`AgentLockHeldError` (lock_held) or
    :class:`AgentStateError` (not_found, rollback_failed); each carries ``kind`` and ``details``.
    """

    def __init__(self, transport: Transport, interpreter: str, site_packages: str, *,
                 state_dir: str | None = None, sudo: bool = False, timeout: float = 600.0):
        self.transport = transport
        self.interpreter = interpreter
        self.site_packages = site_packages
        self.state_dir = state_dir
        self.sudo = sudo
        self.timeout = timeout

    @property
    def host(self) -> str:
        return self.transport.name

    def _args(self, extra: dict[str, Any]) -> dict[str, Any]:
        args = {"site_packages": self.site_packages, **extra}
        if self.state_dir:
            args["state_dir"] = self.state_dir
        return args

    def call(self, op: str, args: dict[str, Any] | None = None, *, stdin: bytes | None = None) -> dict[str, Any]:
        """Run one agent op; return its JSON object or raise the mapped error."""
        out = launcher.call_json(self.transport, self.interpreter, AGENT, op, self._args(args or {}),
                                 stdin=stdin, sudo=self.sudo, timeout=self.timeout)
        if out.get("ok"):
            return out
        kind = str(out.get("kind", "unknown"))
        msg = f"{self.host}: {op}: {out.get('error', 'failed')}"
        details = {k: v for k, v in out.items() if k not in ("ok", "kind", "error")}
        hint = _HINTS.get(kind)
        if kind == "not_writable" and "kinds" in out:
            hint = not_writable_hint(out["kinds"], out.get("user"))
        elif kind in ("rollback_failed", "push_failed") and out.get("kinds"):   # the OS refused a path mid-way
            hint = f"{not_writable_hint(out['kinds'], out.get('user'))}; {hint}"
        if kind == "lock_held":
            if out.get("running"):
                hint = ("wait for it to finish, or stop that process on its host (`kill PID`) if it hangs, then "
                        "rerun; --break-lock breaks only a lock whose holder no longer runs")
            raise AgentLockHeldError(msg, kind=kind, details=details, hint=hint)
        if kind == "drift":
            raise AgentDriftError(msg, kind=kind, details=details, hint=hint)
        if kind in ("not_found", "rollback_failed", "backup_missing"):
            raise AgentStateError(msg, kind=kind, details=details, hint=hint)
        raise AgentError(msg, kind=kind, details=details, hint=hint)

    # -- the ops
    def inspect(self, paths: list[str], *, backups: bool = False) -> dict[str, Any]:
        """Live hashes of ``paths``, lock, journal, records, free space; with ``backups`` also
        ``bad_backups``: {deployment id: {path: backup path}} for each active deployment whose
        rollback would miss a backup (absent or not its recorded sha256)."""
        return self.call("inspect", {"paths": sorted(paths), "backups": backups})

    def history(self) -> dict[str, Any]:
        return self.call("history")

    def push(self, deployment: dict[str, Any], files: dict[str, dict[str, Any]], contents: dict[str, bytes],
             holder: dict[str, Any], *, force: bool = False, break_lock: bool = False,
             reserve_bytes: int = 16 << 20) -> dict[str, Any]:
        stdin = payload_tar(contents) if contents else b""
        return self.call("push", {"deployment": deployment, "files": files, "holder": holder, "force": force,
                                  "break_lock": break_lock, "reserve_bytes": reserve_bytes}, stdin=stdin)

    def resume(self, deployment_id: str, holder: dict[str, Any], *, break_lock: bool = False) -> dict[str, Any]:
        return self.call("resume", {"deployment_id": deployment_id, "holder": holder, "break_lock": break_lock})

    def finish(self, deployment_id: str, holder: dict[str, Any], checks: dict[str, Any] | None = None, *,
               break_lock: bool = False) -> dict[str, Any]:
        return self.call("finish", {"deployment_id": deployment_id, "holder": holder, "checks": checks,
                                    "break_lock": break_lock})

    def rollback(self, deployment_id: str, holder: dict[str, Any], *, break_lock: bool = False,
                 force: bool = False) -> dict[str, Any]:
        """Restore ``deployment_id``'s originals. Files edited on the host since the deployment are
        drift: refused (:class:`DriftError`) unless ``force``, which keeps the edited bytes under
        ``backups/<id>.drifted/`` on the host before restoring."""
        return self.call("rollback", {"deployment_id": deployment_id, "holder": holder,
                                      "break_lock": break_lock, "force": force})

    def unlock(self, holder: dict[str, Any] | None, *, break_lock: bool = False) -> dict[str, Any]:
        return self.call("unlock", {"holder": holder, "break_lock": break_lock})

    def prune(self, keep: int, holder: dict[str, Any], *, dry_run: bool = False,
              break_lock: bool = False) -> dict[str, Any]:
        """Delete the backups of rolled-back deployments but the ``keep`` newest (see the agent)."""
        return self.call("prune", {"keep": keep, "holder": holder, "dry_run": dry_run, "break_lock": break_lock})

    def compile(self, paths: list[str]) -> dict[str, Any]:
        return self.call("compile", {"paths": list(paths)})

    def put_backups(self, deployment_id: str, contents: dict[str, bytes], holder: dict[str, Any], *,
                    break_lock: bool = False) -> dict[str, Any]:
        """Put lost backups of ``deployment_id`` back on the host: ``contents`` {path: the original's
        bytes}, each checked by the agent against the record's ``before`` sha256 (see the agent)."""
        files = {p: sha256_bytes(b) for p, b in contents.items()}
        return self.call("put_backups", {"deployment_id": deployment_id, "files": files, "holder": holder,
                                         "break_lock": break_lock}, stdin=payload_tar(contents))

    def backup_tar(self, deployment_id: str) -> dict[str, bytes]:
        """The host's backups of one deployment as ``{path: bytes}``."""
        res = launcher.run_script(self.transport, self.interpreter, AGENT, "backup_tar",
                                  self._args({"deployment_id": deployment_id}), sudo=self.sudo,
                                  timeout=self.timeout)
        if res.exit_code != 0:
            raise StateError(f"{self.host}: cannot fetch the backups of deployment {deployment_id}: "
                             f"{res.stdout.decode('utf-8', 'replace').strip()[-500:]}")
        return untar(res.stdout)
