"""The backups: ``backups/<id>/<paths>`` holds the originals a deployment replaced or deleted.
Checking them before a restore, restoring from them (stage, verify, rename), sending them to the
client (``backup_tar``) and taking lost ones back from it (``put_backups``)."""

from __future__ import annotations

import hashlib
import io
import os
import sys
import tarfile

from .base import ACTIVE_PHASES, Fail, check_id, crash_point, fail_point
from .files import file_info, fsync_dir, purge_bytecode, read_payload, remove_quiet, sha256_file, stage_file, write_atomic
from .host import HostState
from .journal import pending_fail


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


def restore_actions(h, plan):
    """What a restore of ``plan`` would change: {rel: "write"} for each file not back at its
    ``before`` bytes and mode, {rel: "delete"} for each file the deployment added that is still
    there (:func:`restore_plan`'s rule; what its preflight checks)."""
    out = {}
    for rel, e in sorted(plan.items()):
        live = file_info(h.target(rel))
        if e.get("before") is None:
            if live["exists"]:
                out[rel] = "delete"
        elif not (live["sha256"] == e["before"] and live.get("mode") == e.get("orig_mode")):
            out[rel] = "write"
    return out


def check_backups(h, did, plan):
    """Before any file is restored: every backup the restore will read exists and has its recorded
    sha256. Raises Fail(backup_missing) naming each missing or wrong one (backups: {rel: path});
    nothing is written."""
    bad = bad_backups(h, did, plan)
    if bad:
        raise Fail("backup_missing", "%d backup(s) of deployment %s are missing or damaged on the host: %s; "
                   "nothing was restored" % (len(bad), did, ", ".join(sorted(bad.values()))), backups=bad)


def recompile(h, plan):
    """Write the bytecode of every restored module into its ``__pycache__`` (as pip did at install;
    the deployment purged it, and a rollback that left it out made the host's first import compile
    each one): ``{"recompiled": [rel], "failed": {rel: why}}``, plus ``skipped`` (why) when the
    host's Python writes no bytecode. A module that does not compile is said, never fatal."""
    import importlib.util
    import py_compile
    out = {"recompiled": [], "failed": {}}
    if sys.dont_write_bytecode:
        out["skipped"] = "the host's Python writes no bytecode (PYTHONDONTWRITEBYTECODE)"
        return out
    for rel, e in sorted(plan.items()):
        if e.get("before") is None or not rel.endswith(".py"):
            continue
        t = h.target(rel)
        try:
            py_compile.compile(t, cfile=importlib.util.cache_from_source(t), doraise=True)
            out["recompiled"].append(rel)
        except (py_compile.PyCompileError, OSError, ValueError) as exc:
            out["failed"][rel] = ("%s: %s" % (type(exc).__name__, exc)).strip()[:300]
    return out


def restore_plan(h, did, plan, created_dirs):
    """Put every file of ``plan`` back to its ``before`` state (idempotent), then verify by hash,
    then write the restored modules' bytecode (:func:`recompile`, returned). Callers run
    ``check_backups`` first, so that a missing backup restores nothing."""
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
        fail_point("restore", restored + 1, t)
        os.replace(tmp, t)
        restored += 1
        crash_point("restore", restored)
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
    return recompile(h, plan)


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
