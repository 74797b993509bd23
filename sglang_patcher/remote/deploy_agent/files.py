"""Files on the host: hashing, facts about a path, the atomic write (a temp file beside the target,
fsync, rename, fsync the directory), staging a file beside its target and verifying it, purging
stale bytecode, and reading an uploaded payload tar."""

from __future__ import annotations

import hashlib
import json
import os
import stat
import tarfile

from ..access import nearest_existing
from .base import Fail, crash_point

_CHUNK = 1 << 20


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            block = f.read(_CHUNK)
            if not block:
                break
            h.update(block)
    return h.hexdigest()


def fsync_dir(path):
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_atomic(path, data, mode=0o644):
    """Write ``data`` to ``path`` via a temp file in the same dir, fsync, rename, fsync the dir."""
    d = os.path.dirname(path)
    os.makedirs(d, exist_ok=True)
    tmp = os.path.join(d, ".%s.tmp-%d" % (os.path.basename(path), os.getpid()))
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(d)


def write_json(path, obj):
    write_atomic(path, (json.dumps(obj, indent=1, sort_keys=True) + "\n").encode())


def read_json(path):
    try:
        with open(path, "rb") as f:
            return json.loads(f.read().decode("utf-8"))
    except FileNotFoundError:
        return None
    except ValueError:
        return {"unreadable": True, "path": path}


def file_info(path):
    """Live facts about one path (never follows a symlink for the type)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return {"exists": False, "sha256": None}
    info = {"exists": True, "size": st.st_size, "mode": stat.S_IMODE(st.st_mode), "uid": st.st_uid,
            "gid": st.st_gid, "nlink": st.st_nlink, "inode": st.st_ino}
    if stat.S_ISREG(st.st_mode):
        info["type"] = "file"
        info["sha256"] = sha256_file(path)
    else:
        info["type"] = "symlink" if stat.S_ISLNK(st.st_mode) else "other"
        info["sha256"] = None
    return info


def dir_facts(path):
    base = nearest_existing(path)
    try:
        vfs = os.statvfs(base)
        free = vfs.f_bavail * vfs.f_frsize
    except OSError:
        free = None
    try:
        dev = os.stat(base).st_dev
    except OSError:
        dev = None
    writable = os.access(base, os.W_OK | os.X_OK, effective_ids=os.access in os.supports_effective_ids)
    return {"path": path, "checked": base, "free_bytes": free, "writable": writable, "dev": dev,
            "exists": os.path.isdir(path)}


def remove_quiet(path):
    try:
        os.unlink(path)
        return True
    except FileNotFoundError:
        return False


def stage_file(tmp, data, sha, uid, gid, mode, crash_n=None):
    """Write ``data`` to ``tmp`` (O_EXCL), fsync, verify its sha256, set owner then mode."""
    try:
        os.unlink(tmp)
    except FileNotFoundError:
        pass
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        if crash_n is not None and os.environ.get("SGLPATCH_AGENT_CRASH") == "partial:%d" % crash_n:
            f.write(data[: len(data) // 2])
            f.flush()
            os.fsync(f.fileno())
            crash_point("partial", crash_n)
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    got = sha256_file(tmp)
    if got != sha:
        os.unlink(tmp)
        raise Fail("verify_failed", "staged %s has sha256 %s, expected %s" % (tmp, got, sha))
    st = os.stat(tmp)
    if uid is not None and gid is not None and (st.st_uid, st.st_gid) != (uid, gid):
        os.chown(tmp, uid, gid)
    os.chmod(tmp, mode)


def purge_bytecode(path):
    """Remove ``__pycache__/<stem>.<tag>[.opt-N].pyc`` for the module at ``path``. Returns removed."""
    if not path.endswith(".py"):
        return []
    d, name = os.path.split(path)
    stem = name[:-3]
    cache = os.path.join(d, "__pycache__")
    removed = []
    try:
        entries = os.listdir(cache)
    except (FileNotFoundError, NotADirectoryError):
        return removed
    for e in entries:
        if not (e.startswith(stem + ".") and e.endswith(".pyc")):
            continue
        rest = e[len(stem) + 1:].split(".")
        if len(rest) == 2 or (len(rest) == 3 and rest[1].startswith("opt-")):
            try:
                os.unlink(os.path.join(cache, e))
                removed.append(e)
            except FileNotFoundError:
                pass
    return removed


def read_payload(stream, wanted):
    """Read the tar on ``stream``; return {path: bytes}; every wanted path present with its hash."""
    out = {}
    try:
        with tarfile.open(fileobj=stream, mode="r|") as tf:
            for m in tf:
                if not m.isfile():
                    raise Fail("bad_payload", "payload member %s is not a regular file" % m.name)
                if m.name not in wanted:
                    raise Fail("bad_payload", "payload has %s, which the deployment does not write" % m.name)
                f = tf.extractfile(m)
                out[m.name] = f.read()
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise Fail("bad_payload", "the uploaded tar is incomplete or corrupt (%s); nothing was written"
                   % exc)
    for path, sha in wanted.items():
        if path not in out:
            raise Fail("bad_payload", "the uploaded tar lacks %s; nothing was written" % path)
        got = hashlib.sha256(out[path]).hexdigest()
        if got != sha:
            raise Fail("bad_payload", "uploaded %s has sha256 %s, expected %s; nothing was written"
                       % (path, got, sha))
    return out
