"""Host-side deploy agent: lock, journal, backup, stage+verify+rename, resume, rollback, history.

Standard library only; it runs under the host's own Python, sent by
:mod:`sglang_patcher.remote.launcher` (one exec channel per operation). ``sys.argv`` is
``[<source>, op, json_args]``. Every JSON operation prints one JSON object and exits 0; an expected
failure prints ``{"ok": false, "kind": ..., "error": ...}`` (plus details) and exits 3.

Host state lives in ``<site-packages>/.sglpatch/`` (or ``state_dir``)::

    lock                   O_EXCL file, JSON holder {user, pid, host, started, deployment, token}
    journal.json           the deployment in progress; phase staging|committing|pushed|rolling_back
    deployments/<id>.json  record: {id, patchset, revision, sglang_version, files, phase, times, ...}
    backups/<id>/<paths>   the originals the deployment replaced or deleted

Operations (``args`` keys; every op takes ``site_packages`` and optional ``state_dir``):

* ``inspect``  {paths}: live sha256/size/mode/uid/gid/nlink of each path, lock holder, pending
  journal, deployment records, free bytes and writability of site-packages and the state dir.
* ``push``     {deployment, files, holder, force, break_lock, reserve_bytes}; stdin: a tar of the
  new contents (member name = site-packages-relative path). ``files[path]`` is ``{"action":
  "write"|"delete", "sha256": new hash, "mode": new mode or null, "allowed": [live hashes accepted,
  null = absent]}``. Order: check payload, free disk and write permission (before the first write),
  take the lock, refuse a pending journal, check drift, journal ``staging``, back up the originals,
  write each new file beside its target as ``.<name>.sglpatch-<id>``, fsync, verify its sha256,
  give it the target's owner and mode, journal ``committing``, rename over the targets, delete,
  fsync directories, purge ``__pycache__/<module>.*.pyc``, journal ``pushed``, write the record.
  The lock stays held until ``finish`` or ``rollback``.
* ``resume``   {deployment_id, holder, break_lock}: finish an interrupted push whose temp files
  are all staged and verified (phase staging/committing) → phase pushed; else ``not_resumable``.
* ``finish``   {deployment_id, holder, checks}: mark verified, drop the journal, release the lock.
* ``rollback`` {deployment_id, holder, break_lock}: restore the backups (stage+verify+rename, the
  original owner and mode), remove files the deployment added, purge bytecode, verify every file
  equals its recorded pre-deploy hash, record it, release the lock. Refuses a deployment that is not
  the latest active one (``not_latest``).
* ``unlock``   {holder, break_lock}: release the lock (ours, or any with break_lock).
* ``prune``    {keep, holder, dry_run, break_lock}: delete the backups of rolled-back deployments
  but the ``keep`` newest (records stay, marked ``backups_pruned``); active ones are never touched.
* ``history``  {}: all deployment records, oldest first.
* ``compile``  {paths}: ``py_compile`` each file (bytecode into a temp dir, never ``__pycache__``).
* ``backup_tar`` {deployment_id}: writes a tar of ``backups/<id>/`` to stdout (binary).
* ``put_backups`` {deployment_id, files, holder, break_lock}; stdin: a tar of lost originals
  (``files[path]`` = the record's ``before`` sha256 of each): written under ``backups/<id>/``
  (fsync, rename, hashed again), so that a rollback can read them.

Failure kinds: bad_args, bad_path, bad_payload, lock_held, journal_pending, drift, no_space,
not_writable, not_regular, verify_failed, not_found, not_resumable, not_latest, push_failed,
rollback_failed, put_failed.

Test hook: ``SGLPATCH_AGENT_CRASH=<point>:<n>`` makes the agent die (``os._exit(137)``) at a point
of the push — ``stage:n`` after n staged files, ``partial:n`` half-way through writing the n-th temp
file, ``commit:n`` after n renames, ``pushed:0`` after the journal says pushed but before the record —
and of a rollback — ``restore:n`` after n files put back from their backups — so tests can
reproduce an interrupted upload or rollback for real.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import py_compile
import re
import shutil
import socket
import stat
import sys
import tarfile
import tempfile
import time

STATE_NAME = ".sglpatch"
EXPECTED_FAILURE_EXIT = 3
ACTIVE_PHASES = ("staging", "committing", "pushed", "verified", "rolling_back")
_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_CHUNK = 1 << 20


class Fail(Exception):
    """An expected failure: printed as ``{"ok": false, "kind", "error", **extra}``, exit 3."""

    def __init__(self, kind, error, **extra):
        super().__init__(error)
        self.kind = kind
        self.error = error
        self.extra = extra


# --------------------------------------------------------------------------------------- helpers

def now():
    """UTC, to the microsecond: records sort by it (two deployments within one second stay in order)."""
    t = time.time()
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + ".%06dZ" % int((t % 1) * 1e6)


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


def nearest_existing(path):
    while not os.path.exists(path):
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return path


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


def _crash(point, count):
    spec = os.environ.get("SGLPATCH_AGENT_CRASH")
    if spec and spec == "%s:%d" % (point, count):
        sys.stdout.flush()
        os._exit(137)


def user_name(uid):
    try:
        import pwd
        return pwd.getpwuid(uid).pw_name
    except (ImportError, KeyError):
        return str(uid)


# ------------------------------------------------------------------------------------ the host

class HostState:
    """The site-packages root and the state dir of one host, with path safety."""

    def __init__(self, args):
        sp = args.get("site_packages")
        if not sp or not os.path.isabs(sp):
            raise Fail("bad_args", "site_packages must be an absolute path, got %r" % (sp,))
        if not os.path.isdir(sp):
            raise Fail("bad_args", "site-packages directory %s does not exist" % sp)
        self.root = os.path.realpath(sp)
        self.state = os.path.realpath(args.get("state_dir") or os.path.join(self.root, STATE_NAME))
        self.lock_path = os.path.join(self.state, "lock")
        self.journal_path = os.path.join(self.state, "journal.json")
        self.records_dir = os.path.join(self.state, "deployments")
        self.backups_dir = os.path.join(self.state, "backups")

    # -- paths
    def target(self, rel):
        if not isinstance(rel, str) or not rel or rel.startswith("/") or "\\" in rel or "\0" in rel:
            raise Fail("bad_path", "not a site-packages-relative posix path: %r" % (rel,))
        parts = rel.split("/")
        if any(p in ("", ".", "..") for p in parts) or parts[0] == STATE_NAME:
            raise Fail("bad_path", "unsafe path %r (no '..', no empty parts, not the state dir)" % rel)
        return os.path.join(self.root, *parts)

    def temp_for(self, rel, did):
        t = self.target(rel)
        return os.path.join(os.path.dirname(t), ".%s.sglpatch-%s" % (os.path.basename(t), did))

    def backup_for(self, did, rel):
        self.target(rel)
        return os.path.join(self.backups_dir, did, *rel.split("/"))

    def record_path(self, did):
        return os.path.join(self.records_dir, did + ".json")

    # -- lock
    def read_lock(self):
        return read_json(self.lock_path)

    def acquire(self, holder, break_lock):
        """Take the lock for ``holder`` (a dict with a ``token``). Returns acquired|held|broken."""
        if not isinstance(holder, dict) or not holder.get("token"):
            raise Fail("bad_args", "holder with a token is required")
        os.makedirs(self.state, exist_ok=True)
        data = json.dumps(holder, sort_keys=True).encode()
        broken = False
        for _ in range(3):
            try:
                fd = os.open(self.lock_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                cur = self.read_lock()
                if cur is None:
                    continue
                if cur.get("token") == holder["token"]:
                    return "held"
                if break_lock and not broken:
                    try:
                        os.unlink(self.lock_path)
                    except FileNotFoundError:
                        pass
                    broken = True
                    continue
                raise Fail("lock_held", "another deployment holds the lock %s: %s"
                           % (self.lock_path, describe_holder(cur)), holder=cur)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            fsync_dir(self.state)
            return "broken" if broken else "acquired"
        raise Fail("lock_held", "could not take the lock %s" % self.lock_path, holder=self.read_lock())

    def release(self, holder=None, force=False):
        cur = self.read_lock()
        if cur is None:
            return False
        if not force and holder is not None and cur.get("token") != holder.get("token"):
            raise Fail("lock_held", "the lock is held by %s, not by us" % describe_holder(cur), holder=cur)
        try:
            os.unlink(self.lock_path)
        except FileNotFoundError:
            return False
        fsync_dir(self.state)
        return True

    # -- journal and records
    def journal(self):
        return read_json(self.journal_path)

    def set_phase(self, journal, phase):
        journal["phase"] = phase
        journal.setdefault("times", {})[phase] = now()
        write_json(self.journal_path, journal)

    def drop_journal(self):
        try:
            os.unlink(self.journal_path)
        except FileNotFoundError:
            pass
        fsync_dir(self.state)

    def records(self):
        out = []
        try:
            names = sorted(os.listdir(self.records_dir))
        except FileNotFoundError:
            return out
        for n in names:
            if n.endswith(".json") and not n.startswith("."):
                rec = read_json(os.path.join(self.records_dir, n))
                if rec is not None:
                    out.append(rec)
        out.sort(key=lambda r: (r.get("times", {}).get("started", ""), r.get("id", "")))
        return out

    def record(self, did):
        rec = read_json(self.record_path(did))
        if rec is None:
            j = self.journal()
            if j and j.get("id") == did:
                return j
            raise Fail("not_found", "no deployment %s on this host (records in %s)" % (did, self.records_dir))
        return rec


def describe_holder(h):
    if not h:
        return "nobody"
    if h.get("unreadable"):
        return "an unreadable lock file (break it with --break-lock if no deployment is running)"
    return "%s@%s pid %s since %s (deployment %s)" % (h.get("user"), h.get("host"), h.get("pid"),
                                                      h.get("started"), h.get("deployment"))


def check_id(did):
    if not isinstance(did, str) or not _ID_RE.match(did):
        raise Fail("bad_args", "bad deployment id %r" % (did,))
    return did


# ------------------------------------------------------------------------------- file moves

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
            _crash("partial", crash_n)
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


def remove_quiet(path):
    try:
        os.unlink(path)
        return True
    except FileNotFoundError:
        return False


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


# ------------------------------------------------------------------------------------- inspect

def op_inspect(a):
    h = HostState(a)
    files = {p: file_info(h.target(p)) for p in a.get("paths", [])}
    temps = []
    for p in a.get("paths", []):
        d = os.path.dirname(h.target(p))
        base = "." + os.path.basename(h.target(p)) + ".sglpatch-"
        try:
            temps += [os.path.join(d, e) for e in os.listdir(d) if e.startswith(base)]
        except OSError:
            pass
    dirs = sorted({os.path.dirname(h.target(p)) for p in a.get("paths", [])})
    records = h.records()
    out = {}
    if a.get("backups"):  # status: the backups a rollback of each active deployment would need
        out["bad_backups"] = {}
        for r in records:
            if r.get("phase") not in ACTIVE_PHASES:
                continue
            try:
                bad = bad_backups(h, check_id(r.get("id")), r["files"])
            except Exception:  # a damaged record: the host side reports it as damaged
                continue
            if bad:
                out["bad_backups"][r["id"]] = bad
    return {"files": files, "lock": h.read_lock(), "journal": h.journal(), "deployments": records, **out,
            "space": {"site_packages": dir_facts(h.root), "state_dir": dir_facts(h.state)},
            "dirs": {d: dir_facts(d) for d in dirs},
            "site_packages": h.root, "state_dir": h.state, "euid": os.geteuid(),
            "user": user_name(os.geteuid()), "hostname": socket.gethostname(), "temps": temps}


def op_history(a):
    h = HostState(a)
    return {"deployments": h.records(), "journal": h.journal(), "lock": h.read_lock()}


# ---------------------------------------------------------------------------------------- push

def preflight(h, files, payload, reserve):
    """Free disk and write permission, before the first write. Raises Fail(no_space|not_writable)."""
    euid = os.geteuid()
    groups = set(os.getgroups()) | {os.getegid()}
    problems = []
    need_target = 0
    need_state = 0
    for rel, spec in files.items():
        t = h.target(rel)
        parent = nearest_existing(os.path.dirname(t))
        if not os.access(parent, os.W_OK | os.X_OK):
            problems.append("%s: directory %s is not writable by %s" % (rel, parent, user_name(euid)))
        info = file_info(t)
        if info["exists"]:
            if info["type"] != "file":
                raise Fail("not_regular", "%s is a %s, not a regular file; sglpatch replaces regular files "
                           "only" % (t, info["type"]))
            need_state += info["size"]
            if euid != 0 and info["uid"] != euid:
                problems.append("%s is owned by %s; as %s its owner cannot be kept"
                                % (rel, user_name(info["uid"]), user_name(euid)))
            elif euid != 0 and info["gid"] not in groups:
                problems.append("%s has group %d, which %s is not in; its group cannot be kept"
                                % (rel, info["gid"], user_name(euid)))
        if spec["action"] == "write":
            need_target += len(payload[rel])
    st = dir_facts(h.state)
    if not st["writable"]:
        problems.append("state dir %s (checked %s) is not writable by %s" % (h.state, st["checked"],
                                                                           user_name(euid)))
    if problems:
        raise Fail("not_writable", "; ".join(problems), problems=problems)
    sp = dir_facts(h.root)
    if sp["dev"] == st["dev"]:
        checks = [(sp, need_target + need_state)]
    else:
        checks = [(sp, need_target), (st, need_state)]
    for facts, need in checks:
        if facts["free_bytes"] is not None and facts["free_bytes"] - need < reserve:
            raise Fail("no_space", "%s has %d bytes free; this deployment needs %d plus a reserve of %d"
                       % (facts["checked"], facts["free_bytes"], need, reserve),
                       free_bytes=facts["free_bytes"], need_bytes=need, reserve_bytes=reserve)


def build_plan(h, files, live):
    """Per path: action, before/after sha256, the mode to set, the owner to keep; dirs to create."""
    plan = {}
    created_dirs = []
    for rel, spec in sorted(files.items()):
        t = h.target(rel)
        info = live[rel]
        entry = {"action": spec["action"], "before": info["sha256"],
                 "after": spec["sha256"] if spec["action"] == "write" else None,
                 "orig_mode": info.get("mode"), "uid": info.get("uid"), "gid": info.get("gid")}
        if spec["action"] == "write":
            if info["exists"]:
                entry["mode"] = spec.get("mode") if spec.get("mode") is not None else info["mode"]
            else:
                d = os.path.dirname(t)
                missing = []
                while not os.path.isdir(d):
                    missing.append(d)
                    d = os.path.dirname(d)
                for m in reversed(missing):
                    if m not in created_dirs:
                        created_dirs.append(m)
                pst = os.stat(d)
                entry["mode"] = spec.get("mode") if spec.get("mode") is not None else 0o644
                # a new file takes its directory's owner when we can give it (root); else ours
                if os.geteuid() == 0:
                    entry["uid"], entry["gid"] = pst.st_uid, pst.st_gid
        else:
            entry["mode"] = None
        plan[rel] = entry
    return plan, created_dirs


def op_push(a):
    h = HostState(a)
    dep = a.get("deployment") or {}
    did = check_id(dep.get("id"))
    files = a.get("files") or {}
    if not files:
        raise Fail("bad_args", "nothing to push")
    wanted = {}
    for rel, spec in files.items():
        h.target(rel)
        if spec.get("action") not in ("write", "delete"):
            raise Fail("bad_args", "%s: action must be write or delete" % rel)
        if spec["action"] == "write":
            wanted[rel] = spec["sha256"]
    payload = read_payload(sys.stdin.buffer, wanted) if wanted else {}
    preflight(h, files, payload, int(a.get("reserve_bytes", 16 << 20)))

    holder = a.get("holder")
    got = h.acquire(holder, bool(a.get("break_lock")))
    try:
        j = h.journal()
        if j is not None:
            raise Fail("journal_pending", "deployment %s was interrupted in phase %s; resume or roll it "
                       "back first" % (j.get("id"), j.get("phase")), journal=j)
        if os.path.exists(h.record_path(did)):
            raise Fail("bad_args", "deployment id %s already exists on this host" % did)
        live = {rel: file_info(h.target(rel)) for rel in files}
        drift = {rel: live[rel]["sha256"] for rel, spec in files.items()
                 if live[rel]["sha256"] not in spec.get("allowed", [])}
        if drift and not a.get("force"):
            raise Fail("drift", "%d file(s) on the host match no hash this deployment accepts: %s"
                       % (len(drift), ", ".join(sorted(drift))), files=drift)
        plan, created_dirs = build_plan(h, files, live)
    except (Fail, OSError) as exc:
        if got in ("acquired", "broken"):
            h.release(holder)
        if isinstance(exc, OSError):
            raise Fail("push_failed", "push of %s failed before any write (%s: %s)" % (did, type(exc).__name__, exc))
        raise

    journal = {"id": did, "patchset": dep.get("patchset"), "revision": dep.get("revision"),
               "sglang_version": dep.get("sglang_version"), "client": dep.get("client"),
               "user": user_name(os.geteuid()), "files": plan, "created_dirs": created_dirs,
               "forced": bool(drift), "drift": drift, "phase": "staging", "times": {"started": now()},
               "site_packages": h.root}
    try:
        h.set_phase(journal, "staging")
        # back up the originals (with their hashes in the plan)
        for rel, e in plan.items():
            if e["before"] is not None:
                src = h.target(rel)
                with open(src, "rb") as f:
                    data = f.read()
                if hashlib.sha256(data).hexdigest() != e["before"]:
                    raise Fail("drift", "%s changed while it was being backed up" % rel)
                write_atomic(h.backup_for(did, rel), data)
        for d in created_dirs:
            parent = os.stat(os.path.dirname(d))
            os.mkdir(d, stat.S_IMODE(parent.st_mode))
            if os.geteuid() == 0:
                os.chown(d, parent.st_uid, parent.st_gid)
        n = 0
        for rel, e in plan.items():
            if e["action"] != "write":
                continue
            n += 1
            stage_file(h.temp_for(rel, did), payload[rel], e["after"], e["uid"], e["gid"], e["mode"],
                       crash_n=n)
            _crash("stage", n)
        h.set_phase(journal, "committing")
        commit(h, did, plan)
        h.set_phase(journal, "pushed")
        _crash("pushed", 0)
        write_json(h.record_path(did), journal)
    except (OSError, Fail) as exc:
        reason = exc.error if isinstance(exc, Fail) else "%s: %s" % (type(exc).__name__, exc)
        try:
            undo(h, did, journal)
        except (OSError, Fail) as exc2:
            raise Fail("push_failed", "push of %s failed (%s) and undoing it failed too (%s); the journal "
                       "%s is left for the next run" % (did, reason, exc2, h.journal_path))
        h.drop_journal()
        h.release(holder, force=True)
        kind = exc.kind if isinstance(exc, Fail) and exc.kind in ("drift", "verify_failed") else "push_failed"
        raise Fail(kind, "push of %s failed (%s); every file was restored" % (did, reason))
    return {"deployment": journal}


def commit(h, did, plan, resume=False):
    """Rename every staged temp over its target, delete, fsync dirs, purge bytecode."""
    dirs = set()
    n = 0
    for rel, e in plan.items():
        t = h.target(rel)
        dirs.add(os.path.dirname(t))
        if e["action"] == "write":
            tmp = h.temp_for(rel, did)
            if resume and not os.path.exists(tmp):
                continue  # already renamed (checked by the caller)
            os.replace(tmp, t)
            n += 1
            _crash("commit", n)
        else:
            remove_quiet(t)
    for d in dirs:
        fsync_dir(d)
    for rel in plan:
        purge_bytecode(h.target(rel))


def bad_backups(h, did, plan):
    """The backups a restore of ``plan`` would read that are missing or do not have their recorded
    sha256: {rel: backup path} (a file already back at its original needs none)."""
    bad = {}
    for rel, e in sorted(plan.items()):
        if e.get("before") is None:
            continue
        live = file_info(h.target(rel))
        if live["sha256"] == e["before"] and live.get("mode") == e.get("orig_mode"):
            continue
        bpath = h.backup_for(did, rel)
        if not os.path.isfile(bpath) or sha256_file(bpath) != e["before"]:
            bad[rel] = bpath
    return bad


def check_backups(h, did, plan):
    """Before any file is restored: every backup the restore will read exists and has its recorded
    sha256. Raises Fail(backup_missing) naming each missing or wrong one (backups: {rel: path});
    nothing is written."""
    bad = bad_backups(h, did, plan)
    if bad:
        raise Fail("backup_missing", "%d backup(s) of deployment %s are missing or damaged on the host: %s; "
                   "nothing was restored" % (len(bad), did, ", ".join(sorted(bad.values()))), backups=bad)


def restore_plan(h, did, plan, created_dirs):
    """Put every file of ``plan`` back to its ``before`` state (idempotent), then verify by hash.
    Callers run ``check_backups`` first, so that a missing backup restores nothing."""
    dirs = set()
    restored = 0
    for rel, e in plan.items():
        t = h.target(rel)
        dirs.add(os.path.dirname(t))
        remove_quiet(h.temp_for(rel, did))
        live = file_info(t)
        if e["before"] is None:
            if live["exists"]:
                os.unlink(t)
            continue
        if live["sha256"] == e["before"] and live.get("mode") == e["orig_mode"]:
            continue
        bpath = h.backup_for(did, rel)
        try:
            with open(bpath, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            raise Fail("rollback_failed", "the backup of %s is missing (%s)" % (rel, bpath))
        if hashlib.sha256(data).hexdigest() != e["before"]:
            raise Fail("rollback_failed", "the backup %s does not match its recorded sha256 %s"
                       % (bpath, e["before"]))
        tmp = h.temp_for(rel, did)
        stage_file(tmp, data, e["before"], e["uid"], e["gid"], e["orig_mode"])
        os.replace(tmp, t)
        restored += 1
        _crash("restore", restored)
    for d in dirs:
        fsync_dir(d)
    for rel in plan:
        purge_bytecode(h.target(rel))
    for d in reversed(created_dirs or []):
        try:
            pc = os.path.join(d, "__pycache__")
            if os.path.isdir(pc) and not os.listdir(pc):
                os.rmdir(pc)
            os.rmdir(d)
        except OSError:
            pass
    bad = {}
    for rel, e in plan.items():
        live = file_info(h.target(rel))
        if live["sha256"] != e["before"]:
            bad[rel] = {"live": live["sha256"], "expected": e["before"]}
    if bad:
        raise Fail("rollback_failed", "after rollback %d file(s) differ from their pre-deploy hash: %s"
                   % (len(bad), ", ".join(sorted(bad))), files=bad)


def undo(h, did, journal):
    check_backups(h, did, journal["files"])
    restore_plan(h, did, journal["files"], journal.get("created_dirs"))


# ------------------------------------------------------------------------------ resume / finish

def _take_for(h, a, did):
    holder = a.get("holder")
    h.acquire(holder, bool(a.get("break_lock")))
    return holder


def op_resume(a):
    h = HostState(a)
    did = check_id(a.get("deployment_id"))
    j = h.journal()
    if not j or j.get("id") != did:
        raise Fail("not_found", "no interrupted deployment %s in %s" % (did, h.journal_path))
    _take_for(h, a, did)
    if j["phase"] == "pushed":
        write_json(h.record_path(did), j)
        return {"deployment": j, "resumed": "already pushed"}
    if j["phase"] not in ("staging", "committing"):
        raise Fail("not_resumable", "deployment %s is in phase %s; roll it back" % (did, j["phase"]))
    missing = []
    for rel, e in j["files"].items():
        if e["action"] != "write":
            continue
        live = file_info(h.target(rel))
        if live["sha256"] == e["after"]:
            continue
        tmp = h.temp_for(rel, did)
        if not os.path.exists(tmp) or sha256_file(tmp) != e["after"]:
            missing.append(rel)
    if missing:
        raise Fail("not_resumable", "deployment %s cannot be finished: %d file(s) were not fully uploaded "
                   "(%s); roll it back" % (did, len(missing), ", ".join(sorted(missing))), files=missing)
    h.set_phase(j, "committing")
    commit(h, did, j["files"], resume=True)
    h.set_phase(j, "pushed")
    write_json(h.record_path(did), j)
    return {"deployment": j, "resumed": "committed"}


def op_finish(a):
    h = HostState(a)
    did = check_id(a.get("deployment_id"))
    holder = a.get("holder")
    j = h.journal()
    if j is None or j.get("id") != did:
        rec = h.record(did)
        if rec.get("phase") == "verified":
            return {"deployment": rec, "already": True}
        raise Fail("not_found", "deployment %s is not pending verification (phase %s)" % (did, rec.get("phase")))
    if j["phase"] != "pushed":
        raise Fail("journal_pending", "deployment %s is in phase %s, not pushed" % (did, j["phase"]), journal=j)
    h.acquire(holder, bool(a.get("break_lock")))
    j["checks"] = a.get("checks")
    j["phase"] = "verified"
    j.setdefault("times", {})["verified"] = now()
    write_json(h.record_path(did), j)
    h.drop_journal()
    h.release(holder, force=True)
    return {"deployment": j}


def op_unlock(a):
    h = HostState(a)
    released = h.release(a.get("holder"), force=bool(a.get("break_lock")))
    return {"released": released}


# ------------------------------------------------------------------------------------ rollback

def pending_fail(j):
    """The refusal of an op while another deployment's journal is pending."""
    return Fail("journal_pending", "deployment %s is pending (phase %s); deal with it first"
                % (j.get("id"), j.get("phase")), journal=j)


def op_rollback(a):
    h = HostState(a)
    did = check_id(a.get("deployment_id"))
    holder = a.get("holder")
    j = h.journal()
    if j is not None and j.get("id") != did:
        raise pending_fail(j)
    rec = j if j is not None else h.record(did)
    if rec.get("phase") == "rolled_back":
        return {"deployment": rec, "already": True}
    later = [r["id"] for r in h.records() if r.get("id") != did and r.get("phase") in ACTIVE_PHASES
             and (r.get("times", {}).get("started", ""), r["id"]) > (rec.get("times", {}).get("started", ""), did)
             and set(r.get("files", {})) & set(rec.get("files", {}))]
    if later:
        raise Fail("not_latest", "deployment %s was followed by %s on the same files; roll those back first"
                   % (did, ", ".join(later)), later=later)
    h.acquire(holder, bool(a.get("break_lock")))
    if j is None:
        # A finished deployment: every file must still be what it wrote. A hand edit since then is
        # drift: refuse (nothing is lost), or with force keep the edited bytes beside the backups.
        drifted = {}
        for rel, e in sorted(rec["files"].items()):
            live = file_info(h.target(rel))
            if live["sha256"] not in (e.get("after"), e.get("before")):   # before: already restored
                drifted[rel] = {"live": live["sha256"], "deployed": e.get("after")}
        if drifted and not a.get("force"):
            h.release(holder, force=True)
            raise Fail("drift", "%d file(s) changed on the host since deployment %s wrote them: %s"
                       % (len(drifted), did, ", ".join(drifted)), files=drifted)
        for rel, d in drifted.items():
            t = h.target(rel)
            if d["live"] is not None:
                keep = os.path.join(h.backups_dir, did + ".drifted", *rel.split("/"))
                os.makedirs(os.path.dirname(keep), exist_ok=True)
                with open(t, "rb") as f:
                    write_atomic(keep, f.read())
                rec.setdefault("drift_kept", {})[rel] = keep
    try:
        check_backups(h, did, rec["files"])
    except Fail:
        h.release(holder, force=True)
        raise
    if rec.get("phase") != "rolling_back":
        rec["rolled_back_from"] = rec.get("phase")
    h.set_phase(rec, "rolling_back")
    try:
        restore_plan(h, did, rec["files"], rec.get("created_dirs"))
    except OSError as exc:
        raise Fail("rollback_failed", "rollback of %s failed (%s: %s); the journal %s is left, run the "
                   "rollback again" % (did, type(exc).__name__, exc, h.journal_path))
    rec["phase"] = "rolled_back"
    rec["times"]["rolled_back"] = now()
    write_json(h.record_path(did), rec)
    h.drop_journal()
    h.release(holder, force=True)
    return {"deployment": rec}


# ------------------------------------------------------------------------------ compile / tar

def op_compile(a):
    h = HostState(a)
    results = {}
    with tempfile.TemporaryDirectory(prefix="sglpatch-pyc-") as tmpd:
        for i, rel in enumerate(a.get("paths", [])):
            t = h.target(rel)
            if not os.path.exists(t):
                results[rel] = {"status": "failed", "detail": "missing"}
                continue
            try:
                py_compile.compile(t, cfile=os.path.join(tmpd, "%d.pyc" % i), doraise=True)
                results[rel] = {"status": "passed", "detail": ""}
            except py_compile.PyCompileError as exc:
                results[rel] = {"status": "failed", "detail": exc.msg.strip()}
    return {"results": results, "python": sys.version.split()[0], "executable": sys.executable}


def op_backup_tar(a):
    h = HostState(a)
    did = check_id(a.get("deployment_id"))
    base = os.path.join(h.backups_dir, did)
    if not os.path.isdir(base):
        raise Fail("not_found", "no backups for deployment %s in %s" % (did, base))
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        for dirpath, _dirs, names in os.walk(base):
            for n in sorted(names):
                full = os.path.join(dirpath, n)
                tf.add(full, arcname=os.path.relpath(full, base).replace(os.sep, "/"), recursive=False)
    sys.stdout.buffer.write(buf.getvalue())
    sys.stdout.flush()
    return None


def _tree_bytes(path):
    total = 0
    for dirpath, _dirs, names in os.walk(path):
        for n in names:
            try:
                total += os.lstat(os.path.join(dirpath, n)).st_size
            except OSError:
                pass
    return total


def op_prune(a):
    """Delete the backups of rolled-back deployments but the ``keep`` newest; records stay (history),
    marked ``backups_pruned``. Active deployments' backups are never touched (rollback needs them)."""
    h = HostState(a)
    holder = a.get("holder")
    keep = a.get("keep", 3)
    if not isinstance(keep, int) or isinstance(keep, bool) or keep < 0:
        raise Fail("bad_args", "keep must be a whole number >= 0, got %r" % (keep,))
    j = h.journal()
    if j is not None:
        raise pending_fail(j)
    dry = bool(a.get("dry_run"))
    if not dry:
        h.acquire(holder, bool(a.get("break_lock")))
    try:
        done = [r for r in h.records() if r.get("phase") == "rolled_back"]
        cut = max(len(done) - keep, 0)  # done[:cut] lose their backups, done[cut:] keep them
        pruned = []
        for r in done[:cut]:
            did = check_id(r.get("id"))
            dirs = [d for d in (os.path.join(h.backups_dir, did), os.path.join(h.backups_dir, did + ".drifted"))
                    if os.path.isdir(d)]
            if not dirs:
                continue
            size = sum(_tree_bytes(d) for d in dirs)
            if not dry:
                r["backups_pruned"] = now()
                write_json(h.record_path(did), r)   # said first: a crash after it leaves no false record
                for d in dirs:
                    shutil.rmtree(d)
            pruned.append({"id": did, "bytes": size, "dirs": dirs})
    finally:
        if not dry:
            h.release(holder, force=True)
    return {"pruned": pruned, "kept": [r.get("id") for r in done[cut:]], "dry_run": dry}


def op_put_backups(a):
    """Put back lost backups of one deployment from bytes the client sends (stdin: a tar, member
    name = site-packages-relative path). Each file must be the original the deployment's record
    names (``files[path]`` = its ``before`` sha256) and the deployment must still be active or
    mid-rollback; each is written beside its place under ``backups/<id>/``, fsynced, renamed, then
    hashed again. Holds the lock while writing; the record is not changed."""
    h = HostState(a)
    did = check_id(a.get("deployment_id"))
    files = a.get("files") or {}
    if not files:
        raise Fail("bad_args", "no backups to put")
    j = h.journal()
    if j is not None and j.get("id") != did:
        raise pending_fail(j)
    rec = j if j is not None else h.record(did)
    if rec.get("phase") not in ACTIVE_PHASES:
        raise Fail("bad_args", "deployment %s is %s: only an active deployment's backups can be put back"
                   % (did, rec.get("phase")))
    for rel, sha in sorted(files.items()):
        e = rec.get("files", {}).get(rel)
        if not isinstance(e, dict) or e.get("before") is None or e["before"] != sha:
            raise Fail("bad_args", "%s: not an original of deployment %s with sha256 %s; nothing was written"
                       % (rel, did, sha))
    payload = read_payload(sys.stdin.buffer, files)
    holder = a.get("holder")
    got = h.acquire(holder, bool(a.get("break_lock")))
    try:
        for rel in sorted(files):
            dest = h.backup_for(did, rel)
            write_atomic(dest, payload[rel])
            if sha256_file(dest) != files[rel]:
                remove_quiet(dest)
                raise Fail("put_failed", "%s: the backup written to %s does not read back with sha256 %s"
                           % (rel, dest, files[rel]))
    finally:
        if got in ("acquired", "broken"):
            h.release(holder)
    return {"put": sorted(files)}


OPS = {"inspect": op_inspect, "push": op_push, "resume": op_resume, "finish": op_finish,
       "rollback": op_rollback, "unlock": op_unlock, "history": op_history, "compile": op_compile,
       "backup_tar": op_backup_tar, "prune": op_prune, "put_backups": op_put_backups}


def main(argv):
    if len(argv) < 2 or argv[1] not in OPS:
        out, code = {"ok": False, "kind": "bad_args", "error": "unknown op; one of %s" % ", ".join(OPS)}, 3
    else:
        try:
            args = json.loads(argv[2]) if len(argv) > 2 else {}
            res = OPS[argv[1]](args)
            if res is None:
                return 0
            out, code = dict(res, ok=True), 0
        except Fail as f:
            out = dict(f.extra, ok=False, kind=f.kind, error=f.error)
            code = EXPECTED_FAILURE_EXIT
    sys.stdout.write(json.dumps(out, sort_keys=True) + "\n")
    sys.stdout.flush()
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv))
