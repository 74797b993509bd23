"""``prune``: delete the backups of rolled-back deployments but the newest few; their records
stay (the host's history), marked ``backups_pruned``."""

from __future__ import annotations

import os
import shutil

from .base import Fail, check_id, now
from .files import write_json
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
