"""The deploy transaction, status and rollback: the client side of the host's deploy agent.

A user's ``sglpatch apply`` is :func:`apply_to_host`; ``status`` is :func:`host_status`; ``rollback``
is :func:`rollback_host`. All three are plain library calls over a :class:`~.transport.base.Transport`
(SSH or local), an inventory ``Host`` (``name``, ``python``, ``sudo``, ``state_dir``) and the
discovery ``HostInfo`` (``interpreter``, ``sglang_version``, ``site_packages``, ``record``).

The transaction (:func:`apply_to_host`), in round trips over one transport:

1. ``inspect`` — live sha256/mode/owner of every touched file, the lock, a pending journal, history.
   A pending journal from an interrupted run is dealt with first: the same patchset+revision is
   resumed (``resume``) and verified by the smoke checks; anything else is rolled back. The result
   says which (``DeployResult.recovered``).
2. Render the patchset against PRISTINE bytes (the mirror; the PyPI wheel cache or a backup when the
   mirror holds patched files), every pristine byte checked against the patchset's pristine sha256.
   Each file's state is decided by hashes only: live == expected → patched; == pristine → pristine;
   == ``history[r]`` → patched at revision r (moved to this revision from pristine content); else
   drifted → :class:`DriftError` listing the files (unless ``force``). All patched → a clean no-op.
3. ``push`` — one tar of the new contents; the agent locks, checks disk and permission, checks
   drift again against the allowed hashes, backs up, stages+verifies+renames, purges bytecode.
4. Smoke checks (:mod:`.checks`): L0 ``py_compile`` (1 round trip), L1 the patchset script (1).
   A failed gate rolls back by itself and raises :class:`CheckFailedError` with the check output.
5. ``finish`` — record verified, release the lock. A local copy of the record and of the backups
   is kept under ``sglpatch_home()/deployments/<host>/`` and ``backups/<host>/``.

Interruptions (a killed agent, a dropped connection, Ctrl-C during the checks) leave the host's
journal and lock behind; the next apply resumes (same patchset and revision) or rolls back, and says
so. A lock whose holder is a dead process of THIS machine is taken over by itself; any other holder
needs ``break_lock`` (the CLI's ``--break-lock``).

So a first apply is 5 round trips whatever the number of files (plus 1 when the originals are at an
earlier revision and must be fetched for the local backup copy); a re-apply is 1.
"""

from __future__ import annotations

import getpass
import hashlib
import io
import json
import os
import shutil
import socket
import tarfile
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from . import checks as checks_mod
from .applier import ApplyResult
from .checks import CheckReport
from .errors import (CheckFailedError, DeployError, DriftError, LockHeldError, PatchsetError, SglpatchError,
                     StateError)
from .manifest import read_record
from .mirror import Mirror
from .remote import launcher
from .state import safe_component, sglpatch_home
from .transport.base import Transport
from .transport.local import LocalTransport

__all__ = ["apply_to_host", "plan_apply", "rollback_host", "host_status", "DeployPlan", "DeployResult",
           "FilePlan", "StatusReport", "FileStatus", "RollbackResult", "PristineSource", "AgentClient",
           "AgentError", "wheel_reader", "save_local_record", "new_deployment_id", "make_holder"]

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
    return _is_zombie(pid)  # killed, not yet reaped by its parent: it holds nothing any more


def _is_zombie(pid: int) -> bool:
    """True when ``pid`` has exited but is not reaped (state Z in /proc; False where there is none)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat_line = f.read()
    except OSError:
        return False
    return stat_line[stat_line.rfind(b")") + 2:][:1] == b"Z"


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
    "lock_held": "wait for that deployment to end; if it is dead, rerun with --break-lock",
    "journal_pending": "run `sglpatch apply` again (it resumes or rolls back) or `sglpatch rollback`",
    "drift": "someone changed these files on the host; inspect them, or rerun with --force to overwrite",
    "no_space": "free disk space on the host and rerun",
    "not_writable": "set `sudo: true` for this host in the inventory file, or fix the permissions",
    "not_regular": "replace the link with a regular file by hand, then rerun",
    "not_resumable": "roll the interrupted deployment back: `sglpatch rollback --host HOST`",
    "not_latest": "roll back the later deployments first (or pass the earliest id to --to)",
    "rollback_failed": "inspect the host's .sglpatch/ journal and backups; rerun the rollback",
    "backup_missing": "put the named backups back on the host (a local copy may be under $SGLPATCH_HOME/backups/), "
                      "then rerun the rollback; nothing was restored",
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

    def finish(self, deployment_id: str, holder: dict[str, Any], checks: Any = None, *,
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
        files = {p: _sha(b) for p, b in contents.items()}
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


# =============================================================================== the transaction

ACTIVE = ("staging", "committing", "pushed", "verified", "rolling_back")
Progress = Callable[[str, str], None]


def _sha(data: bytes | None) -> str | None:
    return None if data is None else hashlib.sha256(data).hexdigest()


def _noop(step: str, detail: str) -> None:
    pass


# ---------------------------------------------------------------------- the patchset, duck-typed

def _target_of(patchset: Any, version: str) -> Any:
    return patchset.target(version)  # raises UnsupportedVersionError listing the supported ones


def _hashes(obj: Any, name: str) -> dict[str, str | None]:
    val = obj.get(name) if isinstance(obj, dict) else getattr(obj, name, None)
    return dict(val or {})


def _history_for(patchset: Any, version: str) -> dict[int, dict[str, str | None]]:
    """``{revision: {path: sha256 | None}}`` of earlier revisions of ``patchset`` for ``version``."""
    hist = getattr(patchset, "history", None)
    if hist is None or callable(hist):
        hist = getattr(getattr(patchset, "spec", None), "history", None)
    hist = hist or {}
    out: dict[int, dict[str, str | None]] = {}
    for rev, per_version in dict(hist).items():
        try:
            r = int(rev)
        except (TypeError, ValueError):
            continue
        if isinstance(per_version, dict) and version in per_version:
            out[r] = dict(per_version[version] or {})
        elif hasattr(per_version, "get") and per_version.get(version) is not None:
            out[r] = dict(per_version.get(version))
    return out


def _patchset_view(patchset: Any, version: str, info: Any) -> tuple[set[str], dict[str, str | None],
                                                                    dict[str, str | None],
                                                                    dict[int, dict[str, str | None]]]:
    """``(paths, pristine, expected, history)`` of ``patchset`` for ``version``.

    ``paths`` = every file this revision or an earlier one touches; ``pristine[path]`` is the release's
    sha256 (None: absent in the release) — for a path only an earlier revision touched it is the
    installed distribution's RECORD hash (the trust anchor), else None (a file that revision created).
    """
    target = _target_of(patchset, version)
    pristine_h = _hashes(target, "pristine")
    expected_h = _hashes(target, "expected")
    for dst in dict(getattr(target, "new_files", None) or {}):
        pristine_h.setdefault(dst, None)
    history = {r: h for r, h in _history_for(patchset, version).items() if r != int(patchset.revision)}
    record_h = _record_hashes(info)
    paths = set(pristine_h) | set(expected_h)
    for h in history.values():
        paths |= set(h)
    for p in paths - set(pristine_h):
        pristine_h[p] = record_h.get(p)
    return paths, pristine_h, expected_h, history


def _render(patchset: Any, version: str, read: Callable[[str], bytes | None]) -> ApplyResult:
    """The patchset applied to pristine bytes: ``patchset.render(version, read)`` → ApplyResult."""
    return patchset.render(version, read)


def _patchset_root(patchset: Any) -> Path | None:
    for attr in ("root", "path", "dir"):
        v = getattr(patchset, attr, None)
        if v is not None:
            return Path(v)
    return None


# ---------------------------------------------------------------------------- pristine content

class PristineSource:
    """Pristine bytes of the touched files, each checked against the patchset's pristine sha256.

    ``hashes`` maps path → pristine sha256 (None: the file does not exist in the release).
    ``readers`` are tried in order — ``(name, read(path) -> bytes | None)`` — and the first whose
    bytes match the hash wins (``used[path]`` names it). Typical order: the host's mirror, the
    PyPI wheel cache, local backups, the host's backups. Raises :class:`StateError` naming the path,
    the wanted hash and what each reader had, when none matches.
    """

    def __init__(self, hashes: dict[str, str | None], readers: list[tuple[str, Callable[[str], bytes | None]]]):
        self.hashes = hashes
        self.readers = readers
        self.used: dict[str, str] = {}
        self._cache: dict[str, bytes | None] = {}

    def __call__(self, path: str) -> bytes | None:
        return self.read(path)

    def read(self, path: str) -> bytes | None:
        if path in self._cache:
            return self._cache[path]
        if path not in self.hashes:
            # the patchset format lets ``pristine`` omit files the patchset creates: absent in the
            # release. (Patchset.render refuses a file that exists but has no pristine hash.)
            self._cache[path] = None
            self.used[path] = "not in the release"
            return None
        want = self.hashes[path]
        if want is None:
            self._cache[path] = None
            self.used[path] = "not in the release"
            return None
        tried = []
        for name, reader in self.readers:
            try:
                data = reader(path)
            except (KeyError, OSError, ValueError, SglpatchError) as exc:
                tried.append(f"{name}: {type(exc).__name__}")
                continue
            if data is None:
                tried.append(f"{name}: missing")
                continue
            got = _sha(data)
            if got == want:
                self._cache[path] = data
                self.used[path] = name
                return data
            tried.append(f"{name}: sha256 {got[:12]}…")
        raise StateError(f"no pristine copy of {path} (sha256 {want[:12]}…): " + "; ".join(tried),
                         hint="re-snapshot the host from a pristine install, or let the wheel cache "
                              "fetch the release from PyPI")


def _reader_of(obj: Any) -> Callable[[str], bytes | None] | None:
    if obj is None:
        return None
    if hasattr(obj, "read") and callable(obj.read):
        return obj.read
    if callable(obj):
        return obj
    raise TypeError(f"not a pristine reader: {obj!r}")


def wheel_reader(version: str, home: Path | None = None) -> Callable[[str], bytes | None]:
    """``read(path)`` over the pristine PyPI wheel of sglang ``version`` (downloaded on first use)."""
    tree: list[Any] = []

    def read(path: str) -> bytes | None:
        if not tree:
            from . import wheelcache  # fetched lazily: only when the mirror holds patched files
            tree.append(wheelcache.pristine_tree(version, home=home))
        return tree[0].read(path)

    return read


_wheel_reader = wheel_reader  # the name service.py uses


def _local_backups_all(home: Path, host: str, path: str) -> list[bytes]:
    base = home / "backups" / safe_component(host)
    out = []
    if base.is_dir():
        for dep in sorted(base.iterdir()):
            f = dep.joinpath(*path.split("/"))
            if f.is_file():
                out.append(f.read_bytes())
    return out


class _MultiLocalBackups:
    """Reader over all local backups of a host that returns the copy matching the wanted hash."""

    def __init__(self, home: Path, host: str, hashes: dict[str, str | None]):
        self.home, self.host, self.hashes = home, host, hashes

    def __call__(self, path: str) -> bytes | None:
        want = self.hashes.get(path)
        for data in _local_backups_all(self.home, self.host, path):
            if _sha(data) == want:
                return data
        return None


class _HostBackups:
    """Reader over the host's backups: fetches (one round trip each) deployments whose record says
    their original of the path had the wanted hash."""

    def __init__(self, agent: "AgentClient", deployments: list[dict[str, Any]], hashes: dict[str, str | None]):
        self.agent, self.deployments, self.hashes = agent, deployments, hashes
        self._fetched: dict[str, dict[str, bytes]] = {}

    def __call__(self, path: str) -> bytes | None:
        want = self.hashes.get(path)
        for rec in self.deployments:
            f = rec.get("files", {}).get(path)
            if not f or f.get("before") != want or rec.get("backups_pruned"):
                continue
            if rec["id"] not in self._fetched:
                try:
                    self._fetched[rec["id"]] = self.agent.backup_tar(rec["id"])
                except StateError:  # gone or unreadable on the host: the next source is asked
                    self._fetched[rec["id"]] = {}
            data = self._fetched[rec["id"]].get(path)
            if data is not None:
                return data
        return None


# ------------------------------------------------------------------------------------- results

@dataclass
class FilePlan:
    """One touched file: ``state`` pristine|patched|older|drifted|absent by hashes, ``found_revision``
    (for patched/older), ``live``/``pristine``/``expected`` sha256 (None = absent), ``action``
    write|delete|none, ``mode`` to set (None keeps the host's)."""

    path: str
    state: str
    live: str | None
    pristine: str | None
    expected: str | None
    found_revision: int | None = None
    action: str = "none"
    mode: int | None = None
    live_mode: int | None = None
    owner: str | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class DeployPlan:
    """What an apply would do on one host (no lock taken, nothing written)."""

    host: str
    patchset: str
    revision: int
    sglang_version: str
    files: dict[str, FilePlan]
    contents: dict[str, bytes] = field(default_factory=dict, repr=False)
    diff: str = ""
    inspect: dict[str, Any] = field(default_factory=dict, repr=False)
    pristine_sources: dict[str, str] = field(default_factory=dict)
    pristine_bytes: dict[str, bytes | None] = field(default_factory=dict, repr=False)
    result: Any = field(default=None, repr=False)  # the applier's ApplyResult that ``diff`` shows

    @property
    def drifted(self) -> list[str]:
        return sorted(p for p, f in self.files.items() if f.state == "drifted")

    @property
    def to_push(self) -> dict[str, FilePlan]:
        return {p: f for p, f in self.files.items() if f.action != "none"}

    @property
    def kind(self) -> str:
        """noop (all patched at this revision) | apply | upgrade (some at an earlier revision) |
        complete (mixed pristine/patched) | drift."""
        states = {f.state for f in self.files.values()}
        if "drifted" in states:
            return "drift"
        if not self.to_push:
            return "noop"
        if "older" in states:
            return "upgrade"
        if "patched" in states:
            return "complete"
        return "apply"

    def to_json(self) -> dict[str, Any]:
        return {"host": self.host, "patchset": self.patchset, "revision": self.revision,
                "sglang_version": self.sglang_version, "kind": self.kind,
                "files": {p: f.to_json() for p, f in sorted(self.files.items())},
                "pristine_sources": self.pristine_sources}

    def __rich__(self):
        # lines: the patchset's diff from pristine, for the files this apply writes (a file already
        # at this revision changes nothing)
        writes = {p: n for p, n in diffstat(self.diff).items()
                  if p in self.files and self.files[p].action in ("write", "delete")}
        t = _files_table(f"{self.patchset} r{self.revision} on {self.host} "
                         f"(sglang {self.sglang_version}): {self.kind}", self.files.values(), plan=True,
                         stat=writes)
        if writes:
            added, removed = sum(a for a, _ in writes.values()), sum(r for _, r in writes.values())
            t.caption = (f"{len(writes)} file(s) written; their diff from pristine: +{added:,} −{removed:,} "
                         f"lines (`sglpatch diff {self.patchset} --host {self.host}` prints it)")
        return t


@dataclass
class DeployResult:
    """Outcome of :func:`apply_to_host`.

    ``status``: applied | already_applied | dry_run | aborted | resumed. ``recovered`` says what was
    done with an interrupted earlier run. ``round_trips`` and ``seconds`` measure this call.
    """

    host: str
    status: str
    plan: DeployPlan
    deployment_id: str | None = None
    record: dict[str, Any] | None = None
    checks: CheckReport | None = None
    recovered: list[str] = field(default_factory=list)
    round_trips: int = 0
    seconds: float = 0.0
    local_record: str | None = None

    @property
    def uncropped(self) -> bool:
        """True for a dry run: its rendering holds the whole diff, whose lines must reach the
        output whole (``AppContext.result`` prints it with soft wrap)."""
        return self.status == "dry_run"

    def to_json(self) -> dict[str, Any]:
        out = {"host": self.host, "status": self.status, "deployment_id": self.deployment_id,
               "plan": self.plan.to_json(), "checks": self.checks.to_json() if self.checks else None,
               "recovered": self.recovered, "round_trips": self.round_trips,
               "seconds": round(self.seconds, 3), "local_record": self.local_record}
        if self.status == "dry_run":
            out["diff"] = self.plan.diff
        return out

    def __rich__(self):
        from rich.console import Group
        from rich.text import Text

        parts: list[Any] = [Text(f"{self.host}: {self.status}"
                                 + (f" (deployment {self.deployment_id})" if self.deployment_id else "")
                                 + f" — {self.round_trips} round trips, {self.seconds:.2f} s",
                                 style="bold")]
        parts += [Text(f"  recovered: {r}", style="yellow") for r in self.recovered]
        parts.append(self.plan.__rich__())
        if self.status == "dry_run" and self.plan.diff:
            parts.append(diff_view(self.plan.diff))
        if self.checks is not None:
            parts.append(self.checks.__rich__())
        return Group(*parts)


@dataclass
class FileStatus:
    """One file on a host: ``state`` pristine|patched|drifted|absent, the patchset and revision that
    the live hash belongs to, and the hashes it was judged by (``record``: the RECORD sha256)."""

    path: str
    state: str
    live: str | None
    patchset: str | None = None
    revision: int | None = None
    pristine: str | None = None
    expected: str | None = None
    record: str | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


# the values of StatusReport.overall
OVERALL_STATES = ("pristine", "patched", "older", "newer", "mixed", "drifted", "pending", "damaged", "unknown")


@dataclass
class StatusReport:
    """:func:`host_status`: per-file states, the host's deployment history, pending journal, lock."""

    host: str
    sglang_version: str | None
    files: list[FileStatus]
    deployments: list[dict[str, Any]]
    journal: dict[str, Any] | None
    lock: dict[str, Any] | None
    patchset: str | None = None
    revision: int | None = None
    damaged: list[str] = field(default_factory=list)  # damaged records' paths on the host
    older_revision: int | None = None  # judged against a patchset: the earlier revision installed whole
    bad_backups: dict[str, dict[str, str]] = field(default_factory=dict)  # id → {path: backup} a rollback lacks
    local_backups: dict[str, str] = field(default_factory=dict)  # id → local copies' dir, for bad_backups
    note: str | None = None  # what the verdict rests on, where that is not obvious (no records, no files)
    unchecked: bool = False  # no file could be judged (no records, no patchset for the release): "unknown"

    @property
    def active(self) -> list[dict[str, Any]]:
        """The host's active deployments, oldest first: ``{"id", "patchset", "revision"}`` each —
        what a status without ``--patchset`` says the host carries."""
        return [{"id": d.get("id"), "patchset": d.get("patchset"), "revision": d.get("revision")}
                for d in self.deployments if d.get("phase") in ACTIVE]

    @property
    def held_paths(self) -> set[str]:
        """The paths that the host's active deployments wrote (their records' files)."""
        return {p for d in self.deployments if d.get("phase") in ACTIVE for p in d.get("files", {})}

    @property
    def overall(self) -> str:
        """pristine | patched | mixed | drifted | pending (an interrupted deployment) | unknown,
        older (judged against a patchset: one earlier revision of it, whole), newer (judged against
        a patchset: its files at later revisions, by the host's records), or damaged (a
        journal or deployment record on the host cannot be read: apply and rollback refuse until
        it is restored or moved aside)."""
        if self.damaged:
            return "damaged"
        if self.journal:
            return "pending"
        if self.unchecked:
            return "unknown"
        if not self.files:
            return "pristine" if not any(d.get("phase") in ACTIVE for d in self.deployments) else "unknown"
        # Files no active deployment holds (e.g. a module a rolled-back revision created) must be
        # at rest (pristine, or absent as in the release); the held ones decide patched or not.
        active = self.held_paths
        held = [f for f in self.files if f.path in active]
        rest_ok = all(f.state in ("pristine", "absent") for f in self.files if f.path not in active)
        if any(f.state == "drifted" for f in self.files):
            return "drifted"
        if all(f.state in ("pristine", "absent") for f in self.files):
            return "pristine"
        if self.patchset is not None:   # judged against one patchset: every file at its revision
            if all(f.state == "patched" and f.revision in (None, self.revision) for f in self.files):
                return "patched"
            if self.older_revision is not None:
                return "older"
            revs = {f.revision for f in self.files if f.state == "patched"}  # later revisions, by the
            if (revs and None not in revs and all(f.state in ("patched", "absent") for f in self.files)
                    and all(int(r) >= int(self.revision or 0) for r in revs)                      # host's
                    and max(int(r) for r in revs) > int(self.revision or 0)):                     # records
                return "newer"
            return "mixed"
        if held and rest_ok and all(f.state == "patched" for f in held):
            return "patched"
        return "mixed"

    def to_json(self) -> dict[str, Any]:
        return {"host": self.host, "sglang_version": self.sglang_version, "overall": self.overall,
                "patchset": self.patchset, "revision": self.revision, "active": self.active,
                "files": [f.to_json() for f in self.files],
                "deployments": [_record_summary(d) for d in self.deployments],
                "journal": _record_summary(self.journal) if self.journal else None, "lock": self.lock,
                "lock_stale": holder_is_stale(self.lock),
                "damaged": list(self.damaged), "older_revision": self.older_revision,
                "bad_backups": dict(self.bad_backups), "local_backups": dict(self.local_backups),
                "note": self.note}

    def __rich__(self):
        from rich.console import Group
        from rich.table import Table
        from rich.text import Text

        overall = self.overall + (f" (r{self.older_revision} of {self.patchset}; r{self.revision} is the newest: "
                                  f"`sglpatch apply {self.patchset}` upgrades)" if self.overall == "older" else "")
        if self.overall == "newer":
            later = sorted({int(f.revision) for f in self.files if f.state == "patched"} - {int(self.revision or 0)})
            overall += (f" (r{'/r'.join(map(str, later))} of {self.patchset} is installed, later than the "
                        f"r{self.revision} asked about; a rollback goes back)")
        elif self.patchset is None and self.overall == "patched" and self.active:
            overall += " (" + ", ".join(f"{a['patchset']} r{a['revision']}" for a in self.active) + ")"
        parts: list[Any] = [Text(f"{self.host} (sglang {self.sglang_version}): {overall}", style="bold")]
        if self.note:
            parts.append(Text(f"  {self.note}", style="yellow"))
        if self.damaged:
            parts.append(Text(f"  damaged deployment record(s): {', '.join(self.damaged)} — apply and rollback "
                              f"refuse until they are fixed; {_damaged_hint(self.host)}", style="bold red"))
        held = self.held_paths
        orphans = [f.path for f in self.files if f.state == "patched" and f.path not in held]
        if orphans and not self.journal:
            parts.append(Text(f"  {len(orphans)} file(s) carry a patchset's bytes, but no active deployment record "
                              f"on the host names them (lost or moved?): {', '.join(orphans[:3])}"
                              f"{' …' if len(orphans) > 3 else ''} — `sglpatch rollback --host {self.host}` says "
                              f"where local copies of the records are", style="bold red"))
        for d in self.deployments:
            if (d.get("phase") in ACTIVE and d.get("sglang_version") and self.sglang_version
                    and str(d["sglang_version"]) != str(self.sglang_version)):
                parts.append(Text(f"  deployment {d.get('id')} was made on sglang {d['sglang_version']}; the host "
                                  f"now has {self.sglang_version} (reinstalled under it): rollback refuses and says "
                                  f"what to do", style="bold red"))
        for did, bad in sorted(self.bad_backups.items()):
            parts.append(Text(f"  deployment {did}: {len(bad)} backup(s) missing or damaged on the host "
                              f"({', '.join(sorted(bad.values()))}) — `sglpatch rollback` puts them back first "
                              f"from whatever copy has the recorded sha256 (" +
                              (f"local copies: {self.local_backups[did]}/; " if did in self.local_backups
                               else "no local copy; ") + "else the host's mirror or the release wheel) and "
                              "refuses, restoring nothing, when one is found nowhere", style="bold red"))
        if self.journal:
            parts.append(Text(f"  pending: deployment {self.journal.get('id')} interrupted in phase "
                              f"{self.journal.get('phase')} — run apply again or rollback", style="yellow"))
        if self.lock:
            parts.append(Text(f"  locked by {describe_holder(self.lock)} — " + (
                "that process no longer runs on this machine: the next apply or rollback takes the lock over"
                if holder_is_stale(self.lock) else
                "if no deployment is running (a crash elsewhere), apply or rollback with --break-lock"),
                style="yellow"))
        t = Table(title="files")
        for col in ("file", "state", "patchset", "rev", "live sha256", "RECORD"):
            t.add_column(col, overflow="fold")
        styles = {"pristine": "green", "patched": "cyan", "drifted": "bold red", "absent": "dim"}
        for f in self.files:
            rec = "-" if f.record is None else ("= live" if f.live == f.record else "≠ live")
            t.add_row(f.path, f"[{styles.get(f.state, '')}]{f.state}[/]", f.patchset or "",
                      "" if f.revision is None else str(f.revision), (f.live or "-")[:16], rec)
        parts.append(t)
        h = Table(title="deployments")
        for col in ("id", "patchset", "rev", "phase", "started", "files"):
            h.add_column(col)
        for d in self.deployments:
            h.add_row(str(d.get("id")), str(d.get("patchset")), str(d.get("revision")), str(d.get("phase")),
                      str(d.get("times", {}).get("started", "")), str(len(d.get("files", {}))))
        parts.append(h)
        return Group(*parts)


@dataclass
class RollbackResult:
    """:func:`rollback_host`: the deployments rolled back (newest first) and every file's final hash."""

    host: str
    rolled_back: list[str]
    files: dict[str, str | None]
    already: list[str] = field(default_factory=list)
    round_trips: int = 0
    seconds: float = 0.0
    backups_put_back: dict[str, dict[str, str]] = field(default_factory=dict)  # id → {path: source}
    drift_kept: dict[str, str] = field(default_factory=dict)  # path → where --force kept its edited bytes

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def __rich__(self):
        from rich.table import Table

        if not self.rolled_back and not self.files:
            from rich.text import Text
            return Text(f"{self.host}: nothing to roll back — no sglpatch deployment is active there"
                        + (f" (deployment {self.already[-1]} was rolled back already)" if self.already else
                           " (none was ever recorded)") + f"; `sglpatch status --host {self.host}` checks the files")
        t = Table(title=f"{self.host}: rolled back {', '.join(self.rolled_back) or 'nothing'}"
                        f" ({self.round_trips} round trips, {self.seconds:.2f} s)")
        t.add_column("file")
        t.add_column("restored sha256")
        for p, h in sorted(self.files.items()):
            t.add_row(p, h or "(removed)")
        notes = [f"{p}: its edited bytes were kept at {k} (host)" for p, k in sorted(self.drift_kept.items())]
        if self.backups_put_back:
            notes.append("; ".join(
                f"{did}: {len(got)} lost backup(s) put back on the host first, verified by sha256, from "
                + ", ".join(sorted(set(got.values()))) for did, got in sorted(self.backups_put_back.items())))
        if notes:
            t.caption = "\n".join(notes)
        return t


@dataclass
class PruneResult:
    """:func:`prune_host`: the rolled-back deployments whose backups went (``pruned``: id, bytes,
    dirs), those whose backups were kept, and whether it was a dry run (nothing deleted)."""

    host: str
    pruned: list[dict[str, Any]]
    kept: list[str]
    dry_run: bool = False

    @property
    def freed_bytes(self) -> int:
        return sum(int(p.get("bytes", 0)) for p in self.pruned)

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "freed_bytes": self.freed_bytes}

    def __rich__(self):
        from rich.text import Text

        verb = "would free" if self.dry_run else "freed"
        head = (f"{self.host}: {verb} {self.freed_bytes / 1e6:.1f} MB — the backups of {len(self.pruned)} "
                f"rolled-back deployment(s)" if self.pruned else f"{self.host}: no backups to prune")
        lines = [head] + [f"  {p['id']}: {int(p['bytes']) / 1e6:.2f} MB" for p in self.pruned]
        if self.kept:
            lines.append(f"  kept: the backups of {', '.join(self.kept)} (--keep); active deployments' are never pruned")
        return Text("\n".join(lines))


def prune_host(transport: Transport, host: Any, info: Any, *, keep: int = 3, dry_run: bool = False,
               break_lock: bool = False, home: Path | None = None) -> PruneResult:
    """Delete, on the host, the backups of its rolled-back deployments but the ``keep`` newest,
    and the local copies of those backups (``home``/backups/<host>/<id>).

    A rolled-back deployment's backups are never read again by a rollback; its record stays (the
    host's history), marked ``backups_pruned``. Active deployments are never touched. Takes the
    host's lock (not for a dry run). Raises ValueError for keep < 0, StateError for damaged
    records, DeployError (a pending journal), LockHeldError.
    """
    if int(keep) < 0:
        raise ValueError(f"keep must be >= 0, got {keep}")
    name = _host_name(host, transport)
    agent = _agent_for(transport, host, info)
    hist = agent.history()
    check_host_records(name, hist)
    takeover = False if dry_run else _lock_takeover(name, hist.get("lock"), break_lock, "cannot prune")
    out = agent.prune(int(keep), make_holder(None), dry_run=dry_run, break_lock=takeover)
    for p in out.get("pruned", []):  # the local copies of the same originals
        local = _local_paths(home or sglpatch_home(), name, str(p["id"]))[1]
        if local.is_dir():
            p["local"] = str(local)
            if not dry_run:
                shutil.rmtree(local)
    return PruneResult(host=name, pruned=out.get("pruned", []), kept=out.get("kept", []),
                       dry_run=bool(out.get("dry_run")))


def _record_summary(d: dict[str, Any] | None) -> dict[str, Any] | None:
    if d is None:
        return None
    return {k: d.get(k) for k in ("id", "patchset", "revision", "sglang_version", "phase", "times",
                                  "forced", "checks")} | {"files": sorted(d.get("files", {}))}


def diff_view(text: str):
    """A unified diff as rich renders it for people (``diff`` and ``apply --dry-run``): every
    line whole, coloured as a diff; print it with soft wrap so no line is cropped."""
    from rich.syntax import Syntax

    return Syntax(text, "diff", theme="ansi_dark", word_wrap=False)


def diffstat(diff: str) -> dict[str, tuple[int, int]]:
    """{path: (lines added, lines removed)} of unified diff text (parsed by unidiff); {} for an
    empty diff or one that does not parse."""
    from unidiff import PatchSet
    from unidiff.errors import UnidiffParseError

    if not diff:
        return {}
    try:
        return {f.path: (f.added, f.removed) for f in PatchSet(diff)}
    except UnidiffParseError:
        return {}


def _files_table(title: str, files: Any, plan: bool = False, stat: dict[str, tuple[int, int]] | None = None):
    from rich.table import Table

    t = Table(title=title)
    for col in ("file", "state", "live", "action") + (("lines",) if stat else ()):
        t.add_column(col, overflow="fold", justify="right" if col == "lines" else "left")
    styles = {"pristine": "green", "patched": "cyan", "older": "magenta", "drifted": "bold red"}
    for f in sorted(files, key=lambda f: f.path):
        st = f.state + (f" r{f.found_revision}" if f.found_revision is not None else "")
        row = [f.path, f"[{styles.get(f.state, '')}]{st}[/]", (f.live or "absent")[:12], f.action]
        if stat:
            row.append("+{} −{}".format(*stat[f.path]) if f.path in stat else "")
        t.add_row(*row)
    return t


# ------------------------------------------------------------------------------- local records

def _local_paths(home: Path, host: str, deployment_id: str) -> tuple[Path, Path]:
    h = safe_component(host)
    return (home / "deployments" / h / f"{deployment_id}.json", home / "backups" / h / deployment_id)


def _local_only_active(home: Path, host: str, on_host: set[str]) -> list[Path]:
    """Local copies of ``host``'s deployment records that are active (by their phase) but that the
    host's records do not name: their host record was lost or moved."""
    out = []
    for p in sorted((home / "deployments" / safe_component(host)).glob("*.json")):
        try:
            rec = json.loads(p.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(rec, dict) and rec.get("phase") in ACTIVE and rec.get("id") not in on_host:
            out.append(p)
    return out


def save_local_record(home: Path, host: str, record: dict[str, Any],
                      backups: dict[str, bytes] | None = None) -> Path:
    """Write the local copy of a host's deployment record (and its backups); returns the record path."""
    rec_path, bdir = _local_paths(home, host, record["id"])
    record = dict(record, host=host)
    rec_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = rec_path.with_name(rec_path.name + ".tmp")
    tmp.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    tmp.replace(rec_path)
    for path, data in (backups or {}).items():
        f = bdir.joinpath(*path.split("/"))
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_bytes(data)
    return rec_path


def sync_local_records(home: Path, host: str, host_records: list[dict[str, Any]]) -> list[str]:
    """Bring the local copies of ``host``'s records up to the host's (the host's records are the
    truth): a local copy whose phase differs — a run interrupted after the host changed and
    before the copy was written — is rewritten. Returns the ids rewritten; never raises for a
    local copy it cannot read or write (they are copies)."""
    done = []
    for rec in host_records:
        if not isinstance(rec, dict) or _is_damaged(rec) or not rec.get("id"):
            continue
        path = _local_paths(home, host, str(rec["id"]))[0]
        try:
            local = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(local, dict) and local.get("phase") != rec.get("phase"):
            try:
                save_local_record(home, host, rec)
            except OSError:
                continue
            done.append(str(rec["id"]))
    return done


def check_local_writable(home: Path, host: str) -> None:
    """Before a host is changed: the local copies of its records and backups can be written
    ($SGLPATCH_HOME/deployments/HOST and backups/HOST, created if missing; a probe file is written
    and removed). Raises DeployError (exit 8) naming the directory, so nothing is pushed that
    could not be recorded here."""
    rec_dir, bdir = (p.parent for p in _local_paths(home, host, "probe"))
    for d in (rec_dir, bdir):
        probe = d / f".sglpatch-probe-{os.getpid()}"
        try:
            d.mkdir(parents=True, exist_ok=True)
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as exc:
            raise DeployError(f"{host}: cannot write the local deployment records in {d} ({exc.strerror or exc}); "
                              "nothing was changed on the host",
                              hint="make it a writable directory (it may be a file, or lack permissions), or point "
                                   "SGLPATCH_HOME at a writable absolute path, then rerun") from exc


# -------------------------------------------------------------------------------------- pieces

def _agent_for(transport: Transport, host: Any, info: Any) -> AgentClient:
    interpreter = getattr(info, "interpreter", None) or host.python
    return AgentClient(transport, str(interpreter), str(info.site_packages),
                       state_dir=getattr(host, "state_dir", None), sudo=bool(getattr(host, "sudo", False)))


def _host_name(host: Any, transport: Transport) -> str:
    return str(getattr(host, "name", None) or transport.name)


def _lock_takeover(host: str, lock: dict[str, Any] | None, break_lock: bool, what: str) -> bool:
    """Whether we may take over ``lock``; raises LockHeldError naming the holder when not."""
    if lock is None:
        return False
    if break_lock or holder_is_stale(lock):
        return True
    raise LockHeldError(f"{host}: {what}: the host is locked by {describe_holder(lock)}",
                        hint="wait for it to finish; if that process is gone, rerun with --break-lock")


def plan_apply(transport: Transport, host: Any, info: Any, patchset: Any, *, pristine: Any = None,
               agent: AgentClient | None = None, inspect: dict[str, Any] | None = None,
               home: Path | None = None) -> DeployPlan:
    """Decide, by hashes, what applying ``patchset`` to ``host`` would do. Writes nothing.

    ``pristine``: a reader of pristine bytes (a Mirror, or ``read(path) -> bytes | None``); the
    wheel cache, local backups and the host's backups are the fallbacks. ``inspect``: a fresh
    agent ``inspect`` answer to reuse (else one round trip). Raises UnsupportedVersionError,
    DeployError (the host carries a newer revision: a downgrade is a rollback), StateError (no
    pristine copy), ApplyError/PatchsetError (the series does not apply), PatchsetError (the rendered bytes do not match the patchset's expected sha256).
    """
    home = home or sglpatch_home()
    name = _host_name(host, transport)
    version = str(info.sglang_version)
    paths, pristine_h, expected_h, history = _patchset_view(patchset, version, info)
    agent = agent or _agent_for(transport, host, info)
    if inspect is None:
        inspect = agent.inspect(sorted(paths))
    _refuse_downgrade(name, inspect, patchset)  # a newer revision there is no drift (diff says so too)
    readers: list[tuple[str, Callable[[str], bytes | None]]] = []
    r = _reader_of(pristine)
    if r is not None:
        readers.append(("mirror", r))
    readers.append(("local backups", _MultiLocalBackups(home, name, pristine_h)))
    readers.append(("host backups", _HostBackups(agent, list(reversed(inspect.get("deployments", []))),
                                                 pristine_h)))
    readers.append((f"wheel sglang=={version}", wheel_reader(version, home)))
    # paths only an earlier revision touched go back to pristine; None = absent in the release
    src = PristineSource({p: pristine_h.get(p) for p in paths}, readers)
    result = _render(patchset, version, src.read)
    desired: dict[str, tuple[bytes | None, int | None]] = {}
    for p in paths:
        if p in result.files:
            ch = result.files[p]
            desired[p] = (ch.new, ch.new_mode)
        else:
            desired[p] = (src.read(p), None)  # back to pristine (an earlier revision touched it)
    for p, ch in result.files.items():
        if p not in desired:
            raise PatchsetError(f"the series touches {p}, which patchset.yaml does not list",
                                hint="add its pristine and expected sha256 to patchset.yaml")
    stale = {p: (_sha(desired[p][0]), expected_h[p]) for p in expected_h if _sha(desired[p][0]) != expected_h[p]}
    if stale:
        raise PatchsetError(
            f"patchset {patchset.name} r{patchset.revision}: the rendered result does not match the expected "
            f"sha256 in patchset.yaml for " + ", ".join(f"{p} (rendered {a and a[:12]}, listed {b and b[:12]})"
                                                       for p, (a, b) in sorted(stale.items())),
            hint="regenerate the expected hashes of the patchset")
    files: dict[str, FilePlan] = {}
    contents: dict[str, bytes] = {}
    live_files = inspect.get("files", {})
    for p in sorted(paths):
        li = live_files.get(p, {"sha256": None})
        live = li.get("sha256") if li.get("exists", li.get("sha256") is not None) else None
        want, mode = desired[p]
        exp = _sha(want)
        fp = FilePlan(path=p, state="drifted", live=live, pristine=pristine_h.get(p), expected=exp,
                      live_mode=li.get("mode"), owner=None if li.get("uid") is None else f"{li.get('uid')}:{li.get('gid')}")
        if live == exp and (mode is None or li.get("mode") == mode):
            fp.state, fp.found_revision = "patched", int(patchset.revision)
        elif live == exp:
            fp.state, fp.found_revision = "patched", int(patchset.revision)  # mode differs: rewrite it
            fp.action, fp.mode = "write", mode
        elif live == pristine_h.get(p):
            fp.state = "pristine"
        else:
            for rev in sorted(history, reverse=True):
                if p in history[rev] and history[rev][p] == live:
                    fp.state, fp.found_revision = "older", rev
                    break
        if fp.state in ("pristine", "older", "drifted"):
            fp.action = "write" if want is not None else "delete"
            fp.mode = mode
        if fp.action == "write":
            contents[p] = want  # type: ignore[assignment]
        files[p] = fp
    return DeployPlan(host=name, patchset=str(patchset.name), revision=int(patchset.revision),
                      sglang_version=version, files=files, contents=contents, diff=result.diff_text(),
                      inspect=inspect, pristine_sources=dict(src.used),
                      pristine_bytes=dict(src._cache), result=result)


def _allowed(fp: FilePlan, history: dict[int, dict[str, str | None]]) -> list[str | None]:
    """Live hashes the agent accepts for ``fp`` (None = absent): pristine, this revision's, earlier ones'."""
    allowed = {fp.pristine, fp.expected}
    for h in history.values():
        if fp.path in h:
            allowed.add(h[fp.path])
    return sorted(allowed, key=lambda x: "" if x is None else x)


def _backups_for_local(agent: AgentClient, plan: DeployPlan, record: dict[str, Any]) -> dict[str, bytes]:
    """Originals of a pushed deployment, from bytes we hold when the hash matches, else the host."""
    out: dict[str, bytes] = {}
    need_host = False
    for p, f in record.get("files", {}).items():
        before = f.get("before")
        if before is None:
            continue
        data = None
        for cand in (plan.contents.get(p), plan.pristine_bytes.get(p)):
            if cand is not None and _sha(cand) == before:
                data = cand
                break
        if data is None:
            need_host = True
        else:
            out[p] = data
    if need_host:
        out.update(agent.backup_tar(record["id"]))
    return out


def _verify_and_finish(agent: AgentClient, transport: Transport, host: Any, info: Any, patchset: Any,
                       record: dict[str, Any], holder: dict[str, Any], home: Path, name: str,
                       progress: Progress) -> CheckReport:
    """Run the smoke checks on a pushed deployment; finish it, or roll it back and raise."""
    files = sorted(p for p, f in record["files"].items() if f.get("after") is not None)
    progress("checks", f"L0 py_compile of {sum(p.endswith('.py') for p in files)} file(s), then L1")
    report = checks_mod.run_checks(transport, host, info, files, patchset)
    if not report.gate_passed:
        progress("rollback", f"smoke checks failed; rolling back {record['id']}")
        rb = agent.rollback(record["id"], holder)
        rec = dict(rb["deployment"], checks=report.summary())
        save_local_record(home, name, rec)
        raise CheckFailedError(
            f"{name}: smoke checks failed after pushing {record.get('patchset')} r{record.get('revision')}; "
            f"deployment {record['id']} was rolled back (every file verified against its pre-deploy "
            f"sha256)\n{report.text()}",
            hint="fix the patchset (see the failed checks above) and apply again")
    fin = agent.finish(record["id"], holder, checks=report.summary())
    save_local_record(home, name, fin["deployment"])
    return report


def apply_to_host(transport: Transport, host: Any, info: Any, patchset: Any, *, pristine: Any = None,
                  dry_run: bool = False, force: bool = False, break_lock: bool = False,
                  confirm: Callable[[DeployPlan], bool] | None = None, progress: Progress | None = None,
                  home: Path | None = None, reserve_bytes: int = 16 << 20) -> DeployResult:
    """Apply ``patchset`` to ``host`` as one transaction (see the module docstring); return what happened.

    ``info`` is the discovery HostInfo of the host. ``confirm(plan)`` is asked before the push
    (False → status ``aborted``, nothing written). ``progress(step, detail)`` is told each step.
    Raises UnsupportedVersionError (the host's SGLang version is not a target), DriftError (files
    changed on the host; lists them; ``force`` overrides), LockHeldError (names the holder;
    ``break_lock`` overrides), DeployError (disk, permission, push failure — nothing half-written),
    CheckFailedError (a smoke check failed; already rolled back), TransportError.
    """
    t0 = time.monotonic()
    rt0 = transport.round_trips
    home = home or sglpatch_home()
    progress = progress or _noop
    name = _host_name(host, transport)
    agent = _agent_for(transport, host, info)
    version = str(info.sglang_version)
    paths, _pristine_h, _expected_h, history = _patchset_view(patchset, version, info)
    progress("inspect", f"hashing {len(paths)} file(s) on {name}")
    ins = agent.inspect(sorted(paths))
    check_host_records(name, ins)
    sync_local_records(home, name, ins.get("deployments", []))
    _refuse_downgrade(name, ins, patchset)
    recovered: list[str] = []

    def done(status: str, plan: DeployPlan, **kw: Any) -> DeployResult:
        return DeployResult(host=name, status=status, plan=plan, recovered=recovered,
                            round_trips=transport.round_trips - rt0, seconds=time.monotonic() - t0, **kw)

    j = ins.get("journal")
    if not dry_run:  # every path below may change the host: its local records must be writable
        check_local_writable(home, name)
    if j is not None and dry_run:
        recovered.append(f"deployment {j.get('id')} ({j.get('patchset')} r{j.get('revision')}) was interrupted "
                         f"in phase {j.get('phase')}; a real run resumes it (same patchset and revision) or "
                         f"rolls it back first")
    if j is not None and not dry_run:
        takeover = _lock_takeover(name, ins.get("lock"), break_lock, f"deployment {j.get('id')} is pending")
        holder = make_holder(j.get("id"))
        same = j.get("patchset") == patchset.name and str(j.get("revision")) == str(patchset.revision)
        resumed = None
        if same and j.get("phase") in ("staging", "committing", "pushed"):
            try:
                resumed = agent.resume(j["id"], holder, break_lock=takeover)["deployment"]
            except AgentError as exc:
                if exc.kind != "not_resumable":
                    raise
        if resumed is not None:
            progress("resume", f"deployment {j['id']} was interrupted in phase {j.get('phase')}; verifying it")
            plan = plan_apply(transport, host, info, patchset, pristine=pristine, agent=agent,
                              inspect=agent.inspect(sorted(paths)), home=home)
            save_local_record(home, name, resumed, _backups_for_local(agent, plan, resumed))  # as a push does
            report = _verify_and_finish(agent, transport, host, info, patchset, resumed, holder, home, name,
                                        progress)
            recovered.append(f"resumed interrupted deployment {j['id']} (was {j.get('phase')}) and verified it")
            return done("resumed", plan, deployment_id=j["id"], record=resumed, checks=report)
        progress("rollback", f"rolling back interrupted deployment {j.get('id')} (phase {j.get('phase')})")
        rb = agent.rollback(j["id"], holder, break_lock=takeover)
        save_local_record(home, name, rb["deployment"])
        recovered.append(f"rolled back interrupted deployment {j['id']} (was {j.get('phase')})")
        ins = agent.inspect(sorted(paths))

    plan = plan_apply(transport, host, info, patchset, pristine=pristine, agent=agent, inspect=ins, home=home)
    if plan.drifted and not force:
        lines = [f"{p}: live {(plan.files[p].live or 'absent')[:16]}, pristine "
                 f"{(plan.files[p].pristine or 'absent')[:16]}, expected {(plan.files[p].expected or 'absent')[:16]}"
                 for p in plan.drifted]
        err = DriftError(f"{name}: {len(plan.drifted)} file(s) match neither the pristine nor any revision "
                         f"of {patchset.name}:\n    " + "\n    ".join(lines),
                         hint="someone changed them on the host; look at them, then rerun with --force "
                              "to overwrite (they are backed up first)")
        err.files = plan.drifted  # type: ignore[attr-defined]
        raise err
    if dry_run and (plan.to_push or j is not None):  # a pending journal: the real run would
        return done("dry_run", plan)                 # resume it or roll it back, never a no-op
    if not plan.to_push:
        return done("already_applied", plan)
    if ins.get("journal") is None:
        lock_takeover = _lock_takeover(name, ins.get("lock"), break_lock, "cannot deploy")
    else:
        lock_takeover = False
    if confirm is not None and not confirm(plan):
        return done("aborted", plan)

    did = new_deployment_id(str(patchset.name), patchset.revision)
    holder = make_holder(did)
    files_spec = {}
    for p, fp in plan.to_push.items():
        files_spec[p] = {"action": fp.action, "sha256": fp.expected if fp.action == "write" else None,
                         "mode": fp.mode, "allowed": _allowed(fp, history)}
    deployment = {"id": did, "patchset": patchset.name, "revision": int(patchset.revision),
                  "sglang_version": version,
                  "client": {k: holder[k] for k in ("user", "host", "pid")}}
    progress("push", f"{len(files_spec)} file(s) → {name} (stage, verify, rename)")
    pushed = agent.push(deployment, files_spec, plan.contents, holder, force=force, break_lock=lock_takeover,
                        reserve_bytes=reserve_bytes)["deployment"]
    backups = _backups_for_local(agent, plan, pushed)
    local = save_local_record(home, name, pushed, backups)
    report = _verify_and_finish(agent, transport, host, info, patchset, pushed, holder, home, name, progress)
    record = json.loads(local.read_text())
    return done("applied", plan, deployment_id=did, record=record, checks=report, local_record=str(local))


# ------------------------------------------------------------------------------------ rollback

def _is_damaged(record: dict[str, Any]) -> bool:
    """A journal or deployment record the agent could not parse, or one without its id / phase."""
    return bool(record.get("unreadable") or not record.get("id") or not record.get("phase"))


def damaged_records(answer: dict[str, Any]) -> list[str]:
    """The damaged records of an agent ``inspect`` or ``history`` answer (``_is_damaged``): their
    paths on the host (the journal first)."""
    damaged = []
    j = answer.get("journal")
    if j is not None and _is_damaged(j):
        damaged.append(j.get("path") or f"{answer.get('state_dir', '<state dir>')}/journal.json")
    for d in answer.get("deployments", []):
        if _is_damaged(d):
            damaged.append(d.get("path") or f"record {d.get('id', '?')}")
    return damaged


def _damaged_hint(name: str) -> str:
    return (f"restore them from the local copies under {sglpatch_home() / 'deployments' / safe_component(name)} "
            "if present, else move them aside (the files' states are in `sglpatch status`)")


def check_host_records(name: str, answer: dict[str, Any]) -> None:
    """Refuse to act on damaged host records (``damaged_records``): :class:`StateError` naming
    the files and what to do. ``answer`` is an agent ``inspect`` or ``history`` answer."""
    damaged = damaged_records(answer)
    if damaged:
        raise StateError(f"{name}: damaged deployment record(s) on the host: {', '.join(damaged)}",
                         hint=_damaged_hint(name))


def _refuse_downgrade(name: str, answer: dict[str, Any], patchset: Any) -> None:
    """A host carrying a newer revision of the same patchset is not drift: say how to go back."""
    newer = [d for d in answer.get("deployments", [])
             if d.get("phase") in ACTIVE and d.get("patchset") == patchset.name
             and int(d.get("revision") or 0) > int(patchset.revision)]
    if newer:
        top = max(newer, key=lambda d: int(d.get("revision") or 0))
        raise DeployError(
            f"{name}: carries {patchset.name} r{top.get('revision')} (deployment {top['id']}), newer "
            f"than the r{patchset.revision} asked for; a downgrade is a rollback",
            hint=f"`sglpatch rollback --host {name}` returns to the state before r{top.get('revision')} "
                 f"(the earlier revision if it was deployed before, else pristine)")


def rollback_host(transport: Transport, host: Any, info: Any, deployment_id: str | None = None, *,
                  break_lock: bool = False, force: bool = False, home: Path | None = None,
                  progress: Progress | None = None) -> RollbackResult:
    """Roll back ``deployment_id`` (None: the latest active one; an interrupted one first).

    With an id, every active deployment after it that touches the same files is rolled back too,
    newest first, so the host ends in the state before ``deployment_id``. The agent restores each
    backup (stage, verify, rename, original owner and mode), removes added files, purges bytecode and
    verifies every file against its recorded pre-deploy sha256. A file edited on the host since the
    deployment wrote it is drift: :class:`DriftError` naming the files and nothing is changed, unless
    ``force`` (the edited bytes are then kept on the host under ``backups/<id>.drifted/``).
    Nothing active (rolled back already, or never deployed) is no error: the result names no
    deployment (``already``: the latest rolled-back one, if any). Backups lost on the host are put
    back first, each that is found by its recorded sha256 in the local copies, the host's mirror
    or the release's wheel (``backups_put_back`` says which came from where); if any is found
    nowhere, no file is restored. Raises StateError (unknown id, local records of an active
    deployment the host has no record of, a backup missing or not matching that none of those
    holds), LockHeldError, DriftError.
    """
    t0 = time.monotonic()
    rt0 = transport.round_trips
    home = home or sglpatch_home()
    progress = progress or _noop
    name = _host_name(host, transport)
    agent = _agent_for(transport, host, info)
    hist = agent.history()
    check_host_records(name, hist)
    sync_local_records(home, name, hist.get("deployments", []))
    records = {d["id"]: d for d in hist.get("deployments", [])}
    j = hist.get("journal")
    if j is not None:
        records[j["id"]] = j
    order = sorted(records.values(), key=lambda d: (d.get("times", {}).get("started", ""), d["id"]))
    active = [d for d in order if d.get("phase") in ACTIVE]
    if deployment_id is None:
        if not active:
            shown = [d['id'] + ' ' + str(d.get('phase')) for d in order]
            lost = _local_only_active(home, name, set(records))
            if not lost:  # rolled back already, or never deployed: the wanted state holds (exit 0)
                return RollbackResult(host=name, rolled_back=[], files={},
                                      already=[d["id"] for d in order if d.get("phase") == "rolled_back"][-1:],
                                      round_trips=transport.round_trips - rt0, seconds=time.monotonic() - t0)
            raise StateError(
                f"{name}: no deployment to roll back in the host's records (history: "
                f"{', '.join(shown[-5:]) or 'empty'}{f', and {len(shown) - 5} earlier' if len(shown) > 5 else ''})",
                hint=f"the host has no record of deployment(s) {', '.join(p.stem for p in lost)}, active in "
                     f"the local copies: {', '.join(str(p) for p in lost)} — if its files are still patched "
                     f"(`sglpatch status --host {name}`), copy the record back into the host's .sglpatch/"
                     f"deployments/ and roll back again")
        todo = [active[-1]]
    else:
        if deployment_id not in records:
            raise StateError(f"{name}: no deployment {deployment_id} on this host",
                             hint=f"`sglpatch status --host {name}` lists them")
        start = order.index(records[deployment_id])
        todo = [d for d in order[start:] if d.get("phase") in ACTIVE]
        first = records[deployment_id]
        todo = [d for d in todo if d is first or set(d.get("files", {})) & set(first.get("files", {}))]
        todo.reverse()
    _refuse_other_release(name, info, todo, home)
    takeover = _lock_takeover(name, hist.get("lock"), break_lock, "cannot roll back")
    if todo:
        check_local_writable(home, name)
    rolled, already = [], []
    final: dict[str, str | None] = {}
    if deployment_id is not None and not todo:
        already.append(deployment_id)
    put_back: dict[str, dict[str, str]] = {}
    kept: dict[str, str] = {}
    for d in todo:
        holder = make_holder(d["id"])
        progress("rollback", f"{d['id']} ({d.get('patchset')} r{d.get('revision')}, {len(d.get('files', {}))} files)")
        try:
            out = agent.rollback(d["id"], holder, break_lock=takeover, force=force)
        except AgentStateError as exc:
            if exc.kind != "backup_missing":
                raise
            missing = exc.details.get("backups", {})
            if not missing:
                raise
            found = _recover_backups(home, name, info, d, missing)
            if found:  # verified originals: harmless to put back even when others stay lost
                agent.put_backups(d["id"], {p: data for p, (data, _) in found.items()}, holder,
                                  break_lock=takeover)
                put_back[d["id"]] = {p: src for p, (_, src) in found.items()}
                progress("rollback", f"{d['id']}: put back {len(found)} lost backup(s) from "
                                     f"{', '.join(sorted(set(put_back[d['id']].values())))}")
            lost = {p: b for p, b in missing.items() if p not in found}
            if lost:
                raise StateError(
                    f"{name}: {len(lost)} backup(s) of deployment {d['id']} are missing or damaged on the host and "
                    f"no copy with the recorded sha256 is left (local copies, mirror, release wheel): "
                    f"{', '.join(sorted(lost.values()))}; nothing was restored"
                    + (f" ({len(found)} other lost backup(s) were put back)" if found else ""),
                    hint=_missing_backups_hint(home, name, d["id"], lost,
                                               local=isinstance(transport, LocalTransport))) from exc
            out = agent.rollback(d["id"], holder, break_lock=takeover, force=force)
        (already if out.get("already") else rolled).append(d["id"])
        kept.update(out["deployment"].get("drift_kept") or {})
        save_local_record(home, name, out["deployment"])
        for p, f in out["deployment"].get("files", {}).items():
            final[p] = f.get("before")
    return RollbackResult(host=name, rolled_back=rolled, files=final, already=already,
                          round_trips=transport.round_trips - rt0, seconds=time.monotonic() - t0,
                          backups_put_back=put_back, drift_kept=kept)


def _recover_backups(home: Path, name: str, info: Any, record: dict[str, Any],
                     missing: dict[str, str]) -> dict[str, tuple[bytes, str]]:
    """Originals of deployment ``record`` whose host backups are lost (``missing``: {path: backup
    path on the host}), found where their bytes still are: the local copies ``save_local_record``
    kept, the host's mirror, the release's PyPI wheel (fetched if not cached). Each must have the
    sha256 the record names as ``before`` (else it is not the original: left out). Returns
    {path: (bytes, source name)} for the paths found; never raises for a path not found."""
    hashes = {p: f.get("before") for p, f in record.get("files", {}).items()
              if p in missing and isinstance(f, dict) and f.get("before")}
    version = str(record.get("sglang_version") or getattr(info, "sglang_version", "") or "")
    readers: list[tuple[str, Callable[[str], bytes | None]]] = [
        ("local copies", _MultiLocalBackups(home, name, hashes))]
    mirror = Mirror(home, name, version) if version else None
    if mirror is not None and mirror.exists():
        readers.append((f"the mirror of {name}", mirror.read))
    if version:
        readers.append((f"wheel sglang=={version}", wheel_reader(version, home)))
    src = PristineSource(hashes, readers)
    found: dict[str, tuple[bytes, str]] = {}
    for p in sorted(hashes):
        try:
            data = src.read(p)
        except StateError:
            continue
        if data is not None:
            found[p] = (data, src.used[p])
    return found


def _refuse_other_release(name: str, info: Any, todo: list[dict[str, Any]], home: Path) -> None:
    """Refuse to roll back a deployment made on another SGLang release than the host has now:
    its backups are the old release's files, and restoring them (``--force`` included) would
    write them over the new install. Raises :class:`StateError` naming both releases."""
    now = str(getattr(info, "sglang_version", "") or "")
    other = [d for d in todo if d.get("sglang_version") and now and str(d["sglang_version"]) != now]
    if not other:
        return
    d = other[0]
    created = sorted(p for p, f in d.get("files", {}).items() if f.get("before") is None)
    local = _local_paths(home, name, d["id"])[0]
    raise StateError(
        f"{name}: deployment {d['id']} was made on sglang {d['sglang_version']}, but the host now has "
        f"sglang {now}: its backups are {d['sglang_version']}'s files, and restoring them (even with "
        f"--force) would write them over the {now} install; nothing was changed",
        hint=(f"installing sglang {now} replaced the patched files it ships"
              + (f"; files the deployment added are still there: {', '.join(created)} — delete them if "
                 f"sglang {now} does not ship them" if created else "")
              + f"; then move the host's record deployments/{d['id']}.json out of its .sglpatch/ state "
                f"directory (a local copy stays at {local}) and check with `sglpatch status --host {name}`; "
                f"or reinstall sglang {d['sglang_version']} on the host and roll back"))


def _missing_backups_hint(home: Path, host: str, deployment_id: str, backups: dict[str, str], *,
                         local: bool = False) -> str:
    """What to do when the host lost backups of a deployment: the local copies that
    ``save_local_record`` kept (under $SGLPATCH_HOME/backups/HOST/ID/), each with where it goes
    (``local``: the host is this machine, so a plain copy, not scp)."""
    bdir = _local_paths(home, host, deployment_id)[1]
    have = {rel: bdir / rel for rel in backups if (bdir / rel).is_file()}
    to = "" if local else host + ":"
    # the host's backups/<id>/ directory each backup lies in (None: a path not ending in its rel)
    roots = {backups[rel][:-len(rel) - 1] if backups[rel].endswith("/" + rel) else None for rel in have}
    whole = len(have) > 2 and len(roots) == 1 and None not in roots  # one copy of the whole tree
    if whole:
        dest = roots.pop()
        lines = [f"copy the files under {bdir}/ into {to}{dest}/, keeping their paths"
                 f" ({'cp' if local else 'scp'} -r {bdir}/. {to}{dest}/)"]
    else:
        lines = [f"copy {have[rel]} to {to}{backups[rel]}" for rel in sorted(have)]
    lost = sorted(set(backups) - set(have))
    how = "" if local or whole else " (e.g. with scp)"
    text = ("; ".join(lines) + how + ", then rerun `sglpatch rollback --host " + host + "`") if lines else ""
    if lost:
        text += ("; " if text else "") + (f"no local copy of {', '.join(lost)} either: put a copy with the sha256 "
                                          "the deployment's record names as `before` at each backup path and "
                                          "roll back again (only those bytes are the originals); failing that, "
                                          "reinstall the SGLang release on the host — which does not bring "
                                          "back what those originals held — and check `sglpatch status`")
    return text


# -------------------------------------------------------------------------------------- status

def _record_hashes(info: Any) -> dict[str, str | None]:
    rec = getattr(info, "record", None)
    if rec is None:
        return {}
    if isinstance(rec, str):
        return read_record(rec)
    return dict(rec)


def host_status(transport: Transport, host: Any, info: Any, patchset: Any = None, *,
                home: Path | None = None) -> StatusReport:
    """Per touched file: pristine / patched (patchset, revision) / drifted, by hashes; plus history.

    With ``patchset``: its touched files, judged against its pristine/expected/history hashes (one
    round trip). Without: the files of the host's deployment records, judged against the installed
    distribution's RECORD (pristine) and the records' ``after`` hashes (two round trips).
    """
    agent = _agent_for(transport, host, info)
    name = _host_name(host, transport)
    version = str(getattr(info, "sglang_version", "") or "") or None
    record_h = _record_hashes(info)
    known: dict[str, list[tuple[str, str | None, int | None]]] = {}  # path → [(state, hash, rev)]
    ps_name = ps_rev = None
    if patchset is not None:
        ps_name, ps_rev = str(patchset.name), int(patchset.revision)
        paths, pristine_h, expected_h, hist = _patchset_view(patchset, str(version), info)
        for p in expected_h:
            known.setdefault(p, []).append(("patched", expected_h[p], ps_rev))
        for rev, hh in sorted(hist.items(), reverse=True):
            for p, h in hh.items():
                paths.add(p)
                known.setdefault(p, []).append(("patched", h, rev))
        pristine_of = {p: pristine_h.get(p, record_h.get(p)) for p in paths}
        ins = agent.inspect(sorted(paths), backups=True)
        deployments = ins.get("deployments", [])
        for d in deployments:  # what a later revision wrote is the host's records' to say (not drift)
            if d.get("phase") in ACTIVE and d.get("patchset") == ps_name and isinstance(d.get("files"), dict):
                for p, f in d["files"].items():
                    if p in paths and isinstance(f, dict) and f.get("after"):
                        known.setdefault(p, []).append(("patched", f["after"], d.get("revision")))
    else:
        first = agent.inspect([], backups=True)
        deployments = first.get("deployments", [])
        paths = set()
        pristine_of = {}
        pending = first.get("journal")
        recs = list(deployments) + ([pending] if pending and pending.get("id") not in
                                    {d.get("id") for d in deployments} else [])
        for d in recs:
            for p, f in d.get("files", {}).items():
                paths.add(p)
                pristine_of.setdefault(p, f.get("before"))  # the oldest original
                known.setdefault(p, []).append(("patched", f.get("after"), d.get("revision")))
        for p in paths:
            if p in record_h:
                pristine_of[p] = record_h[p]
        ins = {**agent.inspect(sorted(paths)), "bad_backups": first.get("bad_backups", {})} if paths else first
        by_path_ps = {}
        for d in recs:
            for p in d.get("files", {}):
                by_path_ps.setdefault(p, []).append(d)
    # a file several revisions share is credited to the revision the host's records say is active
    host_rev = max((int(d.get("revision") or 0) for d in deployments
                    if d.get("phase") in ACTIVE and d.get("patchset") == ps_name), default=None)
    files = []
    for p in sorted(paths):
        li = ins.get("files", {}).get(p, {})
        live = li.get("sha256") if li.get("exists") else None
        fs = FileStatus(path=p, state="drifted", live=live, pristine=pristine_of.get(p), record=record_h.get(p))
        if live == pristine_of.get(p):
            fs.state = "pristine" if live is not None else "absent"
        else:
            for state, h, rev in sorted(known.get(p, []), key=lambda e: e[2] != host_rev):
                if h == live:
                    fs.state, fs.revision = state, rev
                    fs.expected = h
                    if patchset is not None:
                        fs.patchset = ps_name
                    else:
                        ds = [d for d in by_path_ps.get(p, []) if d.get("files", {}).get(p, {}).get("after") == live]
                        fs.patchset = ds[-1].get("patchset") if ds else None
                        fs.revision = ds[-1].get("revision") if ds else rev
                    break
        files.append(fs)
    older = None
    if patchset is not None:  # one earlier revision, whole: its files at it, the rest at rest
        revs = {f.revision for f in files if f.state == "patched"}
        r = next(iter(revs)) if len(revs) == 1 else None
        if r is not None and r != ps_rev and r in hist and all(
                (f.state == "patched") if f.path in hist[r] else f.state in ("pristine", "absent") for f in files):
            older = r
    damaged = damaged_records(ins)
    journal = ins.get("journal")
    bad = ins.get("bad_backups", {})
    local_copies = {did: str(bdir) for did in bad  # where save_local_record kept the originals, if it did
                    if (bdir := _local_paths(home or sglpatch_home(), name, did)[1]).is_dir()}
    return StatusReport(host=name, sglang_version=version, files=files,
                        deployments=[d for d in deployments if not _is_damaged(d)],
                        journal=None if journal is None or _is_damaged(journal) else journal, lock=ins.get("lock"),
                        patchset=ps_name, revision=ps_rev, damaged=damaged, older_revision=older,
                        bad_backups=bad, local_backups=local_copies)
