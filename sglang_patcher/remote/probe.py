"""Host-side probe: what SGLang is installed where, file hashes, and a tar stream of files.

Runs under the HOST's interpreter, sent by :mod:`sglang_patcher.remote.launcher`; standard library
only, never ``import sglang`` (slow on a GPU host, broken on a ``--no-deps`` install). Invoked as
``sys.argv == [<source>, op, json_args]``. JSON ops print one JSON object; expected failures print
``{"ok": false, "kind": ..., "error": ...}`` and exit 3.

Ops:
  probe {record: bool=true, state_dir: null} -> interpreter facts, every visible ``sglang`` distribution, the package
      dir ``importlib.util.find_spec`` resolves (without executing it), writability (the first
      entries that stop this user's apply, each with why: ``access.dir_problem`` / ``replace_problem``;
      the state dir — ``state_dir`` or ``<site-packages>/.sglpatch``, as the deploy agent resolves
      it — by ``access.state_dir_problem``), free bytes, and
      (when exactly one distribution is visible and ``record``) its RECORD as {path: hex sha256|null}.
  hash {site_packages, dist_info, package="sglang", cache=false, racy_s=2} -> {"files": [[path, sha256, size,
      mode], ...], "cache": {"hits", "hashed"}} for ``<package>/**`` and ``<dist_info>/**`` under
      site-packages, skipping ``__pycache__/`` and ``*.pyc``; paths are posix, relative to
      site-packages; symlinks are followed. With ``cache``, a file whose (size, mtime_ns, inode,
      ctime_ns, device) equal those recorded beside its sha256 by an earlier run is stat'ed, not
      read (see :class:`HashCache`).
  tar {site_packages} + stdin JSON list of relative paths -> an uncompressed (or ``compress: "gz"``)
      tar stream on stdout holding those regular files (links dereferenced), nothing else.
  pack {site_packages, dist_info, package="sglang", cache=false, compress} -> one tar stream (a cold
      mirror in one round trip, each file read once): first the member ``@sglpatch/index.json``
      ([[path, size, mode], ...], what is about to come), then every file as ``tar`` sends it, its
      sha256 computed from the bytes sent, last ``@sglpatch/hashes.json`` (``hash``'s ``files``
      list of exactly the files sent).
"""

import base64
import csv
import hashlib
import io
import json
import os
import re
import sys
import time

from .access import dir_problem, replace_problem, state_dir_problem

EXPECTED_FAILURE_EXIT = 3


def fail(kind, error, **extra):
    out = {"ok": False, "kind": kind, "error": error}
    out.update(extra)
    sys.stdout.write(json.dumps(out) + "\n")
    sys.stdout.flush()
    sys.exit(EXPECTED_FAILURE_EXIT)


def _norm(name):
    return re.sub(r"[-_.]+", "-", name or "").lower()


def _dist_path(dist):
    # PathDistribution keeps its metadata directory in ``_path`` (a pathlib.Path); other finders
    # may not, then the location is unknown.
    p = getattr(dist, "_path", None)
    return str(p) if p is not None else None


def _read_record(text):
    out = {}
    for row in csv.reader(io.StringIO(text)):
        if not row or not row[0]:
            continue
        digest = row[1] if len(row) > 1 else ""
        if digest.startswith("sha256="):
            out[row[0]] = base64.urlsafe_b64decode(digest[7:] + "==").hex()
        else:
            out[row[0]] = None
    return out


def _distributions():
    from importlib import metadata
    seen = {}
    for dist in metadata.distributions():
        try:
            name = dist.metadata["Name"]
        except Exception:
            continue
        if _norm(name) != "sglang":
            continue
        meta_dir = _dist_path(dist)
        key = os.path.realpath(meta_dir) if meta_dir else repr(dist)
        if key in seen:
            continue  # the same directory reached twice through sys.path
        direct_url = None
        try:
            text = dist.read_text("direct_url.json")
            direct_url = json.loads(text) if text else None
        except Exception:
            direct_url = None
        editable = bool(direct_url and direct_url.get("dir_info", {}).get("editable"))
        record_text = None
        try:
            record_text = dist.read_text("RECORD")
        except Exception:
            record_text = None
        seen[key] = {
            "name": name,
            "version": dist.version,
            "metadata_dir": meta_dir,
            "location": os.path.dirname(meta_dir) if meta_dir else None,
            "dist_info": os.path.basename(meta_dir) if meta_dir else None,
            "editable": editable,
            "direct_url": direct_url,
            "has_record": record_text is not None,
            "_record": record_text,
        }
    return list(seen.values())


def _package_dir():
    import importlib.util
    try:
        spec = importlib.util.find_spec("sglang")
    except Exception as exc:  # a broken parent/finder: report, do not crash
        return None, "%s: %s" % (type(exc).__name__, exc)
    if spec is None:
        return None, None
    locs = list(spec.submodule_search_locations or [])
    if locs:
        return locs[0], None
    if spec.origin:
        return os.path.dirname(spec.origin), None
    return None, None


def _writability(package_dir, limit=20):
    """``(count, first paths, {path: why})`` of the entries of the package (its directories and
    files, bytecode left out) that stop this user's apply: a directory whose entries it cannot
    change (:func:`dir_problem`), a file it cannot replace keeping its owner (:func:`replace_problem`;
    a read-only mode alone is no problem) — the tests the deploy agent applies to the files it
    replaces and their directories."""
    bad = []
    why = {}
    count = 0
    for root, dirs, files in os.walk(package_dir):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for name in [""] + files:
            path = os.path.join(root, name) if name else root
            if name.endswith(".pyc"):
                continue
            problem = replace_problem(path) if name else dir_problem(path)
            if problem is not None:
                count += 1
                if len(bad) < limit:
                    rel = os.path.relpath(path, os.path.dirname(package_dir))
                    bad.append(rel)
                    why[rel] = problem[1]
    return count, bad, why


def op_probe(args):
    import platform
    dists = _distributions()
    package_dir, find_error = _package_dir()
    out = {
        "ok": True,
        "python_version": platform.python_version(),
        "executable": sys.executable,
        "prefix": sys.prefix,
        "base_prefix": sys.base_prefix,
        "user": _user(),
        "uid": os.getuid() if hasattr(os, "getuid") else None,
        "distributions": [{k: v for k, v in d.items() if not k.startswith("_")} for d in dists],
        "package_dir": package_dir,
        "find_spec_error": find_error,
        "record": None,
    }
    if package_dir and os.path.isdir(package_dir):
        site = os.path.dirname(package_dir)
        count, bad, why = _writability(package_dir)
        site_problem = dir_problem(site)
        # the state dir as the deploy agent resolves it (HostState), judged by the agent's rule
        state = os.path.realpath(args.get("state_dir") or os.path.join(os.path.realpath(site), ".sglpatch"))
        state_problem = state_dir_problem(state)
        out["state_dir"] = state
        out["state_dir_writable"] = state_problem is None
        out["state_dir_why"] = state_problem and ("%s%s" % ("" if state_problem[0] == state else
                                                            "(checked %s, where it would be made) " % state_problem[0],
                                                            state_problem[2]))
        out["site_packages"] = site
        out["writable"] = count == 0 and site_problem is None and state_problem is None
        out["site_packages_writable"] = site_problem is None
        out["site_packages_why"] = site_problem and site_problem[1]
        out["unwritable_count"] = count
        out["unwritable"] = bad
        out["unwritable_why"] = why
        st = os.statvfs(package_dir)
        out["free_bytes"] = st.f_bavail * st.f_frsize
    if len(dists) == 1 and args.get("record", True) and dists[0]["_record"] is not None:
        out["record"] = _read_record(dists[0]["_record"])
    return out


def _user():
    try:
        import pwd
        return pwd.getpwuid(os.getuid()).pw_name
    except Exception:
        return os.environ.get("USER")


def _sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            block = f.read(1 << 20)
            if not block:
                break
            h.update(block)
    return h.hexdigest()


# A deployment stages each new file beside its target as ".<name>.sglpatch-<deployment id>"
# (HostState.temp_for in deploy_agent/host.py) and renames it into place: such a file is never part
# of the install, and one seen while another deployment runs is gone a moment later.
_STAGED = re.compile(r"^\..+\.sglpatch-[^/]+$")


def _walk(site, top):
    """``(rel, full, stat)`` of every regular file under ``site/top`` (links to files followed,
    links to directories not entered), ``__pycache__/``, ``*.pyc`` and staged files left out; in
    sorted order. One ``stat`` per file, paths built by string (this runs on every snapshot)."""
    import stat as _stat
    base = os.path.join(site, top)
    if not os.path.isdir(base):
        return
    stack = [(base, top)]
    while stack:
        d, rel = stack.pop()
        try:
            entries = sorted(os.scandir(d), key=lambda e: e.name)
        except OSError:
            continue
        subdirs = []
        for e in entries:
            name = e.name
            try:
                if e.is_dir(follow_symlinks=False):
                    if name != "__pycache__":
                        subdirs.append((e.path, rel + "/" + name))
                    continue
                if name.endswith(".pyc") or _STAGED.match(name):
                    continue
                st = e.stat()
            except OSError:
                continue  # broken link, or gone meanwhile: not part of the install
            if _stat.S_ISREG(st.st_mode):
                yield rel + "/" + name, e.path, st
        stack.extend(reversed(subdirs))


class HashCache:
    """sha256 of files by their stat identity, kept between runs on the host (the user's cache dir,
    ``$XDG_CACHE_HOME/sglpatch`` or ``~/.cache/sglpatch``, one file per install): a file whose size,
    mtime_ns, inode, ctime_ns and device equal what was recorded beside its hash is not read
    again. ctime cannot be set back by a user, and an edit that keeps size and mtime still moves
    it. A file changed within ``RACY_NS`` before a run (timestamps are coarse) is never recorded:
    it is read again next time. A cache file another user owns (a HOME kept through sudo) is not
    believed; saving one deletes our caches of installs that no longer exist. Unreadable or
    unwritable cache: every file is read, as without."""

    RACY_NS = 2 * 10 ** 9

    def __init__(self, site, tops, enabled, racy_s=None):
        self.enabled = enabled
        self.start_ns = time.time_ns()
        if racy_s is not None:   # tests shorten it
            self.RACY_NS = int(float(racy_s) * 10 ** 9)
        self.old = {}
        self.new = {}
        self.hits = 0
        self.hashed = 0
        self.path = None
        if not enabled:
            return
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        self.site = os.path.realpath(site)
        key = hashlib.sha256("\0".join([self.site] + list(tops)).encode()).hexdigest()[:24]
        self.path = os.path.join(base, "sglpatch", "hashes-%s.json" % key)
        try:
            with open(self.path, "rb") as f:
                if os.fstat(f.fileno()).st_uid != os.geteuid():   # only a cache of our own is believed
                    raise ValueError("not ours")
                data = json.loads(f.read().decode("utf-8"))
            if data.get("v") == 1 and isinstance(data.get("files"), dict):
                self.old = data["files"]
        except (OSError, ValueError, AttributeError):
            self.old = {}

    @staticmethod
    def key(st):
        return [st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns, st.st_dev]

    def lookup(self, rel, st):
        """The recorded sha256 of ``rel`` when its stat identity is unchanged, else None."""
        e = self.old.get(rel)
        if e is not None and e[:5] == self.key(st):
            self.hits += 1
            self.new[rel] = e
            return e[5]
        return None

    def record(self, rel, st, sha):
        self.hashed += 1
        if self.enabled and max(st.st_mtime_ns, st.st_ctime_ns) < self.start_ns - self.RACY_NS:
            self.new[rel] = self.key(st) + [sha]

    def save(self):
        if not self.enabled or self.new == self.old:
            return
        try:
            os.makedirs(os.path.dirname(self.path), mode=0o700, exist_ok=True)
            tmp = "%s.tmp-%d" % (self.path, os.getpid())
            with open(tmp, "w") as f:   # "site" first: evict() reads it from the head of the file
                json.dump({"v": 1, "site": self.site, "files": self.new}, f, separators=(",", ":"))
            os.replace(tmp, self.path)
            self.evict()
        except OSError:
            pass

    def evict(self):
        """Delete our caches of installs that no longer exist (a venv removed, a test's clone)."""
        d = os.path.dirname(self.path)
        for name in os.listdir(d):
            full = os.path.join(d, name)
            if not name.startswith("hashes-") or full == self.path:
                continue
            try:
                with open(full, "rb") as f:
                    if os.fstat(f.fileno()).st_uid != os.geteuid():
                        continue
                    head = f.read(4096).decode("utf-8", "replace")
                m = re.search(r'"site":("(?:[^"\\]|\\.)*")', head)
                if m and not os.path.isdir(json.loads(m.group(1))):
                    os.unlink(full)
            except (OSError, ValueError):
                continue

    def stats(self):
        return {"hits": self.hits, "hashed": self.hashed, "enabled": self.enabled}


def _tops(args):
    site = args["site_packages"]
    tops = [args.get("package", "sglang")]
    if args.get("dist_info"):
        tops.append(args["dist_info"])
    if not os.path.isdir(os.path.join(site, tops[0])):
        fail("missing", "%s has no %s/ directory" % (site, tops[0]))
    return site, tops


def op_hash(args):
    site, tops = _tops(args)
    cache = HashCache(site, tops, bool(args.get("cache")), args.get("racy_s"))
    files = []
    for top in tops:
        for rel, full, st in _walk(site, top):
            sha = cache.lookup(rel, st)
            if sha is None:
                sha = _sha256(full)
                st2 = os.stat(full)
                if HashCache.key(st2) == HashCache.key(st):   # not changing while read
                    cache.record(rel, st, sha)
            files.append([rel, sha, st.st_size, st.st_mode & 0o7777])
    cache.save()
    return {"ok": True, "site_packages": site, "files": files, "cache": cache.stats()}


def _tar_member(sink, rel, data, mode, mtime):
    """One tar member holding ``data`` (bytes), written straight to ``sink``."""
    import tarfile
    info = tarfile.TarInfo(rel)
    info.size = len(data)
    info.mode = mode
    info.mtime = mtime
    sink.write(info.tobuf(tarfile.GNU_FORMAT, "utf-8", "surrogateescape"))
    sink.write(data)
    sink.write(b"\0" * (-len(data) % tarfile.BLOCKSIZE))


def _sink(args):
    out = sys.stdout.buffer
    if args.get("compress") == "gz":
        import gzip
        return out, gzip.GzipFile(fileobj=out, mode="wb", compresslevel=int(args.get("level", 1)))
    return out, out


def op_pack(args):
    import tarfile
    site, tops = _tops(args)
    cache = HashCache(site, tops, bool(args.get("cache")), args.get("racy_s"))
    listed = []
    for top in tops:
        for rel, _full, st in _walk(site, top):
            listed.append([rel, st.st_size, st.st_mode & 0o7777])
    out, sink = _sink(args)
    now = int(time.time())
    index = json.dumps(listed).encode()
    _tar_member(sink, "@sglpatch/index.json", index, 0o644, now)
    sent = []
    for rel, _size, _mode in listed:
        try:
            f = open(os.path.join(site, rel), "rb")
        except OSError:
            continue   # gone meanwhile: not sent, not listed in the hashes
        with f:
            st = os.fstat(f.fileno())
            info = tarfile.TarInfo(rel)
            info.size = st.st_size
            info.mode = st.st_mode & 0o7777
            info.mtime = int(st.st_mtime)
            sink.write(info.tobuf(tarfile.GNU_FORMAT, "utf-8", "surrogateescape"))
            h = hashlib.sha256()
            left = st.st_size
            while left > 0:
                block = f.read(min(left, 1 << 20))
                if not block:  # shrank while being read: pad; the hash of what was sent says so
                    block = b"\0" * left
                h.update(block)
                sink.write(block)
                left -= len(block)
            sink.write(b"\0" * (-st.st_size % tarfile.BLOCKSIZE))
            sha = h.hexdigest()
            if HashCache.key(os.fstat(f.fileno())) == HashCache.key(st):
                cache.record(rel, st, sha)
        sent.append([rel, sha, st.st_size, st.st_mode & 0o7777])
    hashes = json.dumps(sent).encode()
    _tar_member(sink, "@sglpatch/hashes.json", hashes, 0o644, now)
    sink.write(b"\0" * (2 * tarfile.BLOCKSIZE))
    if sink is not out:
        sink.close()
    out.flush()
    cache.save()
    return None


def op_tar(args):
    import tarfile
    site = os.path.realpath(args["site_packages"])
    paths = json.loads(sys.stdin.buffer.read().decode("utf-8") or "[]")
    for rel in paths:
        full = os.path.realpath(os.path.join(site, rel))
        if os.path.isabs(rel) or ".." in rel.split("/") or not full.startswith(site + os.sep):
            fail("bad-path", "refusing to send %r: not inside %s" % (rel, site))
        if not os.path.isfile(full):
            fail("missing", "%s vanished from %s during the snapshot" % (rel, site),
                 path=rel)
    out = sys.stdout.buffer
    sink = out
    if args.get("compress") == "gz":
        import gzip
        sink = gzip.GzipFile(fileobj=out, mode="wb", compresslevel=int(args.get("level", 1)))
    # Headers built by hand and written straight out: tarfile.add() looks up user and group names
    # for every file and its stream buffer copies quadratically, both slower than the I/O itself.
    for rel in paths:
        with open(os.path.join(site, rel), "rb") as f:
            st = os.fstat(f.fileno())
            info = tarfile.TarInfo(rel)
            info.size = st.st_size
            info.mode = st.st_mode & 0o7777
            info.mtime = int(st.st_mtime)
            sink.write(info.tobuf(tarfile.GNU_FORMAT, "utf-8", "surrogateescape"))
            left = st.st_size
            while left > 0:
                block = f.read(min(left, 1 << 20))
                if not block:  # shrank while being read: pad; the hash check downstream catches it
                    block = b"\0" * left
                sink.write(block)
                left -= len(block)
            sink.write(b"\0" * (-st.st_size % tarfile.BLOCKSIZE))
    sink.write(b"\0" * (2 * tarfile.BLOCKSIZE))
    if sink is not out:
        sink.close()
    out.flush()
    return None


OPS = {"probe": op_probe, "hash": op_hash, "tar": op_tar, "pack": op_pack}


def main():
    # `python -c` puts the working directory first on sys.path; that is an artefact of how we run,
    # not part of the host's environment, and a `sglang/` directory there must not count.
    if sys.path and sys.path[0] in ("", os.getcwd()):
        sys.path.pop(0)
    op = sys.argv[1] if len(sys.argv) > 1 else ""
    args = json.loads(sys.argv[2]) if len(sys.argv) > 2 else {}
    if op not in OPS:
        fail("usage", "unknown op %r; known: %s" % (op, ", ".join(sorted(OPS))))
    result = OPS[op](args)
    if result is not None:
        sys.stdout.write(json.dumps(result) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
