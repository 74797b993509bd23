"""``sglpatch rollback`` and ``prune``: undo a deployment on a host, verified by hash; drop the
backups of old rolled-back ones; find the host of the newest local deployment record."""

from __future__ import annotations

import json
from pathlib import Path

from . import deploy
from .errors import StateError
from .inventory import Host
from .service import Log, quiet, session, step_progress
from .state import sglpatch_home

__all__ = ["rollback", "prune", "latest_deployment_host"]


def rollback(host: Host, *, deployment: str | None = None, break_lock: bool = False,
             force: bool = False, home: Path | None = None,
             log: Log = quiet) -> deploy.RollbackResult:
    """Undo ``deployment`` (default: the latest active one) on ``host``, verified by hash.

    Files edited on the host since the deployment are refused as drift unless ``force``."""
    with session(host) as (transport, info):
        return deploy.rollback_host(transport, host, info, deployment, break_lock=break_lock,
                                    force=force, home=home, progress=step_progress(log))


def prune(host: Host, *, keep: int = 3, dry_run: bool = False, break_lock: bool = False,
          home: Path | None = None) -> deploy.PruneResult:
    """Delete ``host``'s backups of rolled-back deployments but the ``keep`` newest, and their local
    copies (:func:`sglang_patcher.deploy.prune_host`)."""
    with session(host) as (transport, info):
        return deploy.prune_host(transport, host, info, keep=keep, dry_run=dry_run, break_lock=break_lock,
                                 home=home)


def latest_deployment_host(home: Path | None = None) -> str:
    """The host of the newest local deployment record. Raises StateError when there is none."""
    base = (home or sglpatch_home()) / "deployments"
    newest: tuple[str, str] | None = None
    for f in base.glob("*/*.json") if base.is_dir() else []:
        try:
            rec = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
        if not isinstance(rec, dict):  # not a record (hand-edited or foreign): passed over
            continue
        stamp = str(rec.get("created") or rec.get("started") or rec.get("id") or "")
        host = rec.get("host") or f.parent.name
        if newest is None or stamp > newest[0]:
            newest = (stamp, host)
    if newest is None:
        raise StateError(f"no local deployment records under {base}",
                         hint="name the host: `sglpatch rollback --host HOST`")
    return newest[1]
