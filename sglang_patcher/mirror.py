"""The local mirror of a host's SGLang install, and :func:`snapshot` which brings it up to date.

Layout (under ``sglpatch_home()``)::

    mirrors/<host>/<sglang-version>/manifest.json   FileEntry per file (path, sha256, size, mode)
    mirrors/<host>/<sglang-version>/tree/<path>     the bytes; paths relative to site-packages

A snapshot costs two round trips however many files there are: one ``hash`` (every file's sha256,
size, mode under ``sglang/`` and the ``.dist-info``; ``__pycache__``/``*.pyc`` left out) and, when
anything changed, one ``tar`` carrying exactly the changed or new files (the path list travels on
stdin). The tar stream is unpacked member by member: only regular files that were asked for, no
absolute paths, no ``..``, no links; each file is hashed as it is written, must match the hash the
host reported, and is renamed into place. Files gone on the host are deleted from the mirror; the
manifest is written last, atomically, so an interrupted snapshot leaves the previous manifest (and
the next snapshot repairs the tree).
"""

from __future__ import annotations

import fcntl
import hashlib
import io
import json
import os
import posixpath
import tarfile
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal

from .errors import StateError, TransportError
from .manifest import FileEntry, Manifest, read_record
from .remote.launcher import EXPECTED_FAILURE_EXIT, call_json, last_json, run_script
from .state import safe_component, sglpatch_home
from .transport.base import Transport

RecordState = Literal["pristine", "modified", "unrecorded", "unhashed", "missing"]


def check_relpath(path: str) -> str:
    """Return ``path`` if it is a clean relative posix path (no absolute, no ``..``, no ``.``,
    no backslash, no NUL); else raise ValueError."""
    if (not path or path.startswith("/") or "\\" in path or "\x00" in path
            or posixpath.normpath(path) != path or path.split("/")[0] in ("..", ".")
            or ".." in path.split("/")):
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
             compress: bool | None = None, timeout: float | None = 600) -> SnapshotResult:
    """Bring the local mirror of ``host`` (inventory Host) up to date with its install.

    ``info`` is the host's :class:`~sglang_patcher.discovery.HostInfo` (``interpreter``,
    ``site_packages``, ``dist_info``, ``sglang_version``). ``compress`` gzips the tar stream (level 1,
    about 3x smaller for SGLang's sources); None (default) compresses unless the transport is local
    or reaches a loopback address, where it only costs CPU. Returns :class:`SnapshotResult`.
    Raises TransportError (host unreachable, command failed, bad tar stream), StateError (a file
    changed on the host during the snapshot: run it again).
    """
    t0 = time.monotonic()
    trips0 = transport.round_trips
    name = _host_name(host)
    sudo = bool(getattr(host, "sudo", False))
    mirror = Mirror(home, host, info.sglang_version)
    mirror.root.mkdir(parents=True, exist_ok=True)
    if compress is None:
        compress = not getattr(transport, "is_loopback", True)
    with open(mirror.root / ".lock", "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        out = call_json(transport, info.interpreter, "probe", "hash",
                        {"site_packages": info.site_packages, "dist_info": info.dist_info,
                         "package": "sglang"}, sudo=sudo, timeout=timeout)
        if not out.get("ok", False):
            raise TransportError(f"{name}: hashing the install failed: {out.get('error')}",
                                 hint="run `sglpatch hosts --check` to rediscover the host")
        remote: dict[str, FileEntry] = {}
        for path, sha, size, mode in out["files"]:
            try:
                check_relpath(path)
            except ValueError as exc:
                raise TransportError(f"{name}: the host reported an unsafe path {path!r}") from exc
            remote[path] = FileEntry(path, sha, int(size), int(mode))

        try:
            old = Manifest.load(mirror.manifest_path).files if mirror.exists() else {}
        except StateError:
            old = {}   # a damaged manifest: fetch everything again, which repairs it
        result = SnapshotResult(mirror=mirror)
        want: list[str] = []
        for path, entry in sorted(remote.items()):
            prev = old.get(path)
            local = mirror.tree / path
            if prev is not None and prev.sha256 == entry.sha256 and _size(local) == entry.size:
                result.unchanged += 1
                if prev.mode != entry.mode:
                    _chmod_local(local, entry.mode)
            else:
                want.append(path)

        if want:
            res = run_script(transport, info.interpreter, "probe", "tar",
                             {"site_packages": info.site_packages,
                              **({"compress": "gz"} if compress else {})},
                             stdin=json.dumps(want).encode(), sudo=sudo, timeout=timeout)
            _check_tar(name, res)
            result.bytes_fetched = _extract(name, res.stdout, want, remote, mirror.tree)
        result.fetched = want

        for path in sorted(set(old) - set(remote)):
            result.deleted.append(path)
        _prune(mirror.tree, set(remote))

        manifest = Manifest(source=f"host:{name}", sglang_version=info.sglang_version,
                            site_packages=info.site_packages, files=remote,
                            created=datetime.now(timezone.utc).isoformat(timespec="seconds"))
        manifest.save(mirror.manifest_path)
    result.round_trips = transport.round_trips - trips0
    result.seconds = time.monotonic() - t0
    return result


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


def _size(path: Path) -> int | None:
    try:
        st = path.lstat()
    except OSError:
        return None
    return st.st_size if path.is_file() and not path.is_symlink() else None


def _chmod_local(path: Path, mode: int) -> None:
    # keep our copy owner-read/writable whatever the host's mode; the real mode is in the manifest
    os.chmod(path, (mode & 0o777) | 0o600)


def _extract(host: str, stream: bytes, want: list[str], remote: dict[str, FileEntry],
             tree: Path) -> int:
    """Unpack ``stream`` (tar, optionally gzip) into ``tree``; returns bytes written."""
    wanted = set(want)
    got: set[str] = set()
    total = 0
    tree.mkdir(parents=True, exist_ok=True)
    troot = os.path.realpath(tree)
    safe_dirs: set[Path] = set()
    try:
        tar = tarfile.open(fileobj=io.BytesIO(stream), mode="r:*")
    except tarfile.TarError as exc:
        raise TransportError(f"{host}: the snapshot's tar stream is unreadable ({exc})") from exc
    with tar:
        try:
            for member in tar:
                name = member.name
                try:
                    check_relpath(name)
                except ValueError:
                    raise TransportError(f"{host}: refusing tar member {name!r} (unsafe path)") from None
                if not member.isreg():
                    raise TransportError(f"{host}: refusing tar member {name!r} (not a regular file)")
                if name not in wanted or name in got:
                    raise TransportError(f"{host}: refusing tar member {name!r} (not requested)")
                dest = tree / name
                parent = dest.parent
                if parent not in safe_dirs:
                    parent.mkdir(parents=True, exist_ok=True)
                    real = os.path.realpath(parent)
                    if real != troot and not real.startswith(troot + os.sep):
                        raise TransportError(
                            f"{host}: refusing tar member {name!r} (escapes the mirror)")
                    safe_dirs.add(parent)
                src = tar.extractfile(member)
                assert src is not None
                tmp = dest.with_name(f".{dest.name}.sglpatch-tmp")
                h = hashlib.sha256()
                with open(tmp, "wb") as f:
                    while block := src.read(1 << 20):
                        h.update(block)
                        f.write(block)
                if h.hexdigest() != remote[name].sha256:
                    tmp.unlink()
                    raise StateError(f"{host}: {name} changed on the host during the snapshot",
                                     hint="run the snapshot again once nothing is writing to the install")
                _chmod_local(tmp, remote[name].mode)
                if dest.is_symlink() or dest.is_dir():
                    raise TransportError(f"{host}: mirror path {dest} is not a regular file; "
                                         "delete the mirror and snapshot again")
                os.replace(tmp, dest)
                got.add(name)
                total += member.size
        except tarfile.TarError as exc:
            raise TransportError(f"{host}: the snapshot's tar stream is corrupt ({exc})") from exc
    missing = wanted - got
    if missing:
        raise TransportError(f"{host}: the snapshot's tar stream lacks {len(missing)} file(s), "
                             f"e.g. {sorted(missing)[0]}", hint="run the snapshot again")
    return total


def _prune(tree: Path, keep: set[str]) -> None:
    """Delete every file under ``tree`` not in ``keep`` (and leftovers), then empty directories."""
    if not tree.exists():
        return
    for dirpath, dirnames, filenames in os.walk(tree, topdown=False):
        for fn in filenames:
            full = os.path.join(dirpath, fn)
            rel = os.path.relpath(full, tree).replace(os.sep, "/")
            if rel not in keep:
                os.unlink(full)
        for dn in dirnames:
            full = os.path.join(dirpath, dn)
            if os.path.islink(full):
                os.unlink(full)
            else:
                try:
                    os.rmdir(full)
                except OSError:
                    pass  # not empty
