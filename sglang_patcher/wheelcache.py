"""The pristine tree of an SGLang release, from its PyPI wheel (no SSH, no install).

``pristine_tree(version)`` downloads ``sglang==version`` once with ``pip download --no-deps
--only-binary=:all:`` (the interpreter running sglpatch, so pip's own configuration, index and cache
apply) into ``sglpatch_home()/wheels/``, extracts ``sglang/**`` and the ``sglang-<v>.dist-info/``
directory into ``wheels/sglang-<v>/tree/``, checks every extracted file against the wheel's RECORD
(sha256, and that RECORD and the wheel list the same files), and writes ``wheels/sglang-<v>/manifest.json``.
``__pycache__/`` and ``*.pyc`` are left out, as in host mirrors.

Crash safety: the tree and its manifest are built in a temporary sibling directory
(``wheels/.sglang-<v>.tmp-<pid>-<rand>/``), flushed, and renamed into place in one step; a directory
``wheels/sglang-<v>/`` therefore always holds a verified tree with its manifest. Temporary directories
of dead processes are removed on the next call. Downloads go to a temporary directory too, so a
half-downloaded wheel is never taken for a cached one.

Errors: a version that is not on PyPI (or has no wheel for this Python/platform), a pip failure, a
corrupt wheel or a RECORD mismatch raise :class:`PatchsetError` with the reason and what to do; an
index that lists no sglang release at all (unreachable, or the wrong one) raises
:class:`TransportError` (exit 5), since no version could be found there.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import subprocess
import sys
import zipfile
import zlib
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path, PurePosixPath

from packaging.tags import sys_tags
from packaging.utils import InvalidWheelFilename, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from .errors import PatchsetError, StateError, TransportError
from .manifest import FileEntry, Manifest, read_record, sha256_bytes, sha256_file
from .piprun import run_pip
from .progress import SILENT, Meter, Task
from .state import safe_component, sglpatch_home

__all__ = ["WheelTree", "pristine_tree", "tree_from_wheel", "wheels_dir"]

PIP_TIMEOUT_S = 1800


@dataclass
class WheelTree:
    """A verified pristine tree: ``root`` (``wheels/sglang-<v>/``) holding ``tree/`` and ``manifest.json``.

    ``manifest`` lists every file (site-packages-relative posix path, sha256, size, mode).
    ``read(path)`` returns its bytes, or None for a path the release does not have.
    """

    version: str
    root: Path
    manifest: Manifest

    @property
    def tree(self) -> Path:
        return self.root / "tree"

    def path_of(self, path: str) -> Path:
        """The local file of site-packages-relative ``path`` (not checked for existence)."""
        return self.tree / _safe_rel(path)

    def read(self, path: str) -> bytes | None:
        """Bytes of ``path`` (site-packages-relative posix), None when the release has no such file.

        Raises PatchsetError (exit 3, like a wheel that fails its RECORD) when the cached file is
        missing or no longer has its manifest sha256 (the cache was edited: ``sglpatch patchset tree VERSION`` re-verifies and rebuilds it)."""
        entry = self.manifest.files.get(_safe_rel(path))
        if entry is None:
            return None
        fix = (f"`sglpatch patchset tree {self.version}` re-verifies the cache and rebuilds it from the "
               f"wheel (or delete {self.root})")
        try:
            data = self.path_of(path).read_bytes()
        except OSError as exc:
            raise PatchsetError(f"{self.root}: the cached pristine tree of sglang {self.version} lacks {path} "
                             f"({exc.strerror})", hint=fix) from exc
        if sha256_bytes(data) != entry.sha256:
            raise PatchsetError(f"{self.path_of(path)}: the cached pristine tree of sglang {self.version} was "
                             f"modified (sha256 {sha256_bytes(data)[:12]}, the release file has {entry.sha256[:12]})",
                             hint=fix)
        return data

    def verify(self) -> list[str]:
        """Re-hash every file; returns the paths that no longer match the manifest (empty: intact)."""
        bad = []
        for path, entry in self.manifest.files.items():
            f = self.path_of(path)
            if not f.is_file() or sha256_file(f) != entry.sha256:
                bad.append(path)
        return bad


def wheels_dir(home: Path | None = None) -> Path:
    """``<home>/wheels`` (home defaults to :func:`sglpatch_home`)."""
    return Path(home if home is not None else sglpatch_home()) / "wheels"


def _check_version(version: str) -> str:
    try:
        parsed = Version(version)
        canon = str(parsed)
    except InvalidVersion:
        raise PatchsetError(f"{version!r} is not a valid SGLang version", hint="e.g. 0.5.23") from None
    if not re.match(r"^[0-9A-Za-z.+!-]+$", version):
        raise PatchsetError(f"{version!r} is not a valid SGLang version", hint="e.g. 0.5.23")
    rel = list(parsed.release)
    while len(rel) > 3 and rel[-1] == 0:  # 0.5.23.00 is 0.5.23 (PEP 440 pads with zeros)
        rel.pop()
    if len(rel) < len(parsed.release) and parsed.epoch == 0:  # keep any .postN / .devN / +local
        canon = ".".join(map(str, rel)) + canon[len(".".join(map(str, parsed.release))):]
    if canon != version:  # v0.5.23, 0.5.23-rc1, 0.5.23.00: the same release written another way
        raise PatchsetError(f"sglang {version!r} is written {canon} by PyPI: write it as {canon}",
                            hint=f"e.g. `sglpatch patchset tree {canon}`")
    return version


def _safe_rel(path: str) -> str:
    p = PurePosixPath(path)
    if not path or p.is_absolute() or ".." in p.parts or "\\" in path:
        raise PatchsetError(f"unsafe path {path!r}", hint="paths are relative to site-packages")
    return str(p)


def pristine_tree(version: str, home: Path | None = None, *, verify: bool = False,
                  log=lambda msg: None, meter: Meter = SILENT) -> WheelTree:
    """The verified pristine tree of ``sglang==version``, downloading and extracting it once.

    ``home`` defaults to :func:`sglpatch_home`. The first call downloads (~40 MB for 0.5.23) and
    extracts (~6,400 files); later calls read ``manifest.json`` only (each file read is checked
    against it), or with ``verify`` re-hash every file (~40 MB). A cache whose ``tree/`` is gone, or
    that ``verify`` finds modified, is rebuilt from the cached wheel (``log`` says so). Raises
    :class:`PatchsetError` for an unknown version, a pip failure or a wheel that does not match
    its RECORD. ``meter`` shows the download (bytes, rate) and the extraction (files).
    """
    _check_version(version)
    wheels = wheels_dir(home)
    final = wheels / f"sglang-{safe_component(version)}"
    if (final / "manifest.json").is_file():
        try:
            tree = _open(final, version)
        except (StateError, PatchsetError) as exc:  # an unreadable or foreign manifest: the cache is ours
            log(f"{final}: its manifest is damaged ({exc.message}): rebuilding it from the wheel")
            bad = ["manifest.json"]
        else:
            bad = ["tree/"] if not tree.tree.is_dir() else (tree.verify() if verify else [])
            if not bad:
                return tree
            log(f"{final}: {len(bad)} cached file(s) missing or modified ({', '.join(bad[:3])}"
                f"{', …' if len(bad) > 3 else ''}): rebuilding it from the wheel")
        shutil.rmtree(final)
    wheels.mkdir(parents=True, exist_ok=True)
    _clean_stale(wheels)
    if final.exists():
        if (final / "manifest.json").is_file():   # another process published it meanwhile
            return _open(final, version)
        shutil.rmtree(final)      # a directory without manifest was never published by us: discard
    whl = _cached_wheel(wheels, version)
    if whl is None:
        with meter.task(f"download sglang=={version}") as task:
            task.note("pip download")
            whl = _download(version, wheels, task)
    named = whl.name.split("-")[1]   # the release as its wheel writes it
    if named != version:             # equal as versions (1.0 == 1.0.0): one tree per release
        raise PatchsetError(f"sglang {version!r} is release {named} (its wheel {whl.name}): write it as {named}",
                            hint=f"e.g. `sglpatch patchset tree {named}`")
    try:
        return tree_from_wheel(whl, version, final, meter=meter)
    except PatchsetError as exc:
        whl.unlink(missing_ok=True)   # never keep a wheel that failed verification
        raise PatchsetError(f"{exc.message} (the cached wheel {whl.name} was removed)",
                            hint="run the command again to download it afresh") from exc


def _open(final: Path, version: str) -> WheelTree:
    manifest = Manifest.load(final / "manifest.json")
    if manifest.sglang_version != version:
        raise PatchsetError(f"{final}: manifest is for sglang {manifest.sglang_version}, not {version}",
                            hint=f"delete {final} and run again")
    return WheelTree(version, final, manifest)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _clean_stale(wheels: Path) -> None:
    """Remove temporary build/download directories left by processes that no longer run."""
    for d in wheels.iterdir():
        m = re.match(r"^\..*\.(?:tmp|download)-(\d+)-[0-9a-f]+$", d.name)
        if m and d.is_dir() and not _pid_alive(int(m.group(1))):
            shutil.rmtree(d, ignore_errors=True)


def _cached_wheel(wheels: Path, version: str) -> Path | None:
    tags = set(sys_tags())
    want = Version(version)
    for whl in sorted(wheels.glob("sglang-*.whl")):
        try:
            name, ver, _, wtags = parse_wheel_filename(whl.name)
        except InvalidWheelFilename:
            continue
        if name == "sglang" and ver == want and wtags & tags:
            return whl
    return None


def _download(version: str, wheels: Path, task: Task | None = None) -> Path:
    tmp = wheels / f".sglang-{safe_component(version)}.download-{os.getpid()}-{secrets.token_hex(4)}"
    tmp.mkdir(parents=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--disable-pip-version-check", "--no-input", "-d", str(tmp), f"sglang=={version}"]
    try:
        try:
            proc = run_pip(cmd, task=task or Task("pip", None, None), timeout=PIP_TIMEOUT_S)
        except subprocess.TimeoutExpired as exc:
            raise PatchsetError(f"pip download sglang=={version} did not finish in {PIP_TIMEOUT_S} s",
                                hint="check the network / index configuration (pip config list)") from exc
        if proc.returncode != 0:
            out = (proc.stderr or "") + (proc.stdout or "")
            if "No matching distribution found" in out or "Could not find a version" in out:
                m = re.search(r"\(from versions: ([^)]*)\)", out)
                known = [v.strip() for v in m.group(1).split(",")] if m else []
                if known in ([], ["none"]):  # sglang has many releases: pip reached no index that has them
                    net = [ln.strip() for ln in out.splitlines()
                           if re.search(r"Connection|connection|resolution|Name or service|Proxy|SSL|timed out", ln)]
                    where = [ln.strip() for ln in out.splitlines() if ln.startswith(("Looking in indexes", "Looking in links"))]
                    raise TransportError(
                        f"pip listed no sglang release at all while looking for sglang=={version}: the package "
                        "index is unreachable, or configured to one without sglang"
                        + (f" ({'; '.join(where)})" if where else "") + (f" ({net[-1][:300]})" if net else ""),
                        hint="check the network and pip's index settings (`pip config list`, PIP_INDEX_URL, "
                             "a proxy); offline, PIP_FIND_LINKS can point pip at a directory holding the "
                             f"sglang-{version} wheel")
                newest = ", ".join(known[-5:])
                if task is not None:  # the progress line says it too (not "failed after 2.0 s" alone)
                    task.failed_note = f"sglang {version} is not available (newest releases: {newest})"
                raise PatchsetError(  # other releases are listed: this one is missing
                    f"sglang release {version} is not available: sglang=={version} is not on PyPI (or has "
                    f"no wheel for Python {sys.version_info.major}.{sys.version_info.minor} on this "
                    f"platform); the newest releases there: {newest}",
                    hint=f"name a released version instead of {version} (e.g. {known[-1]}; all of them: "
                         "https://pypi.org/project/sglang/#history) and run the command again")
            lines = [ln for ln in out.strip().splitlines() if ln.strip()][-8:]
            raise PatchsetError(f"pip download sglang=={version} failed (exit {proc.returncode}):\n    "
                                + "\n    ".join(lines),
                                hint="check the network / index configuration (pip config list)")
        found = sorted(tmp.glob("sglang-*.whl"))
        if len(found) != 1:
            raise PatchsetError(f"pip download sglang=={version} produced {len(found)} sglang wheels in {tmp}")
        dest = wheels / found[0].name
        os.replace(found[0], dest)
        return dest
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _skip(name: str) -> bool:
    return "/__pycache__/" in f"/{name}" or name.endswith(".pyc")


def tree_from_wheel(wheel: Path, version: str, dest: Path, *, meter: Meter = SILENT) -> WheelTree:
    """Extract and verify ``sglang/**`` and the dist-info of ``wheel`` into ``dest`` (atomically).

    ``dest`` must not exist; it appears (with ``tree/`` and ``manifest.json``) only once everything
    verified. Raises :class:`PatchsetError` for a corrupt wheel, a missing or mismatching RECORD, a
    file present on one side only, an unsafe member name, or a METADATA version other than ``version``.
    """
    _check_version(version)
    where = f"wheel {wheel.name}"
    tmp = dest.parent / f".{dest.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}"
    try:
        with zipfile.ZipFile(wheel) as zf, meter.task(f"extract {wheel.name}") as task:
            infos = [i for i in zf.infolist() if not i.is_dir()]
            records = [i.filename for i in infos if re.match(r"^sglang-[^/]+\.dist-info/RECORD$", i.filename)]
            if len(records) != 1:
                raise PatchsetError(f"{where}: expected one sglang-*.dist-info/RECORD, found {len(records)}")
            dist_info = records[0].rsplit("/", 1)[0]
            record = read_record(zf.read(records[0]).decode("utf-8"))
            meta = zf.read(f"{dist_info}/METADATA").decode("utf-8", "replace")
            m = re.search(r"^Version:\s*(\S+)\s*$", meta, re.M)
            if not m or Version(m.group(1)) != Version(version):
                raise PatchsetError(f"{where}: METADATA says version {m.group(1) if m else '?'}, wanted {version}")
            wanted = [i for i in infos if (i.filename.startswith("sglang/") or i.filename.startswith(dist_info + "/"))
                      and not _skip(i.filename)]
            tree = tmp / "tree"
            tree.mkdir(parents=True)
            task.total(nbytes=sum(i.file_size for i in wanted), files=len(wanted))
            files: dict[str, FileEntry] = {}
            problems: list[str] = []
            for info in wanted:
                name = _safe_rel(info.filename)
                data = zf.read(info)                     # zipfile checks the CRC
                sha = sha256_bytes(data)
                listed = record.get(name, "missing")
                if name != records[0]:
                    if listed == "missing":
                        problems.append(f"{name}: in the wheel but not in RECORD")
                    elif listed != sha:
                        problems.append(f"{name}: sha256 {sha[:12]} but RECORD says {str(listed)[:12]}")
                mode = (info.external_attr >> 16) & 0o7777 or 0o644
                out = tree / name
                out.parent.mkdir(parents=True, exist_ok=True)
                out.write_bytes(data)
                os.chmod(out, mode)
                files[name] = FileEntry(name, sha, len(data), mode)
                task.advance(nbytes=len(data), files=1)
            for name in record:
                if (name.startswith("sglang/") or name.startswith(dist_info + "/")) and not _skip(name) \
                        and name not in files:
                    problems.append(f"{name}: in RECORD but not in the wheel")
            if problems:
                shown = problems[:10] + ([f"... and {len(problems) - 10} more"] if len(problems) > 10 else [])
                raise PatchsetError(f"{where} does not match its RECORD:\n    " + "\n    ".join(shown),
                                    hint="the download is corrupt or tampered with")
        manifest = Manifest(source=f"wheel:sglang=={version}", sglang_version=version, site_packages=None,
                            files=files, created=datetime.now(timezone.utc).isoformat(timespec="seconds"))
        manifest.save(tmp / "manifest.json")
        os.sync()                                         # the tree is durable before it is published
        try:
            os.rename(tmp, dest)
        except OSError:
            if (dest / "manifest.json").is_file():        # another process published it first
                shutil.rmtree(tmp, ignore_errors=True)
                return _open(dest, version)
            raise
        return WheelTree(version, dest, manifest)
    except (zipfile.BadZipFile, zlib.error, EOFError, NotImplementedError) as exc:
        # a bad header, a CRC mismatch, a damaged deflate stream, a member cut short, a method
        # zipfile does not know: the wheel is unusable whatever the cause
        raise PatchsetError(f"{where}: not a valid zip file ({type(exc).__name__}: {exc})") from exc
    except KeyError as exc:
        raise PatchsetError(f"{where}: missing member {exc}") from exc
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
