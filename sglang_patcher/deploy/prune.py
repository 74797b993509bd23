"""Prune: delete, on the host and here, the backups of rolled-back deployments that no rollback
will read again (the ``keep`` newest stay), and this machine's backup copies of superseded
deployments (their install was replaced); their records stay, marked ``backups_pruned``.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from ..discovery import HostInfo
from ..inventory import Host
from ..errors import DeployError, LockHeldError
from ..remote.agent_client import describe_holder, make_holder
from ..state import sglpatch_home
from ..transport.base import Transport
from .agent import agent_for, host_name, lock_takeover
from .records import check_host_records, local_paths, mark_backups_pruned, superseded_backups
from .results import PruneResult


def prune_host(transport: Transport, host: Host, info: HostInfo, *, keep: int = 3, dry_run: bool = False,
               break_lock: bool = False, home: Path | None = None) -> PruneResult:
    """Delete, on the host, the backups of its rolled-back deployments but the ``keep`` newest,
    and the local copies of those backups (``home``/backups/<host>/<id>); and this machine's
    backup copies of the host's superseded deployments (their install was replaced), whatever
    ``keep`` says.

    A rolled-back deployment's backups are never read again by a rollback; its record stays (the
    host's history), marked ``backups_pruned``; the edited copies a forced rollback kept beside
    them (``<id>.drifted/``) go too, and the result names them. A superseded deployment has nothing
    on the host to roll back: its local record stays, marked ``backups_pruned``, and the result
    names each copy deleted (``superseded``). Backup trees on the host that no deployment record
    names (``orphans``: left by a failed push of an sglpatch before failed pushes removed their own)
    go too, whatever ``keep`` says, when the host holds every byte of them elsewhere; one that holds
    bytes found nowhere else is kept and named (``orphans_kept``). Active deployments are never
    touched. Takes the host's lock (not for a dry run, nor when nothing is to be deleted on the host: a host never
    deployed has no state dir to lock, and is "nothing to prune"); a lock another process holds
    refuses the prune only when it would delete something on the host (the host is asked first
    what, a dry run), and then nothing is deleted here either. Raises ValueError for keep < 0,
    StateError for damaged records, DeployError (a pending journal; a local copy that cannot be
    deleted, named before anything is deleted), LockHeldError naming what would have been deleted.
    """
    if int(keep) < 0:
        raise ValueError(f"keep must be >= 0, got {keep}")
    home = home or sglpatch_home()
    name = host_name(host, transport)
    local_gone = superseded_backups(home, name)
    if not dry_run:
        refuse_undeletable_local(name, local_gone)
    agent = agent_for(transport, host, info)
    hist = agent.history()
    check_host_records(name, hist)
    takeover = False
    out = None
    if not dry_run:
        try:
            takeover = lock_takeover(name, hist.get("lock"), break_lock, "cannot prune")
        except LockHeldError as exc:  # refused only when there is something to delete on the host
            out = agent.prune(int(keep), make_holder(None), dry_run=True)
            if out.get("pruned") or out.get("orphans"):
                ids = [str(p["id"]) for p in out.get("pruned", []) + out.get("orphans", [])]
                lost = len(out.get("orphans", []))
                raise LockHeldError(
                    f"{name}: cannot prune the backups of {len(ids) - lost} rolled-back deployment(s) "
                    + (f"and {lost} backup(s) no deployment record names " if lost else "")
                    + f"({', '.join(ids[:5])}{', …' if len(ids) > 5 else ''}): the host is locked by "
                    f"{describe_holder(hist.get('lock'))}; nothing was deleted", hint=exc.hint) from exc
            out["dry_run"] = False
    if out is None:
        out = agent.prune(int(keep), make_holder(None), dry_run=dry_run, break_lock=takeover)
    for p in out.get("pruned", []):  # the local copies of the same originals
        local = local_paths(home, name, str(p["id"]))[1]
        if local.is_dir():
            p["local"] = str(local)
            if not dry_run:
                shutil.rmtree(local)
    for i, g in enumerate(local_gone):   # superseded: no rollback reads them again
        if dry_run:
            continue
        left: list[str] = []
        shutil.rmtree(g["dir"], onerror=lambda _f, path, _e: left.append(path))
        if left:
            done = [x["id"] for x in out.get("pruned", [])] + [x["id"] for x in local_gone[:i]]
            raise DeployError(
                f"{name}: could not delete {', '.join(left[:4])}{' and more' if len(left) > 4 else ''} of this "
                f"machine's backup copies of superseded deployment {g['id']} ({g['dir']}): they are partly "
                f"deleted and its local record is unchanged" + (f"; pruned before it: {', '.join(done)}" if done else ""),
                hint=f"make {g['dir']} deletable (or delete it by hand), then rerun `sglpatch prune --host {name}`")
        mark_backups_pruned(Path(g["record"]))
    return PruneResult(host=name, pruned=out.get("pruned", []), kept=out.get("kept", []),
                       dry_run=bool(out.get("dry_run")), recorded=out.get("recorded"), superseded=local_gone,
                       orphans=out.get("orphans", []), orphans_kept=out.get("orphans_kept", []))


def refuse_undeletable_local(name: str, gone: list[dict[str, Any]]) -> None:
    """Before anything is deleted: every local backup copy in ``gone`` (:func:`superseded_backups`)
    can be deleted by this user (write and search permission on each directory holding an entry).
    Raises DeployError naming the directories that cannot be."""
    bad = []
    for g in gone:
        top = Path(g["dir"])
        dirs = [top.parent] + [Path(d) for d, _sub, _names in os.walk(top)]
        bad += [str(d) for d in dirs if not os.access(d, os.W_OK | os.X_OK)]
    if bad:
        raise DeployError(
            f"{name}: cannot delete this machine's backup copies of superseded deployment(s) "
            f"({', '.join(g['id'] for g in gone)}): no write permission on {', '.join(sorted(set(bad))[:4])}; "
            "nothing was pruned",
            hint="fix the permissions of those directories under $SGLPATCH_HOME/backups/ (or run as their owner), "
                 "then rerun")
