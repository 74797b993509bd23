"""The local mirror of a host's SGLang install, and :func:`snapshot` which brings it up to date.

Layout (under ``sglpatch_home()``)::

    mirrors/<host>/<sglang-version>/manifest.json   FileEntry per file (path, sha256, size, mode)
    mirrors/<host>/<sglang-version>/tree/<path>     the bytes; paths relative to site-packages

A first snapshot is one round trip: ``probe pack`` sends every file once (each hashed on the host
from the bytes it sends), announced by an index (so progress knows the totals) and followed by the
hashes; each file is hashed here as it is written and must match. Cut short, it keeps what it
fetched (``manifest.partial.json``, the hashes of the bytes here) and the next snapshot fetches only
the rest. Later snapshots cost one or two round trips however many files there are: one ``hash``
(every file's sha256, size, mode under ``sglang/`` and the ``.dist-info``; ``__pycache__``/``*.pyc``
left out; the host's hash cache makes an unchanged file a ``stat``, not a read, see
:class:`~sglang_patcher.remote.probe.HashCache`) and, when anything changed, one ``tar`` carrying
exactly the changed or new files (the path list travels on stdin). Tar streams are unpacked as they
arrive (the transport hands stdout over piece by piece), member by member: only regular files that
were asked for, no absolute paths, no ``..``, no links; a changed file is written beside its
name, hashed, checked against the host's hash and renamed into place. Files gone on the host are
deleted from the mirror; the manifest is written last, atomically (and not at all when nothing
changed), so an interrupted snapshot leaves the previous manifest (and the next snapshot repairs
the tree).
"""

from __future__ import annotations

import errno
import fcntl
import gzip
import hashlib
import io
import json
import os
import queue
import stat
import tarfile
import threading
import time
import zlib
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, BinaryIO, Callable, Literal

from .errors import StateError, TransportError
from .manifest import FileEntry, Manifest, read_record
from .progress import SILENT, Meter, Task
from .remote.launcher import EXPECTED_FAILURE_EXIT, call_json, last_json, run_script
from .state import safe_component, sglpatch_home
from .transport.base import Transport

RecordState = Literal["pristine", "modified", "unrecorded", "unhashed", "missing"]


def check_relpath(path: str) -> str:
    """Return ``path`` if it is a clean relative posix path (no absolute, no ``..``, no ``.``,
    no backslash, no NUL); else raise ValueError."""
    if (not path or "\\" in path or "\x00" in path
            or any(part in ("", ".", "..") for part in path.split("/"))):   # also a leading "/"
        raise ValueError(f"unsafe path {path!r}")
    return path


def _host_name(host: Any) -> str:
    return host if isinstance(host, str) else host.name


class Mirror:
    """A host's mirrored install for one SGLang version.

    ``root``: the mirror directory; ``tree``: the files; ``manifest``: the :class:`Manifest`
    (raises StateError naming the path and ``sglpatch snapshot HOST`` when there is none).
    """

    def __init__(self, home: Path | None, host: Any, version: str):
        self.home = Path(home) if home is not None else sglpatch_home()
        self.host = _host_name(host)
        self.version = version
        self.root = self.home / "mirrors" / safe_component(self.host) / safe_component(version)
        self.tree = self.root / "tree"
        self.manifest_path = self.root / "manifest.json"
        self._manifest: Manifest | None = None
        self._manifest_key: tuple[int, int, int] | None = None

    @classmethod
    def open(cls, home: Path | None, host: Any, version: str) -> "Mirror":
        """The existing mirror; raises StateError when ``host`` was never snapshotted at ``version``."""
        m = cls(home, host, version)
        if not m.exists():
            raise StateError(f"no mirror of {m.host} for sglang {version} at {m.root}",
                             hint=f"run `sglpatch snapshot {m.host}` first")
        return m

    def exists(self) -> bool:
        return self.manifest_path.is_file()

    @property
    def manifest(self) -> Manifest:
        """The current manifest (re-read when a later snapshot has replaced the file)."""
        try:
            st = self.manifest_path.stat()
        except OSError:
            raise StateError(f"no mirror manifest at {self.manifest_path}",
                             hint=f"run `sglpatch snapshot {self.host}`") from None
        key = (st.st_mtime_ns, st.st_size, st.st_ino)
        if self._manifest is None or self._manifest_key != key:
            self._manifest = Manifest.load(self.manifest_path)
            self._manifest_key = key
        return self._manifest

    def path_of(self, path: str) -> Path:
        """Local file of site-packages-relative ``path`` (ValueError for unsafe paths)."""
        return self.tree / check_relpath(path)

    def read(self, path: str) -> bytes | None:
        """The mirrored bytes of ``path`` (relative to site-packages), or None when the host has no
        such file. Raises StateError when the mirror's file is missing or its hash differs from the
        manifest (the mirror was tampered with: snapshot again)."""
        entry = self.manifest.files.get(path)
        if entry is None:
            return None
        try:
            data = self.path_of(path).read_bytes()
        except OSError as exc:
            raise StateError(f"mirror of {self.host}: {path} is missing locally ({exc.strerror})",
                             hint=f"run `sglpatch snapshot {self.host}` again") from exc
        if hashlib.sha256(data).hexdigest() != entry.sha256:
            raise StateError(f"mirror of {self.host}: {path} does not match its manifest hash",
                             hint=f"run `sglpatch snapshot {self.host}` again")
        return data

    def __contains__(self, path: str) -> bool:
        return path in self.manifest.files

    @property
    def dist_info(self) -> str | None:
        """The ``sglang-X.dist-info`` directory name in the mirror, if any."""
        names = {p.split("/", 1)[0] for p in self.manifest.files if ".dist-info/" in p}
        names = {n for n in names if n.endswith(".dist-info")}
        return sorted(names)[0] if len(names) == 1 else None

    def record(self) -> dict[str, str | None]:
        """The mirrored distribution's RECORD as ``{path: hex sha256 | None}`` ({} if absent)."""
        di = self.dist_info
        data = self.read(f"{di}/RECORD") if di else None
        return read_record(data.decode("utf-8")) if data else {}

    def record_states(self) -> dict[str, RecordState]:
        """Each file's state against the install's RECORD.

        ``pristine``: sha256 equals RECORD's; ``modified``: differs; ``unhashed``: in RECORD without
        a hash (RECORD itself, INSTALLER...); ``unrecorded``: in the mirror, not in RECORD (added
        after install); ``missing``: in RECORD (not ``__pycache__``/``.pyc``) but not on the host.
        """
        record = self.record()
        files = self.manifest.files
        out: dict[str, RecordState] = {}
        for path, entry in files.items():
            if path not in record:
                out[path] = "unrecorded"
            elif record[path] is None:
                out[path] = "unhashed"
            else:
                out[path] = "pristine" if record[path] == entry.sha256 else "modified"
        for path in record:
            if path in files or "__pycache__/" in path or path.endswith(".pyc"):
                continue
            if path.split("/", 1)[0] in ("sglang", self.dist_info):
                out[path] = "missing"
        return out


@dataclass
class SnapshotResult:
    """What :func:`snapshot` did.

    ``fetched``: paths transferred (new or changed); ``unchanged``: how many were reused from the
    previous mirror; ``deleted``: paths gone on the host, removed locally; ``bytes_fetched``: their
    total size; ``round_trips``: exec channels opened (1 when nothing changed, else 2);
    ``seconds``: wall time.
    """

    mirror: Mirror
    fetched: list[str] = field(default_factory=list)
    unchanged: int = 0
    deleted: list[str] = field(default_factory=list)
    bytes_fetched: int = 0
    round_trips: int = 0
    seconds: float = 0.0

    @property
    def files(self) -> int:
        return len(self.mirror.manifest.files)

    def counts(self) -> str:
        """'N fetched, M unchanged, K deleted': what this snapshot did to the mirror's files."""
        return f"{len(self.fetched)} fetched, {self.unchanged} unchanged, {len(self.deleted)} deleted"

    def to_dict(self) -> dict[str, Any]:
        return {"host": self.mirror.host, "sglang_version": self.mirror.version,
                "mirror": str(self.mirror.root), "files": self.files,
                "fetched": len(self.fetched), "unchanged": self.unchanged,
                "deleted": len(self.deleted), "bytes_fetched": self.bytes_fetched,
                "round_trips": self.round_trips, "seconds": round(self.seconds, 3)}


def snapshot(transport: Transport, host: Any, info: Any, home: Path | None = None, *,
             compress: bool | None = None, timeout: float | None = 600, meter: Meter = SILENT) -> SnapshotResult:
    """Bring the local mirror of ``host`` (inventory Host) up to date with its install.

    ``info`` is the host's :class:`~sglang_patcher.discovery.HostInfo` (``interpreter``,
    ``site_packages``, ``dist_info``, ``sglang_version``). ``compress`` gzips the tar stream (level 1,
    about 3x smaller for SGLang's sources); None (default) compresses unless the transport is local
    or reaches a loopback address, where it only costs CPU. ``meter`` shows the transfer's progress
    (files, bytes, rate). Returns :class:`SnapshotResult`.
    Raises TransportError (host unreachable, command failed, bad tar stream), StateError (a file
    changed on the host during the snapshot: run it again).

    A first snapshot (no manifest yet) is one round trip: the host sends every file once, hashing
    what it sends (``probe pack``); an interrupted one keeps what it fetched (``manifest.partial.json``)
    and the next snapshot fetches only the rest. Later snapshots are ``hash`` (the host's hash cache
    makes an unchanged file a stat, not a read) and, when anything changed, one ``tar``.
    """
    t0 = time.monotonic()
    trips0 = transport.round_trips
    name = _host_name(host)
    sudo = bool(getattr(host, "sudo", False))
    mirror = Mirror(home, host, info.sglang_version)
    mirror.root.mkdir(parents=True, exist_ok=True)
    if compress is None:
        compress = not getattr(transport, "is_loopback", True)
    partial = mirror.root / "manifest.partial.json"
    base_args = {"site_packages": info.site_packages, "dist_info": info.dist_info, "package": "sglang",
                 "cache": True}
    with open(mirror.root / ".lock", "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        old: dict[str, FileEntry] = {}
        complete = False
        for candidate, is_complete in ((mirror.manifest_path, True), (partial, False)):
            if candidate.is_file():
                try:
                    old, complete = Manifest.load(candidate).files, is_complete
                    break
                except StateError:
                    pass   # a damaged manifest: fetch everything again, which repairs it
        result = SnapshotResult(mirror=mirror)
        if not old:
            remote = _pack(name, transport, info, mirror, base_args, compress, sudo, timeout, meter, result, partial)
        else:
            with meter.task(f"snapshot {name}") as task:
                task.note("hashing the install on the host")
                out = call_json(transport, info.interpreter, "probe", "hash", base_args, sudo=sudo, timeout=timeout)
                if not out.get("ok", False):
                    raise TransportError(f"{name}: hashing the install failed: {out.get('error')}",
                                         hint="run `sglpatch hosts --check` to rediscover the host")
                remote = _entries(name, out["files"])
                want: list[str] = []
                tree = str(mirror.tree) + "/"
                for path, entry in sorted(remote.items()):
                    prev = old.get(path)
                    local = tree + path
                    if prev is not None and prev.sha256 == entry.sha256 and _size(local) == entry.size:
                        result.unchanged += 1
                        if prev.mode != entry.mode:
                            _chmod_local(local, entry.mode)
                    else:
                        want.append(path)
                if want:
                    task.total(nbytes=sum(remote[p].size for p in want), files=len(want))
                    task.note("fetching")
                    args = {"site_packages": info.site_packages, **({"compress": "gz"} if compress else {})}
                    landed: dict[str, tuple[str, int, int]] = {}
                    try:
                        result.bytes_fetched = _stream(
                            name, transport, info, "tar", args, json.dumps(want).encode(), sudo, timeout,
                            lambda f: _extract(name, f, want, remote, mirror.tree, task=task, got=landed))
                    except BaseException:
                        if not complete and landed:   # a resumed first snapshot: keep this run's files too
                            kept = {**old, **{p: FileEntry(p, sha, size, mode) for p, (sha, size, mode) in landed.items()}}
                            Manifest(source=f"host:{name}", sglang_version=info.sglang_version,
                                     site_packages=info.site_packages, created=None, files=kept).save(partial)
                            task.failed_note = (f"the mirror is partial: {len(kept)} of {len(remote)} files kept; "
                                                f"the next snapshot of {name} fetches only the rest")
                        raise
                result.fetched = want
        result.deleted = sorted(set(old) - set(remote)) if complete else []
        changed = (bool(result.fetched) or bool(result.deleted) or not complete
                   or any(old[p].mode != e.mode for p, e in remote.items() if p in old))
        _prune(mirror.tree, set(remote))   # files gone on the host, leftovers of an interrupted run
        if changed:
            manifest = Manifest(source=f"host:{name}", sglang_version=info.sglang_version,
                                site_packages=info.site_packages, files=remote,
                                created=datetime.now(timezone.utc).isoformat(timespec="seconds"))
            manifest.save(mirror.manifest_path)
        partial.unlink(missing_ok=True)
    result.round_trips = transport.round_trips - trips0
    result.seconds = time.monotonic() - t0
    return result


def _entries(name: str, files: list[list[Any]]) -> dict[str, FileEntry]:
    """The host's ``[[path, sha256, size, mode], ...]`` as FileEntry by path, each path checked."""
    remote: dict[str, FileEntry] = {}
    for path, sha, size, mode in files:
        try:
            check_relpath(path)
        except ValueError as exc:
            raise TransportError(f"{name}: the host reported an unsafe path {path!r}") from exc
        remote[path] = FileEntry(path, sha, int(size), int(mode))
    return remote


def _pack(name: str, transport: Transport, info: Any, mirror: Mirror, args: dict[str, Any], compress: bool,
          sudo: bool, timeout: float | None, meter: Meter, result: SnapshotResult,
          partial: Path) -> dict[str, FileEntry]:
    """A first snapshot in one round trip (``probe pack``): every file once, its hash checked against
    the one the host computed from the bytes it sent. Interrupted, the files fetched so far are
    kept with their hashes in ``partial`` for the next snapshot. Returns the host's files."""
    index: dict[str, tuple[int, int]] = {}
    trailer: list[list[Any]] = []
    got: dict[str, tuple[str, int, int]] = {}

    def special(member: str, data: bytes) -> None:
        try:
            rows = json.loads(data)
        except ValueError:
            raise TransportError(f"{name}: the snapshot's {member} is not JSON") from None
        if member == "@sglpatch/index.json":
            index.update({str(p): (int(size), int(mode)) for p, size, mode in rows})
            task.total(nbytes=sum(s for s, _ in index.values()), files=len(index))
            task.note("fetching")
        elif member == "@sglpatch/hashes.json":
            trailer.extend(rows)
        else:
            raise TransportError(f"{name}: refusing tar member {member!r} (not requested)")

    with meter.task(f"snapshot {name} (first, whole install)") as task:
        task.note("waiting for the host")
        try:
            _stream(name, transport, info, "pack", {**args, **({"compress": "gz"} if compress else {})}, None,
                    sudo, timeout, lambda f: _unpack(name, f, mirror.tree, index.__contains__, direct=True,
                                                     got=got, special=special, task=task))
        except BaseException:
            if got:   # what was fetched stays, with the hashes of its bytes: the next run fetches the rest
                Manifest(source=f"host:{name}", sglang_version=info.sglang_version,
                         site_packages=info.site_packages, created=None,
                         files={p: FileEntry(p, sha, size, mode) for p, (sha, size, mode) in got.items()}
                         ).save(partial)
                task.failed_note = (f"the mirror is partial: {len(got)} of {len(index) or '?'} files kept; "
                                    f"the next snapshot of {name} fetches only the rest")
            raise
    remote = _entries(name, trailer)
    if not trailer and index:
        raise TransportError(f"{name}: the snapshot's tar stream ended without its hashes",
                             hint="run the snapshot again")
    bad = sorted(p for p, e in remote.items() if got.get(p, (None,))[0] != e.sha256)
    extra = sorted(set(got) - set(remote))
    if bad or extra:
        raise StateError(f"{name}: {', '.join((bad + extra)[:3])} changed on the host during the snapshot",
                         hint="run the snapshot again once nothing is writing to the install")
    result.fetched = sorted(remote)
    result.bytes_fetched = sum(e.size for e in remote.values())
    return remote


def _stream(name: str, transport: Transport, info: Any, op: str, args: dict[str, Any], stdin: bytes | None,
            sudo: bool, timeout: float | None, consume: Callable[[BinaryIO], Any]) -> Any:
    """Run the probe's ``op`` (a tar stream on stdout) and ``consume`` the stream while it travels
    (the transport's reader hands each piece over; ``consume`` reads them in this thread).
    A failed command is reported as the command's failure, not as a broken stream."""
    pipe = _Pipe()
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["res"] = run_script(transport, info.interpreter, "probe", op, args, stdin=stdin, sudo=sudo,
                                    timeout=timeout, stdout_sink=pipe.feed)
        except BaseException as exc:   # surfaced in the caller's thread
            box["exc"] = exc
        finally:
            pipe.end()

    th = threading.Thread(target=run, name=f"sglpatch-{op}", daemon=True)
    th.start()
    try:
        out = consume(io.BufferedReader(pipe, 1 << 16))
    except KeyboardInterrupt:   # Ctrl-C: no waiting for the rest of the stream (a daemon thread drops it)
        pipe.abort()
        raise
    except BaseException:
        pipe.abort()
        th.join(timeout)
        if "exc" in box:
            raise box["exc"] from None
        if "res" in box and box["res"].exit_code != 0:
            _check_tar(name, box["res"])
        raise
    th.join(timeout)
    if "exc" in box:
        raise box["exc"]
    _check_tar(name, box["res"])
    return out


class _Pipe(io.RawIOBase):
    """The stdout of a running command as a readable stream: ``feed`` (the transport's reader
    thread) queues each piece, ``readinto`` (the consumer) takes them in order; after ``abort`` the
    rest is dropped, so the command can run out without anyone waiting on it."""

    def __init__(self) -> None:
        self._q: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
        self._buf = memoryview(b"")
        self._eof = False
        self._aborted = False

    def readable(self) -> bool:
        return True

    def feed(self, data: bytes) -> None:
        if not self._aborted:
            self._q.put(data)

    def end(self) -> None:
        self._q.put(None)

    def abort(self) -> None:
        self._aborted = True

    def readinto(self, b: Any) -> int:
        while not len(self._buf):
            if self._eof:
                return 0
            item = self._q.get()
            if item is None:
                self._eof = True
                return 0
            self._buf = memoryview(item)
        n = min(len(b), len(self._buf))
        b[:n] = self._buf[:n]
        self._buf = self._buf[n:]
        return n


def _check_tar(host: str, res: Any) -> None:
    """Raise for a failed ``probe tar``: a file that vanished between listing and reading means the
    install changed while it was mirrored (a deployment or pip running there), said as such;
    anything else as the transport reports it."""
    if res.exit_code == EXPECTED_FAILURE_EXIT:
        err = last_json(res.stdout)
        if isinstance(err, dict) and err.get("kind") == "missing":
            raise StateError(  # as for a file whose bytes changed meanwhile (_extract)
                f"{host}: {err.get('path', 'a file')} vanished from the install while it was being "
                f"mirrored: the host's SGLang changed during the snapshot",
                hint=f"another deployment (or a pip run) is changing it; wait for it to finish, "
                     f"then rerun (`sglpatch status --host {host}` shows a held deploy lock)")
    res.check(hint="run `sglpatch hosts --check` to rediscover the host")


def _size(path: str) -> int | None:
    """The size of the regular file at ``path`` (not following a link), else None."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return st.st_size if stat.S_ISREG(st.st_mode) else None


def _chmod_local(path: str | Path, mode: int) -> None:
    # keep our copy owner-read/writable whatever the host's mode; the real mode is in the manifest
    os.chmod(path, (mode & 0o777) | 0o600)


def _extract(host: str, stream: bytes | BinaryIO, want: list[str], remote: dict[str, FileEntry],
             tree: Path, *, task: Task | None = None, got: dict[str, tuple[str, int, int]] | None = None) -> int:
    """Unpack ``stream`` (tar, optionally gzip; bytes or a readable stream) into ``tree``: exactly
    the files of ``want``, each hashed as it is written and renamed into place only when it has the
    host's hash in ``remote``. Returns bytes written. ``got`` (the caller's, optional) receives
    ``path: (sha256, size, mode)`` of each file in place, also when an error stops the rest."""
    wanted = set(want)

    def verify(name: str, sha: str) -> None:
        if sha != remote[name].sha256:
            raise StateError(f"{host}: {name} changed on the host during the snapshot",
                             hint="run the snapshot again once nothing is writing to the install")

    got = {} if got is None else got
    _unpack(host, stream, tree, wanted.__contains__, direct=False, got=got, verify=verify, task=task)
    missing = wanted - set(got)
    if missing:
        raise TransportError(f"{host}: the snapshot's tar stream lacks {len(missing)} file(s), "
                             f"e.g. {sorted(missing)[0]}", hint="run the snapshot again")
    return sum(size for _sha, size, _mode in got.values())


def _unpack(host: str, stream: bytes | BinaryIO, tree: Path, accept: Callable[[str], bool], *, direct: bool,
            got: dict[str, tuple[str, int, int]], verify: Callable[[str, str], None] | None = None,
            special: Callable[[str, bytes], None] | None = None, task: Task | None = None) -> None:
    """Unpack a tar stream into ``tree``: only regular files whose clean relative names ``accept``
    takes (once each), never through a link or out of the tree. ``direct`` writes each file under
    its name (a first snapshot: no manifest trusts the tree yet); else beside it, renamed into
    place after ``verify(name, sha256)``. Members named ``@sglpatch/...`` go to ``special``.
    ``got[name] = (sha256, size, mode)`` as each file lands (also when an error stops the rest)."""
    tree.mkdir(parents=True, exist_ok=True)
    troot = os.path.realpath(tree)
    base = str(tree)
    safe_dirs: set[str] = set()
    fileobj = io.BytesIO(stream) if isinstance(stream, (bytes, bytearray)) else stream
    try:
        tar = tarfile.open(fileobj=fileobj, mode="r|*")
    except tarfile.TarError as exc:
        raise TransportError(f"{host}: the snapshot's tar stream is unreadable ({exc})") from exc
    with tar:
        try:
            for member in tar:
                name = member.name
                if special is not None and name.startswith("@sglpatch/"):
                    src = tar.extractfile(member)
                    assert src is not None
                    special(name, src.read())
                    continue
                try:
                    check_relpath(name)
                except ValueError:
                    raise TransportError(f"{host}: refusing tar member {name!r} (unsafe path)") from None
                if not member.isreg():
                    raise TransportError(f"{host}: refusing tar member {name!r} (not a regular file)")
                if not accept(name) or name in got:
                    raise TransportError(f"{host}: refusing tar member {name!r} (not requested)")
                dest = os.path.join(base, name)
                parent = os.path.dirname(dest)
                if parent not in safe_dirs:
                    os.makedirs(parent, exist_ok=True)
                    real = os.path.realpath(parent)
                    if real != troot and not real.startswith(troot + os.sep):
                        raise TransportError(
                            f"{host}: refusing tar member {name!r} (escapes the mirror)")
                    safe_dirs.add(parent)
                src = tar.extractfile(member)
                assert src is not None
                target = dest if direct else os.path.join(parent, f".{os.path.basename(dest)}.sglpatch-tmp")
                h = hashlib.sha256()
                try:
                    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
                except OSError as exc:
                    if exc.errno in (errno.ELOOP, errno.EISDIR, errno.ENOTDIR):   # a link or a directory there
                        raise TransportError(f"{host}: mirror path {dest} is not a regular file ({exc.strerror}); "
                                             "delete the mirror and snapshot again") from None
                    # this machine refused the write (permissions, chattr, a full or read-only
                    # disk): a local file error, said with its path (exit 1), not the host's
                    raise OSError(exc.errno, exc.strerror, dest) from None
                with open(fd, "wb", closefd=True) as f:
                    while block := src.read(1 << 20):
                        h.update(block)
                        f.write(block)
                    os.fchmod(f.fileno(), (member.mode & 0o777) | 0o600)
                sha = h.hexdigest()
                if not direct:
                    try:
                        if verify is not None:
                            verify(name, sha)
                        if os.path.islink(dest) or os.path.isdir(dest):
                            raise TransportError(f"{host}: mirror path {dest} is not a regular file; "
                                                 "delete the mirror and snapshot again")
                    except BaseException:
                        os.unlink(target)
                        raise
                    os.replace(target, dest)
                got[name] = (sha, member.size, member.mode & 0o7777)
                if task is not None:
                    task.advance(nbytes=member.size, files=1)
        except (tarfile.TarError, EOFError, zlib.error, gzip.BadGzipFile) as exc:
            raise TransportError(f"{host}: the snapshot's tar stream is corrupt ({exc})") from exc


def _prune(tree: Path, keep: set[str]) -> None:
    """Delete every file under ``tree`` not in ``keep`` (and leftovers), then empty directories."""
    if not tree.exists():
        return
    base = str(tree)
    cut = len(base) + 1
    for dirpath, dirnames, filenames in os.walk(base, topdown=False):
        rel_dir = dirpath[cut:].replace(os.sep, "/")
        prefix = rel_dir + "/" if rel_dir else ""
        for fn in filenames:
            if prefix + fn not in keep:
                os.unlink(os.path.join(dirpath, fn))
        for dn in dirnames:
            full = os.path.join(dirpath, dn)
            if os.path.islink(full):
                os.unlink(full)
            else:
                try:
                    os.rmdir(full)
                except OSError:
                    pass  # not empty
