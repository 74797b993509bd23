"""Prune: delete, on the host and here, the backups of rolled-back deployments that no rollback
will read again (the ``keep`` newest stay); their records stay, marked ``backups_pruned``.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from ..discovery import HostInfo
from ..inventory import Host
from ..remote.agent_client import make_holder
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
    never deployed has no state dir to lock, and is "nothing to prune"). Raises ValueError for
    keep < 0, StateError for damaged records, DeployError (a pending journal), LockHeldError.
    """
    if int(keep) < 0:
        raise ValueError(f"keep must be >= 0, got {keep}")
    name = host_name(host, transport)
    agent = agent_for(transport, host, info)
    hist = agent.history()
    check_host_records(name, hist)
    takeover = False if dry_run else lock_takeover(name, hist.get("lock"), break_lock, "cannot prune")
    out = agent.prune(int(keep), make_holder(None), dry_run=dry_run, break_lock=takeover)
    for p in out.get("pruned", []):  # the local copies of the same originals
        local = local_paths(home or sglpatch_home(), name, str(p["id"]))[1]
        if local.is_dir():
            p["local"] = str(local)
            if not dry_run:
                shutil.rmtree(local)
    return PruneResult(host=name, pruned=out.get("pruned", []), kept=out.get("kept", []),
                       dry_run=bool(out.get("dry_run")), recorded=out.get("recorded"))
