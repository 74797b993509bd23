"""Whether this user may change a path on the host, and why not: the one test behind ``hosts
--check``'s writable column (the probe walks the install with :func:`dir_problem` and
:func:`replace_problem`, and checks the state dir with :func:`state_dir_problem`) and behind
apply's refusal before anything is written (the deploy agent's ``inspect`` reports, and its ``push``
refuses, what :func:`write_problem` and :func:`attr_problem` find for every touched file).

Standard library only, and no import of the other host-side modules: it is joined into both
host-side scripts (:func:`sglang_patcher.remote.bundle.script_source`), ahead of their own code.

A problem is ``(kind, why)``: ``kind`` one of ``immutable``, ``append_only`` (the inode flags
``chattr +i`` / ``chattr +a`` set: not even root may rename over, unlink or rewrite such a file, nor
add or remove entries of such a directory), ``read_only`` (a read-only filesystem), ``permission``
(the mode bits and owner refuse this user) or ``owner`` (a replaced file's owner or group this user
could not give it); ``why`` the words that follow a path ("is immutable
(chattr +i)"). Nothing here raises: a fact that cannot be read is left out.
"""

import os
import stat
import struct

# FS_IOC_GETFLAGS = _IOR('f', 1, long), as lsattr(1) reads the flags; the kernel writes an int
_LONG = struct.calcsize("l")
_GETFLAGS = (2 << 30) | (_LONG << 16) | (ord("f") << 8) | 1
_IMMUTABLE_FL = 0x10
_APPEND_FL = 0x20
_EFFECTIVE = os.access in getattr(os, "supports_effective_ids", ())


def user_name(uid):
    """The login name of ``uid`` (its number when it has none)."""
    try:
        import pwd
        return pwd.getpwuid(uid).pw_name
    except (ImportError, KeyError):
        return str(uid)


def inode_flags(path):
    """The inode flags of a regular file or directory (``lsattr``), or None where they cannot be
    read (a filesystem without them, a path this user cannot open, not Linux). Never follows a link
    and never opens anything but a regular file or a directory."""
    try:
        import fcntl
        st = os.lstat(path)
        if not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)):
            return None
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOFOLLOW", 0)
                     | getattr(os, "O_NOCTTY", 0))
    except (ImportError, OSError):
        return None
    try:
        buf = bytearray(_LONG)
        fcntl.ioctl(fd, _GETFLAGS, buf, True)
        return struct.unpack_from("i", bytes(buf))[0]
    except (OSError, ValueError):
        return None
    finally:
        os.close(fd)


def attr_problem(path):
    """``(kind, why)`` when ``path`` is immutable or append-only (its inode flags), else None."""
    flags = inode_flags(path)
    if flags is None:
        return None
    if flags & _IMMUTABLE_FL:
        return ("immutable", "is immutable (chattr +i)")
    if flags & _APPEND_FL:
        return ("append_only", "is append-only (chattr +a)")
    return None


def write_problem(path, search=False):
    """Why this user cannot change ``path`` in place — write the file, or add and remove the
    directory's entries (``search``: and enter it) — as ``(kind, why)``; None when it can. One
    ``access`` call when it can; the reason is looked for only when that refuses (the probe asks
    this of every file of an install)."""
    if os.access(path, os.W_OK | (os.X_OK if search else 0), effective_ids=_EFFECTIVE):
        return None
    flag = attr_problem(path)
    if flag is not None:
        return flag
    try:
        if os.statvfs(path).f_flag & os.ST_RDONLY:
            return ("read_only", "is on a read-only filesystem")
    except (OSError, AttributeError):
        pass
    me = user_name(os.geteuid())
    try:
        st = os.stat(path)
    except OSError as exc:
        return ("permission", "cannot be checked by %s (%s)" % (me, exc.strerror))
    return ("permission", "is not writable by %s (owner %s, mode %04o)"
            % (me, user_name(st.st_uid), stat.S_IMODE(st.st_mode)))


def dir_problem(path):
    """``(kind, why)`` when this user cannot add, replace and remove entries of the directory
    ``path``, else None: its flags first (an append-only directory passes ``access``)."""
    return attr_problem(path) or write_problem(path, search=True)


def nearest_existing(path):
    """``path`` or, while it does not exist, the nearest directory above it that does."""
    while not os.path.exists(path):
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return path


def state_dir_problem(state):
    """``(checked, kind, why)`` when this user cannot write the state dir ``state`` — or, while it
    does not exist, the nearest directory above it that does (where it would be made) — else None:
    :func:`dir_problem` of that directory. The deploy agent's preflight refuses a push or a rollback
    by it; ``hosts --check`` reports it (the probe is given the host's ``state_dir``)."""
    checked = nearest_existing(state)
    problem = dir_problem(checked)
    return None if problem is None else (checked, problem[0], problem[1])


def replace_problem(path):
    """``(kind, why)`` when this user cannot replace the regular file ``path`` as apply does —
    a new file renamed over it, with its owner and group kept — else None. Its mode bits do not
    matter (a 0444 file is replaced all the same); its directory's problem is
    :func:`dir_problem`'s. Kinds: ``immutable``, ``append_only`` or ``owner`` (a file of another
    user, or of a group this user is not in, when not root). An ``lstat`` and the inode flags'
    ioctl: the probe asks this of every file of an install (~5,000 for SGLang: tens of ms)."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    euid = os.geteuid()
    if euid != 0:
        if st.st_uid != euid:
            return ("owner", "is owned by %s: as %s its owner cannot be kept"
                    % (user_name(st.st_uid), user_name(euid)))
        if st.st_gid not in set(os.getgroups()) | {os.getegid()}:
            return ("owner", "has group %d, which %s is not in: its group cannot be kept"
                    % (st.st_gid, user_name(euid)))
    return attr_problem(path)     # access() passes an append-only file: the flags are read
