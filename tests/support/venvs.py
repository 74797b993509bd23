"""Real SGLang target venvs for tests: built once into a cache, cloned per session, reset per test.

A *pristine* venv (``/usr/bin/python3 -m venv`` + ``pip install --no-deps sglang==<version>``, plus
optional extra requirements) is built once under :func:`cache_root` (default
``/var/tmp/sglpatch-tests``, world-readable so a non-root SSH target user can read it; override with
``$SGLPATCH_TEST_CACHE``) and reused while its key (python, version, requirements) is the same.

Tests get a *working copy* (:func:`clone_venv`) owned by the user the target runs as. Before every
test :func:`reset_venv` makes its site-packages equal to the pristine one again: every top-level
entry that is not in the pristine copy is deleted (e.g. ``.sglpatch/``, extra ``.pth`` files); entries
whose name starts with ``sglang`` are compared deeply (type, size, mtime, mode, owner) and differing
files are copied back; other pristine entries (torch, ...) are only restored when missing. This costs
about a tenth of a second for sglang's ~10,500 files.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import stat
import subprocess
import sys
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

SGLANG_VERSION = "0.5.23"
SYSTEM_PYTHON = "/usr/bin/python3"


def cache_root() -> Path:
    return Path(os.environ.get("SGLPATCH_TEST_CACHE", "/var/tmp/sglpatch-tests"))


class TargetVenv(str):
    """The venv's interpreter path (a ``str``, usable wherever a path is expected) plus facts.

    ``venv``: the venv directory; ``site_packages``: its site-packages; ``python``: same as ``str``;
    ``pristine``: the cached venv it was cloned from; ``uid``/``gid``: its owner.
    """

    venv: Path
    site_packages: Path
    pristine: Path
    uid: int
    gid: int

    def __new__(cls, venv: Path, pristine: Path, uid: int, gid: int):
        self = super().__new__(cls, str(venv / "bin" / "python"))
        self.venv = venv
        self.site_packages = site_packages_of(venv)
        self.pristine = pristine
        self.uid, self.gid = uid, gid
        return self

    @property
    def python(self) -> str:
        return str(self)

    @property
    def package_dir(self) -> Path:
        return self.site_packages / "sglang"

    def reset(self) -> "ResetStats":
        return reset_venv(self.pristine, self.venv, self.uid, self.gid)


def site_packages_of(venv: Path) -> Path:
    found = sorted((venv / "lib").glob("python3*/site-packages"))
    if not found:
        raise RuntimeError(f"{venv}: no lib/python3*/site-packages")
    return found[0]


@contextmanager
def locked(path: Path):
    """An exclusive flock on ``path`` (created) for the ``with`` body: one builder at a time."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _python_for_venvs() -> str:
    if os.access(SYSTEM_PYTHON, os.X_OK):
        return SYSTEM_PYTHON
    if os.geteuid() != 0:
        return sys.executable    # not root: our own interpreter is executable by "the target user"
    raise RuntimeError(f"{SYSTEM_PYTHON} is missing; install python3 and python3-venv (apt)")


def read_requirements(path: Path) -> list[str]:
    """Requirement lines of ``path`` (comments and blanks dropped); [] when it does not exist."""
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            out.append(line)
    return out


def _cached_venv(name: str, version: str, key_parts: tuple, build: Callable[[Path, dict[str, str]], str]) -> Path:
    """The cache entry ``<cache>/<name>-<version>-<hash of key_parts>``: returned as it is when
    complete, else made now under the cache lock by ``build(dest, env)`` (``env``: this process's
    environment without PYTHONPATH/VIRTUAL_ENV; it returns the text of the completion marker), then
    sealed readable for everyone and marked complete. Whatever ``build`` raises propagates; a
    half-made entry is rebuilt from scratch next time."""
    key = hashlib.sha256(repr(key_parts).encode()).hexdigest()[:12]
    root = cache_root()
    dest = root / f"{name}-{version}-{key}"
    done = dest / ".sglpatch-complete"
    if done.exists():
        return dest
    with locked(root / ".lock"):
        if done.exists():
            return dest
        os.chmod(root, 0o755)
        if dest.exists():
            shutil.rmtree(dest)
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        marker = build(dest, env)
        _seal(dest)
        done.write_text(marker)
    return dest


def pristine_venv(name: str = "sglang", extra: list[str] | None = None,
                  version: str = SGLANG_VERSION, *, fingerprint: str = "",
                  post_install: Callable[[str, dict[str, str]], None] | None = None) -> Path:
    """The cached pristine venv (built now if missing); see the module doc.

    ``fingerprint``: part of the cache key (e.g. a hash of local packages ``post_install`` puts
    in); ``post_install(python, env)``: runs after the pip installs, before the venv is sealed.
    """
    py = _python_for_venvs()
    extra = list(extra or [])
    key_parts = (py, version, extra, 1) if not fingerprint else (py, version, extra, 1, fingerprint)

    def build(dest: Path, env: dict[str, str]) -> str:
        subprocess.run([py, "-m", "venv", str(dest)], check=True, capture_output=True, env=env)
        vpy = str(dest / "bin" / "python")
        pip(vpy, ["install", "--no-deps", f"sglang=={version}"], env)
        if extra:
            pip(vpy, ["install", *extra], env)
        if post_install is not None:
            post_install(vpy, env)
        return f"{version} {extra}\n"

    return _cached_venv(name, version, key_parts, build)


def release_swap_venv(base: Path, version: str, name: str) -> Path:
    """The cached pristine venv that is the pristine venv ``base`` with ``sglang==version`` in
    place of its SGLang (built now if missing): for another release with the same dependency set.
    Every other package is a hard link to ``base``'s files (see :func:`clone_venv`), so it builds
    in seconds instead of a second pip install of the whole set. RuntimeError when pip fails."""
    def build(dest: Path, env: dict[str, str]) -> str:
        clone_venv(base, dest, share_deps=True)
        (dest / ".sglpatch-complete").unlink(missing_ok=True)     # base's marker, copied
        pip(str(dest / "bin" / "python"), ["install", "--no-deps", f"sglang=={version}"], env)
        return f"{version} from {base.name}\n"

    return _cached_venv(name, version, (str(base), version, 1), build)


def _seal(dest: Path) -> None:
    """Everyone may read the venv (the SSH test user runs it)."""
    _add_mode(dest, dirs=0o755, files=0o444)


def _add_mode(root: Path, *, dirs: int, files: int = 0) -> None:
    """OR ``dirs`` into the mode of every directory below ``root`` and ``files`` into every file's
    (symlinks untouched)."""
    for dirpath, dirnames, filenames in os.walk(root):
        for names, bits in ((dirnames, dirs), (filenames, files)):
            for n in names if bits else ():
                p = os.path.join(dirpath, n)
                if not os.path.islink(p):
                    os.chmod(p, os.stat(p).st_mode | bits)


def pip(vpy: str, args: list[str], env: dict[str, str]) -> None:
    """Run pip of the venv interpreter ``vpy``; RuntimeError with its output tail on failure."""
    proc = subprocess.run([vpy, "-m", "pip", "--disable-pip-version-check", "-q", *args],
                          capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"pip {' '.join(args)} failed ({proc.returncode}):\n"
                           f"{(proc.stdout + proc.stderr)[-3000:]}")


def _chown_tree(root: Path, uid: int, gid: int) -> None:
    if os.geteuid() != 0:
        return
    os.lchown(root, uid, gid)
    for dirpath, dirnames, filenames in os.walk(root):
        for n in dirnames + filenames:
            os.lchown(os.path.join(dirpath, n), uid, gid)


def clone_venv(pristine: Path, dest: Path, uid: int | None = None, gid: int | None = None, *,
               share_deps: bool = False) -> TargetVenv:
    """A fresh working copy of ``pristine`` at ``dest`` owned by ``uid:gid`` (default: us).

    ``share_deps``: site-packages entries other than ``sglang*`` (torch, ...) are hard links to the
    pristine files (same filesystem; copies otherwise) and keep the pristine owner, so a 1.3 GB L1
    venv clones in a second. Tests must not write into those (sglpatch only touches sglang).
    """
    uid = os.geteuid() if uid is None else uid
    gid = os.getegid() if gid is None else gid
    if dest.exists():
        _make_writable(dest)
        shutil.rmtree(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    src_sp = site_packages_of(pristine)

    def skip_site_packages(d: str, names: list[str]) -> list[str]:
        return names if Path(d) == src_sp else []

    shutil.copytree(pristine, dest, symlinks=True, ignore=skip_site_packages)
    _chown_tree(dest, uid, gid)
    dst_sp = dest / src_sp.relative_to(pristine)
    for e in os.scandir(src_sp):
        target = dst_sp / e.name
        if share_deps and not e.name.startswith("sglang"):
            if e.is_dir(follow_symlinks=False):
                shutil.copytree(e.path, target, symlinks=True, copy_function=_link_or_copy)
            elif e.is_symlink():
                os.symlink(os.readlink(e.path), target)
            else:
                _link_or_copy(e.path, str(target))
        else:
            _copy_entry(e.path, str(target), uid, gid, ResetStats())
    return TargetVenv(dest, pristine, uid, gid)


def _link_or_copy(src: str, dst: str) -> str:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)
    return dst


def remove_venv(venv: Path, *, background: bool = False) -> None:
    """Delete a working copy (its directories made writable first). ``background``: rename it
    aside and let a detached ``rm`` finish the job, so a session teardown does not wait for it."""
    if not venv.exists():
        return
    if background:
        trash = venv.with_name(f"{venv.name}.trash")
        try:
            os.rename(venv, trash)
        except OSError:
            trash = venv
        subprocess.Popen(["sh", "-c", 'find "$1" -type d -exec chmod u+rwx {} + ; rm -rf "$1"',
                          "sh", str(trash)], start_new_session=True,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return
    _make_writable(venv)
    shutil.rmtree(venv, ignore_errors=True)


def remove_stale_clones(parent: Path, prefix: str) -> None:
    """Delete ``parent/<prefix>-<pid>`` working copies whose pytest process is gone."""
    if not parent.is_dir():
        return
    for d in parent.glob(f"{prefix}-*"):
        pid = d.name.removesuffix(".trash").rsplit("-", 1)[-1]
        if pid.isdigit() and (d.name.endswith(".trash") or not _alive(int(pid))):
            remove_venv(d, background=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _make_writable(root: Path) -> None:
    _add_mode(root, dirs=0o700)


@dataclass
class ResetStats:
    copied: int = 0
    removed: int = 0


def _same(a: os.stat_result, b: os.stat_result, check_owner: tuple[int, int] | None) -> bool:
    if stat.S_IFMT(a.st_mode) != stat.S_IFMT(b.st_mode):
        return False
    if stat.S_ISDIR(a.st_mode):
        return stat.S_IMODE(a.st_mode) == stat.S_IMODE(b.st_mode)
    if (a.st_size, a.st_mtime_ns, stat.S_IMODE(a.st_mode)) != (b.st_size, b.st_mtime_ns,
                                                              stat.S_IMODE(b.st_mode)):
        return False
    if check_owner and (b.st_uid, b.st_gid) != check_owner:
        return False
    return True


def _remove(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        _make_writable(Path(path))
        os.chmod(path, os.stat(path).st_mode | 0o700)
        shutil.rmtree(path)
    else:
        try:
            os.unlink(path)
        except PermissionError:
            os.chmod(os.path.dirname(path), os.stat(os.path.dirname(path)).st_mode | 0o700)
            os.unlink(path)


def _copy_entry(src: str, dst: str, uid: int, gid: int, stats: ResetStats) -> None:
    if os.path.islink(src):
        os.symlink(os.readlink(src), dst)
    elif os.path.isdir(src):
        shutil.copytree(src, dst, symlinks=True)
        _chown_tree(Path(dst), uid, gid)
        stats.copied += 1
        return
    else:
        shutil.copy2(src, dst)
    if os.geteuid() == 0:
        os.lchown(dst, uid, gid)
    stats.copied += 1


def _sync(src: str, dst: str, uid: int, gid: int, stats: ResetStats) -> None:
    """Make directory ``dst`` equal to ``src`` (recursively)."""
    owner = (uid, gid) if os.geteuid() == 0 else None
    s_entries = {e.name: e for e in os.scandir(src)}
    try:
        d_entries = {e.name: e for e in os.scandir(dst)}
    except FileNotFoundError:
        d_entries = {}
    for name, de in d_entries.items():
        if name not in s_entries:
            _remove(de.path)
            stats.removed += 1
    for name, se in s_entries.items():
        dpath = os.path.join(dst, name)
        sst = se.stat(follow_symlinks=False)
        de = d_entries.get(name)
        dst_st = de.stat(follow_symlinks=False) if de is not None else None
        if stat.S_ISDIR(sst.st_mode):
            if dst_st is None or not stat.S_ISDIR(dst_st.st_mode):
                if dst_st is not None:
                    _remove(dpath)
                _copy_entry(se.path, dpath, uid, gid, stats)
                continue
            if stat.S_IMODE(dst_st.st_mode) != stat.S_IMODE(sst.st_mode):
                os.chmod(dpath, stat.S_IMODE(sst.st_mode))
            if owner and (dst_st.st_uid, dst_st.st_gid) != owner:
                os.lchown(dpath, uid, gid)
            _sync(se.path, dpath, uid, gid, stats)
        elif dst_st is None or not _same(sst, dst_st, owner):
            if dst_st is not None:
                _remove(dpath)
            _copy_entry(se.path, dpath, uid, gid, stats)


def reset_venv(pristine: Path, venv: Path, uid: int | None = None,
               gid: int | None = None) -> ResetStats:
    """Make ``venv``'s site-packages equal the pristine's again (see the module doc)."""
    uid = os.geteuid() if uid is None else uid
    gid = os.getegid() if gid is None else gid
    stats = ResetStats()
    cfg_src, cfg_dst = pristine / "pyvenv.cfg", venv / "pyvenv.cfg"
    if cfg_dst.read_bytes() != cfg_src.read_bytes():     # a test may flip system-site-packages
        cfg_dst.write_bytes(cfg_src.read_bytes())
        stats.copied += 1
    src_sp, dst_sp = site_packages_of(pristine), site_packages_of(venv)
    os.chmod(dst_sp, os.stat(src_sp).st_mode & 0o7777)
    src_top = {e.name: e for e in os.scandir(src_sp)}
    for e in list(os.scandir(dst_sp)):
        if e.name not in src_top:
            _remove(e.path)
            stats.removed += 1
    for name, se in src_top.items():
        dpath = os.path.join(dst_sp, name)
        if name.startswith("sglang"):
            if se.is_dir(follow_symlinks=False):
                if os.path.lexists(dpath) and not os.path.isdir(dpath):
                    _remove(dpath)
                if not os.path.lexists(dpath):
                    _copy_entry(se.path, dpath, uid, gid, stats)
                else:
                    dst_st = os.lstat(dpath)   # the top directory's own mode and owner too
                    if stat.S_IMODE(dst_st.st_mode) != stat.S_IMODE(se.stat().st_mode):
                        os.chmod(dpath, stat.S_IMODE(se.stat().st_mode))
                    if os.geteuid() == 0 and (dst_st.st_uid, dst_st.st_gid) != (uid, gid):
                        os.lchown(dpath, uid, gid)
                    _sync(se.path, dpath, uid, gid, stats)
            else:
                st = os.lstat(dpath) if os.path.lexists(dpath) else None
                if st is None or not _same(se.stat(follow_symlinks=False), st,
                                           (uid, gid) if os.geteuid() == 0 else None):
                    if st is not None:
                        _remove(dpath)
                    _copy_entry(se.path, dpath, uid, gid, stats)
        elif not os.path.lexists(dpath):
            _copy_entry(se.path, dpath, uid, gid, stats)
    return stats
