"""Host-side probe: what SGLang is installed where, file hashes, and a tar stream of files.

Runs under the HOST's interpreter, sent by :mod:`sglang_patcher.remote.launcher`; standard library
only, never ``import sglang`` (slow on a GPU host, broken on a ``--no-deps`` install). Invoked as
``sys.argv == [<source>, op, json_args]``. JSON ops print one JSON object; expected failures print
``{"ok": false, "kind": ..., "error": ...}`` and exit 3.

Ops:
  probe {record: bool=true}  -> interpreter facts, every visible ``sglang`` distribution, the package
      dir ``importlib.util.find_spec`` resolves (without executing it), writability, free bytes, and
      (when exactly one distribution is visible and ``record``) its RECORD as {path: hex sha256|null}.
  hash {site_packages, dist_info, package="sglang"} -> {"files": [[path, sha256, size, mode], ...]}
      for ``<package>/**`` and ``<dist_info>/**`` under site-packages, skipping ``__pycache__/`` and
      ``*.pyc``; paths are posix, relative to site-packages; symlinks are followed.
  tar {site_packages} + stdin JSON list of relative paths -> an uncompressed (or ``compress: "gz"``)
      tar stream on stdout holding those regular files (links dereferenced), nothing else.
"""

import base64
import csv
import hashlib
import io
import json
import os
import re
import sys

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
    bad = []
    count = 0
    for root, dirs, files in os.walk(package_dir):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for name in [""] + files:
            path = os.path.join(root, name) if name else root
            if name.endswith(".pyc"):
                continue
            if not os.access(path, os.W_OK):
                count += 1
                if len(bad) < limit:
                    bad.append(os.path.relpath(path, os.path.dirname(package_dir)))
    return count, bad


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
        count, bad = _writability(package_dir)
        out["site_packages"] = site
        out["writable"] = count == 0 and os.access(site, os.W_OK)
        out["site_packages_writable"] = os.access(site, os.W_OK)
        out["unwritable_count"] = count
        out["unwritable"] = bad
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
    base = os.path.join(site, top)
    if not os.path.isdir(base):
        return
    for root, dirs, files in os.walk(base):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(files):
            if name.endswith(".pyc") or _STAGED.match(name):
                continue
            full = os.path.join(root, name)
            if not os.path.isfile(full):
                continue  # broken link, socket, fifo: not part of an install
            yield os.path.relpath(full, site).replace(os.sep, "/"), full


def op_hash(args):
    site = args["site_packages"]
    tops = [args.get("package", "sglang")]
    if args.get("dist_info"):
        tops.append(args["dist_info"])
    if not os.path.isdir(os.path.join(site, tops[0])):
        fail("missing", "%s has no %s/ directory" % (site, tops[0]))
    files = []
    for top in tops:
        for rel, full in _walk(site, top):
            st = os.stat(full)
            files.append([rel, _sha256(full), st.st_size, st.st_mode & 0o7777])
    return {"ok": True, "site_packages": site, "files": files}


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


OPS = {"probe": op_probe, "hash": op_hash, "tar": op_tar}


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
