"""The deployment transaction (``push``): check the payload, disk and permissions (:mod:`preflight`),
take the lock, check drift, journal ``staging``, back up the originals, stage each new file beside
its target and verify it, journal ``committing``, rename them over the targets, journal ``pushed``,
write the record — undone in full on any failure: every file restored, then what the push created
(its backups, and the backups dir and state dir when it made them) removed, then the journal
dropped. Then ``resume`` (finish an interrupted push), ``finish`` (verified: drop the journal,
release the lock) and ``unlock``."""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import sys

from ..access import user_name
from .backup import check_backups, restore_plan
from .base import Fail, check_id, crash_point, fail_point, now
from .files import (file_info, fsync_dir, purge_bytecode, read_payload, remove_quiet, sha256_file, stage_file,
                    write_atomic, write_json)
from .host import HostState
from .lock import refuse_live_holder
from .preflight import explain_os_error, preflight


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


def check_unchanged(h, files, live):
    """The compare-and-swap of a push: each file whose spec names ``expect`` (the live sha256 the
    client's plan saw, None = absent) must still have it, checked under the lock before any write;
    ``force`` does not override it. Raises Fail(changed) naming each file, its two hashes and the
    newest deployment record (another apply or rollback ran between the plan and the push)."""
    changed = {rel: {"planned": spec["expect"], "live": live[rel]["sha256"]}
               for rel, spec in sorted(files.items())
               if "expect" in spec and live[rel]["sha256"] != spec["expect"]}
    if not changed:
        return
    records = h.records()
    latest = records[-1] if records else None
    by = (" (the newest deployment record is %s, %s r%s, %s)"
          % (latest.get("id"), latest.get("patchset"), latest.get("revision"), latest.get("phase"))
          if latest else "")
    raise Fail("changed", "%d file(s) changed on the host since this apply planned its push%s: %s; "
               "nothing was written" % (len(changed), by, ", ".join(
                   "%s (planned %s, now %s)" % (rel, (c["planned"] or "absent")[:12], (c["live"] or "absent")[:12])
                   for rel, c in changed.items())),
               files=changed, latest=latest and latest.get("id"))


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
    had_state = os.path.isdir(h.state)
    got = h.acquire(holder, bool(a.get("break_lock")))
    try:
        j = h.journal()
        if j is not None:
            raise Fail("journal_pending", "deployment %s was interrupted in phase %s; resume or roll it "
                       "back first" % (j.get("id"), j.get("phase")), journal=j)
        if os.path.exists(h.record_path(did)):
            raise Fail("bad_args", "deployment id %s already exists on this host" % did)
        live = {rel: file_info(h.target(rel)) for rel in files}
        check_unchanged(h, files, live)
        drift = {rel: live[rel]["sha256"] for rel, spec in files.items()
                 if live[rel]["sha256"] not in spec.get("allowed", [])}
        if drift and not a.get("force"):
            raise Fail("drift", "%d file(s) on the host match no hash this deployment accepts: %s"
                       % (len(drift), ", ".join(sorted(drift))), files=drift)
        plan, created_dirs = build_plan(h, files, live)
    except (Fail, OSError) as exc:
        if got in ("acquired", "broken"):
            h.release(holder)
            if not had_state:
                remove_empty_dir(h.state)
        if isinstance(exc, OSError):
            raise Fail("push_failed", "push of %s failed before any write: %s" % (did, explain_os_error(exc)[0]))
        raise

    journal = {"id": did, "patchset": dep.get("patchset"), "revision": dep.get("revision"),
               "sglang_version": dep.get("sglang_version"), "client": dep.get("client"),
               "user": user_name(os.geteuid()), "files": plan, "created_dirs": created_dirs,
               "forced": bool(drift), "drift": drift, "phase": "staging", "times": {"started": now()},
               "site_packages": h.root}
    had_backups = os.path.isdir(h.backups_dir)
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
            crash_point("stage", n)
        h.set_phase(journal, "committing")
        commit(h, did, plan)
        h.set_phase(journal, "pushed")
        crash_point("pushed", 0)
        write_json(h.record_path(did), journal)
    except (OSError, Fail) as exc:
        reason, kinds = (exc.error, []) if isinstance(exc, Fail) else explain_os_error(exc)
        try:
            undo(h, did, journal)
        except (OSError, Fail) as exc2:
            raise Fail("push_failed", "push of %s failed (%s) and undoing it failed too (%s); the journal "
                       "%s is left for the next run" % (did, reason, explain_os_error(exc2)[0]
                                                        if isinstance(exc2, OSError) else exc2, h.journal_path),
                       kinds=kinds)
        left = discard_backups(h, did, had_backups)
        if left:   # the journal names them: the next apply or rollback records them, prune deletes them
            h.release(holder, force=True)
            raise Fail("push_failed", "push of %s failed (%s); every file was restored, but its backups could "
                       "not be deleted (%s): the journal %s is left, so that the next apply or rollback records "
                       "them and `sglpatch prune` deletes them" % (did, reason, ", ".join(left[:4]), h.journal_path))
        h.drop_journal()
        h.release(holder, force=True)
        if not had_state:
            remove_empty_dir(h.state)
        kind = exc.kind if isinstance(exc, Fail) and exc.kind in ("drift", "verify_failed") else "push_failed"
        raise Fail(kind, "push of %s failed (%s); every file was restored and nothing it wrote is left on "
                   "the host" % (did, reason), kinds=kinds)
    return {"deployment": journal}


def discard_backups(h, did, had_backups):
    """After a failed push was undone (every file back to its ``before``, verified): delete its
    backups — no record will name them — and the backups dir when this push made it and it is empty
    now. Returns the paths that could not be deleted (the caller then keeps the journal)."""
    left = []
    top = os.path.join(h.backups_dir, did)
    if os.path.isdir(top):
        shutil.rmtree(top, onerror=lambda _f, path, _e: left.append(path))
    if not left and not had_backups:
        remove_empty_dir(h.backups_dir)
    fsync_dir(h.backups_dir if had_backups else h.state)
    return left


def remove_empty_dir(path):
    """rmdir ``path`` when it is empty (a dir this push made and left nothing in); else leave it."""
    try:
        os.rmdir(path)
    except OSError:
        pass


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
            fail_point("commit", n + 1, t)
            os.replace(tmp, t)
            n += 1
            crash_point("commit", n)
        else:
            remove_quiet(t)
    for d in dirs:
        fsync_dir(d)
    for rel in plan:
        purge_bytecode(h.target(rel))


def undo(h, did, journal):
    check_backups(h, did, journal["files"])
    restore_plan(h, did, journal["files"], journal.get("created_dirs"))


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
    cur = h.read_lock()
    holder = a.get("holder")
    if a.get("break_lock") and cur and not (isinstance(holder, dict) and cur.get("token") == holder.get("token")):
        refuse_live_holder(h.lock_path, cur, holder)
    released = h.release(holder, force=bool(a.get("break_lock")))
    return {"released": released}
