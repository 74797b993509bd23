"""Prune: delete, on the host and here, the backups of rolled-back deployments that no rollback
will read again (the ``keep`` newest stay); their records stay, marked ``backups_pruned``.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from ..discovery import HostInfo
from ..inventory import Host
from ..errors import LockHeldError
from ..remote.agent_client import describe_holder, make_holder
from ..state import sglpatch_home
from ..transport.base import Transport
from .agent import agent_for, host_name, lock_takeover
from .records import check_host_records, local_paths
from .results import PruneResult


def prune_host(transport: Transport, host: Host, info: HostInfo, *, keep: int = 3, dry_run: bool = False,
               break_lock: bool = False, home: Path | None = None) -> PruneResult:
    """Delete, on the host, the backups of its rolled-back deployments but the ``keep`` newest,
    and the local copies of those backups (``home``/backups/<host>/<id>).

    A rolled-back deployment's backups are never read again by a rollback; its record stays (the
    host's history), marked ``backups_pruned``; the edited copies a forced rollback kept beside
    them (``<id>.drifted/``) go too, and the result names them. Active deployments are never
    touched. Takes the host's lock (not for a dry run, nor when nothing is to be deleted: a host
    never deployed has no state dir to lock, and is "nothing to prune"); a lock another process
    holds refuses the prune only when it would delete something (the host is asked first what, a
    dry run). Raises ValueError for keep < 0, StateError for damaged records, DeployError (a
    pending journal), LockHeldError naming what would have been deleted.
    """
    if int(keep) < 0:
        raise ValueError(f"keep must be >= 0, got {keep}")
    name = host_name(host, transport)
    agent = agent_for(transport, host, info)
    hist = agent.history()
    check_host_records(name, hist)
    takeover = False
    if not dry_run:
        try:
            takeover = lock_takeover(name, hist.get("lock"), break_lock, "cannot prune")
        except LockHeldError as exc:  # refused only when there is something to delete
            look = agent.prune(int(keep), make_holder(None), dry_run=True)
            if look.get("pruned"):
                ids = [str(p["id"]) for p in look["pruned"]]
                raise LockHeldError(
                    f"{name}: cannot prune the backups of {len(ids)} rolled-back deployment(s) "
                    f"({', '.join(ids[:5])}{', …' if len(ids) > 5 else ''}): the host is locked by "
                    f"{describe_holder(hist.get('lock'))}; nothing was deleted", hint=exc.hint) from exc
            return PruneResult(host=name, pruned=[], kept=look.get("kept", []), dry_run=False,
                               recorded=look.get("recorded"))
    out = agent.prune(int(keep), make_holder(None), dry_run=dry_run, break_lock=takeover)
    for p in out.get("pruned", []):  # the local copies of the same originals
        local = local_paths(home or sglpatch_home(), name, str(p["id"]))[1]
        if local.is_dir():
            p["local"] = str(local)
            if not dry_run:
                shutil.rmtree(local)
    return PruneResult(host=name, pruned=out.get("pruned", []), kept=out.get("kept", []),
                       dry_run=bool(out.get("dry_run")), recorded=out.get("recorded"))
