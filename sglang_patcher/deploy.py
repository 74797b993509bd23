"""The deploy transaction, status and rollback (client side of :mod:`sglang_patcher.remote.deploy_agent`).

PLACEHOLDER: the transaction is being written; the agent client below is complete.
"""

from __future__ import annotations

import getpass
import io
import os
import socket
import tarfile
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from .errors import (DeployError, DriftError, LockHeldError, SglpatchError, StateError)
from .remote import launcher
from .transport.base import Transport

AGENT = "deploy_agent"


def _utc_now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def new_deployment_id(patchset: str, revision: int | str) -> str:
    """A unique, time-sortable deployment id: ``<UTC time>-<patchset>-r<revision>-<6 hex>``."""
    return f"{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{patchset}-r{revision}-{uuid.uuid4().hex[:6]}"


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
    """True when the holder is a process on THIS machine that no longer runs (safe to take over)."""
    if not h or h.get("unreadable") or h.get("host") != socket.gethostname():
        return False
    try:
        pid = int(h.get("pid"))
    except (TypeError, ValueError):
        return False
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


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


class AgentError(DeployError):
    """An expected failure reported by the host agent; ``kind`` and ``details`` as the agent sent them."""

    def __init__(self, message: str, *, kind: str, details: dict[str, Any], hint: str | None = None):
        super().__init__(message, hint=hint)
        self.kind = kind
        self.details = details


class AgentDriftError(DriftError):
    def __init__(self, message: str, *, kind: str, details: dict[str, Any], hint: str | None = None):
        super().__init__(message, hint=hint)
        self.kind = kind
        self.details = details


class AgentLockHeldError(LockHeldError):
    def __init__(self, message: str, *, kind: str, details: dict[str, Any], hint: str | None = None):
        super().__init__(message, hint=hint)
        self.kind = kind
        self.details = details


class AgentStateError(StateError):
    def __init__(self, message: str, *, kind: str, details: dict[str, Any], hint: str | None = None):
        super().__init__(message, hint=hint)
        self.kind = kind
        self.details = details


_HINTS = {
    "lock_held": "wait for that deployment to end; if it is dead, rerun with --break-lock",
    "journal_pending": "run `sglpatch apply` again (it resumes or rolls back) or `sglpatch rollback`",
    "drift": "someone changed these files on the host; inspect them, or rerun with --force to overwrite",
    "no_space": "free disk space on the host and rerun",
    "not_writable": "set `sudo: true` for this host in hosts.yaml, or fix the permissions",
    "not_regular": "replace the link with a regular file by hand, then rerun",
    "not_resumable": "roll the interrupted deployment back: `sglpatch rollback --host HOST`",
    "not_latest": "roll back the later deployments first (or pass the earliest id to --to)",
    "rollback_failed": "inspect the host's .sglpatch/ journal and backups; rerun the rollback",
    "push_failed": "rerun the apply; nothing was left half-written",
}


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
        if kind == "lock_held":
            raise AgentLockHeldError(msg, kind=kind, details=details, hint=hint)
        if kind == "drift":
            raise AgentDriftError(msg, kind=kind, details=details, hint=hint)
        if kind in ("not_found", "rollback_failed"):
            raise AgentStateError(msg, kind=kind, details=details, hint=hint)
        raise AgentError(msg, kind=kind, details=details, hint=hint)

    # -- the ops
    def inspect(self, paths: list[str]) -> dict[str, Any]:
        return self.call("inspect", {"paths": sorted(paths)})

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

    def finish(self, deployment_id: str, holder: dict[str, Any], checks: Any = None, *,
               break_lock: bool = False) -> dict[str, Any]:
        return self.call("finish", {"deployment_id": deployment_id, "holder": holder, "checks": checks,
                                    "break_lock": break_lock})

    def rollback(self, deployment_id: str, holder: dict[str, Any], *, break_lock: bool = False) -> dict[str, Any]:
        return self.call("rollback", {"deployment_id": deployment_id, "holder": holder, "break_lock": break_lock})

    def unlock(self, holder: dict[str, Any] | None, *, break_lock: bool = False) -> dict[str, Any]:
        return self.call("unlock", {"holder": holder, "break_lock": break_lock})

    def compile(self, paths: list[str]) -> dict[str, Any]:
        return self.call("compile", {"paths": list(paths)})

    def backup_tar(self, deployment_id: str) -> dict[str, bytes]:
        """The host's backups of one deployment as ``{path: bytes}``."""
        res = launcher.run_script(self.transport, self.interpreter, AGENT, "backup_tar",
                                  self._args({"deployment_id": deployment_id}), sudo=self.sudo,
                                  timeout=self.timeout)
        if res.exit_code != 0:
            raise StateError(f"{self.host}: cannot fetch the backups of deployment {deployment_id}: "
                             f"{res.stdout.decode('utf-8', 'replace').strip()[-500:]}")
        return untar(res.stdout)
