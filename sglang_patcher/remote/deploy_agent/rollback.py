"""``rollback``: put a deployment's originals back (refusing files edited since it wrote them,
unless forced: their edited bytes are kept beside the backups), verify every file against its
pre-deploy sha256, record it rolled back, release the lock. Before anything is written (the lock
included), every file it would restore or delete, their directories and the state dir pass the
test a push makes (:func:`preflight.refuse_blocked`): a file this user could not replace
(immutable, ...) is refused whole, never left half rolled back. An OS error met mid-way all the
same (a race) keeps the journal, for the next run to finish, and says what the OS refused."""

from __future__ import annotations

import os

from .backup import check_backups, restore_actions, restore_plan
from .base import ACTIVE_PHASES, Fail, check_id, now
from .files import file_info, write_atomic, write_json
from .host import HostState
from .journal import pending_fail
from .preflight import explain_os_error, refuse_blocked


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
    refuse_blocked(h, restore_actions(h, rec["files"]), "cannot roll back deployment %s" % did,
                   verb="restore or delete")
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
        rec["bytecode"] = restore_plan(h, did, rec["files"], rec.get("created_dirs"))
    except OSError as exc:
        said, kinds = explain_os_error(exc)
        raise Fail("rollback_failed", "rollback of %s failed: %s; the journal %s is left (the files "
                   "restored so far stay restored): rerun the rollback once that is fixed"
                   % (did, said, h.journal_path), kinds=kinds, path=exc.filename2 or exc.filename)
    rec["phase"] = "rolled_back"
    rec["times"]["rolled_back"] = now()
    write_json(h.record_path(did), rec)
    h.drop_journal()
    h.release(holder, force=True)
    return {"deployment": rec}
