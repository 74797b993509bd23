"""``prune``: delete the backups of rolled-back deployments but the newest few; their records
stay (the host's history), marked ``backups_pruned``. The edited copies a forced rollback kept
(``backups/<id>.drifted/``) go with them, and each answer names them (``drifted``). Backup trees no
record names (``orphans``: a failed push of an sglpatch before pushes removed their own left them)
go too, whatever ``keep`` says, when the host holds every byte of them elsewhere."""

from __future__ import annotations

import os
import shutil

from ..access import user_name
from .base import Fail, check_id, is_id, now
from .files import file_info, sha256_file, write_json
from .host import HostState
from .journal import pending_fail


def _tree_bytes(path):
    total = 0
    for dirpath, _dirs, names in os.walk(path):
        for n in names:
            try:
                total += os.lstat(os.path.join(dirpath, n)).st_size
            except OSError:
                pass
    return total


def _files(top):
    """The files under ``top`` as sorted paths relative to it ([] when it does not exist): the
    edited bytes a forced rollback kept, named by their site-packages paths."""
    out = []
    for dirpath, _dirs, names in os.walk(top):
        out += [os.path.relpath(os.path.join(dirpath, n), top).replace(os.sep, "/") for n in names]
    return sorted(out)


def _held_elsewhere(h, rel, sha, known):
    """True when the host holds the bytes ``sha`` of ``rel`` outside an orphan tree: the live file,
    or the backup of ``rel`` of a deployment a record names."""
    try:
        if file_info(h.target(rel))["sha256"] == sha:
            return True
        paths = [h.backup_for(did, rel) for did in sorted(known)]
    except Fail:   # not a site-packages path: nothing else holds it
        return False
    return any(os.path.isfile(p) and not os.path.islink(p) and sha256_file(p) == sha for p in paths)


def orphans(h):
    """``(removable, kept)``: the trees under ``backups/`` that no deployment names — no record, no
    record file's name in ``deployments/`` (a damaged one included) and not the journal is their id
    (``<id>`` or ``<id>.drifted``). Removable: every file in the tree is held elsewhere on the host
    (:func:`_held_elsewhere`); kept: some file is not (``alone``: the backups of a deployment whose
    record was lost: copy the record back and roll it back). Each ``{id, dir, bytes, files}``."""
    known = {r.get("id") for r in h.records()} | {(h.journal() or {}).get("id")}
    if os.path.isdir(h.records_dir):
        known |= {n[:-5] for n in os.listdir(h.records_dir) if n.endswith(".json")}
    known.discard(None)
    names = sorted(os.listdir(h.backups_dir)) if os.path.isdir(h.backups_dir) else []
    removable, kept = [], []
    for name in names:
        did = name[:-len(".drifted")] if name.endswith(".drifted") else name
        top = os.path.join(h.backups_dir, name)
        if did in known or not is_id(did) or os.path.islink(top) or not os.path.isdir(top):
            continue
        files = _files(top)
        alone = [rel for rel in files
                 if os.path.islink(os.path.join(top, *rel.split("/")))
                 or not _held_elsewhere(h, rel, sha256_file(os.path.join(top, *rel.split("/"))), known)]
        entry = {"id": name, "dir": top, "bytes": _tree_bytes(top), "files": files}
        if alone:
            kept.append(dict(entry, alone=alone))
        else:
            removable.append(entry)
    return removable, kept


def undeletable(h, dirs, marks=True):
    """What stops this user from pruning ``dirs`` (backup trees): ``(lock, records, paths)`` —
    ``lock`` the state dir when the lock cannot be taken there, ``records`` the records dir when
    the records cannot be rewritten (``marks``: some record is to be marked), ``paths`` the backup
    files that cannot be deleted (an entry needs write and search permission on its directory) and
    each tree whose own parent forbids it."""
    ok = os.W_OK | os.X_OK
    lock = None if os.access(h.state, ok) else h.state
    records = None if not dirs or not marks or os.access(h.records_dir, ok) else h.records_dir
    bad = []
    for top in dirs:
        if not os.access(os.path.dirname(top), os.W_OK | os.X_OK):
            bad.append(top)
        for dirpath, dirnames, names in os.walk(top):
            if not os.access(dirpath, ok):
                bad += [os.path.join(dirpath, n) for n in sorted(names)]
    return lock, records, bad


def _owner(path):
    try:
        return user_name(os.lstat(path).st_uid)
    except OSError:
        return "?"


def refuse_undeletable(h, lock, records, bad):
    """Fail(not_writable) naming the state dir, the records dir and the backups this user cannot
    change."""
    me = user_name(os.geteuid())
    parts = []
    if lock:
        parts.append("cannot take the lock in the state dir %s (owned by %s)" % (lock, _owner(lock)))
    if records:
        parts.append("cannot rewrite the records in %s (owned by %s)" % (records, _owner(records)))
    if bad:
        rel = [os.path.relpath(b, h.backups_dir) for b in bad]
        shown = ", ".join(rel[:4]) + (" and %d more" % (len(rel) - 4) if len(rel) > 4 else "")
        owners = sorted({_owner(os.path.dirname(b)) for b in bad[:50]})
        parts.append("cannot delete %d backup file(s) in %s (their directories are %s's): %s"
                     % (len(bad), h.backups_dir, ", ".join(owners), shown))
    raise Fail("not_writable", "prune as %s: %s. They were written through `sudo: true` (or by another user): "
               "prune with the same `sudo: true` as the deployments; nothing was pruned and no record was "
               "changed" % (me, "; ".join(parts)), files=bad, state_dir=lock, records_dir=records)


def op_prune(a):
    """Delete the backups of rolled-back deployments but the ``keep`` newest; records stay (history),
    marked ``backups_pruned``. Active deployments' backups are never touched (rollback needs them).

    Nothing is half-done: before the lock is taken and before any record or backup changes, every
    path to delete is checked deletable by this user (backups written through ``sudo: true`` are
    root's: a refusal ``not_writable`` names them). Each record is marked only once its backups are
    gone; a deletion that still fails leaves its record as it was and names what is left."""
    h = HostState(a)
    holder = a.get("holder")
    keep = a.get("keep", 3)
    if not isinstance(keep, int) or isinstance(keep, bool) or keep < 0:
        raise Fail("bad_args", "keep must be a whole number >= 0, got %r" % (keep,))
    j = h.journal()
    if j is not None:
        raise pending_fail(j)
    dry = bool(a.get("dry_run"))

    def plan():
        # the rolled-back deployments whose backups are still here (an earlier prune's are gone:
        # never "kept" again); the `keep` newest of them stay
        done = []
        for r in h.records():
            if r.get("phase") != "rolled_back":
                continue
            did = check_id(r.get("id"))
            dirs = [d for d in (os.path.join(h.backups_dir, did), os.path.join(h.backups_dir, did + ".drifted"))
                    if os.path.isdir(d)]
            if dirs:
                done.append((r, did, dirs))
        cut = max(len(done) - keep, 0)  # done[:cut] lose their backups, done[cut:] keep them
        return done[:cut], [r.get("id") for r, _did, _dirs in done[cut:]]

    todo, kept = plan()
    lost, alone = orphans(h)
    recorded = len(h.records())
    if not todo and not lost:  # nothing to delete (a host never deployed has no state dir at all): no lock
        return {"pruned": [], "kept": kept, "dry_run": dry, "recorded": recorded, "orphans": [],
                "orphans_kept": alone}
    if not dry:
        lock, records, bad = undeletable(h, [d for _r, _did, dirs in todo for d in dirs] + [o["dir"] for o in lost],
                                         marks=bool(todo))
        if lock or records or bad:
            refuse_undeletable(h, lock, records, bad)
        h.acquire(holder, bool(a.get("break_lock")))
    try:
        if not dry:
            j = h.journal()   # under the lock: a push may have begun since the first look
            if j is not None:
                raise pending_fail(j)
            todo, kept = plan()   # the records as they are now
            lost, alone = orphans(h)
        pruned = []
        for r, did, dirs in todo:
            size = sum(_tree_bytes(d) for d in dirs)
            drifted = _files(os.path.join(h.backups_dir, did + ".drifted"))  # said before they go
            if not dry:
                left = []
                for d in dirs:
                    shutil.rmtree(d, onerror=lambda _f, path, _e: left.append(path))
                if left:
                    raise Fail("prune_failed", "could not delete %s of deployment %s: its backups are partly "
                               "deleted and its record is unchanged%s" % (
                                   ", ".join(left[:8]), did, "; pruned before it: %s" % ", ".join(
                                       p["id"] for p in pruned) if pruned else ""),
                               files=left, pruned=pruned)
                r["backups_pruned"] = now()
                write_json(h.record_path(did), r)   # after the deletion: a record never says pruned
            pruned.append({"id": did, "bytes": size, "dirs": dirs, "drifted": drifted})  # while its backups are there
        for o in ([] if dry else lost):   # no record names them: none to mark
            left = []
            shutil.rmtree(o["dir"], onerror=lambda _f, path, _e: left.append(path))
            if left:
                raise Fail("prune_failed", "could not delete %s of the backup %s that no deployment names%s"
                           % (", ".join(left[:8]), o["id"], "; pruned before it: %s" % ", ".join(
                               p["id"] for p in pruned) if pruned else ""), files=left, pruned=pruned)
    finally:
        if not dry:
            h.release(holder, force=True)
    return {"pruned": pruned, "kept": kept, "dry_run": dry, "recorded": recorded, "orphans": lost,
            "orphans_kept": alone}
