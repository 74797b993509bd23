"""Deploying patchsets to a host: the client side of the host's deploy agent, one module per step.

A user's ``sglpatch apply`` is :func:`apply_to_host`, ``status`` :func:`host_status`, ``rollback``
:func:`rollback_host`, ``prune`` :func:`prune_host`: plain library calls over a
:class:`~sglang_patcher.transport.base.Transport` (SSH or local), an inventory
:class:`~sglang_patcher.inventory.Host` and the discovered
:class:`~sglang_patcher.discovery.HostInfo`.

The steps, each its own module (``docs/architecture.md`` has the table):

* :mod:`.agent` — the host's agent for a Host (the client itself is
  :mod:`sglang_patcher.remote.agent_client`), the lock take-over rule, progress reports;
* :mod:`.plan` — what an apply would do, by hashes (:func:`plan_apply`); :mod:`.pristine` — where
  the pristine bytes it renders against come from; :mod:`.preflight` — the refusal, before
  anything is written, of files the host's user could not replace;
* :mod:`.transaction` — the apply: inspect, plan, push (stage, verify, rename under the host's
  journal), smoke checks, finish; resumed or rolled back when interrupted;
* :mod:`.rollback` — restore the originals, putting lost host backups back first;
* :mod:`.status` — the state of every touched file; :mod:`.prune` — drop old backups;
* :mod:`.records` — the host's deployment records and their local copies;
* :mod:`.results` — every step's result type with its rendering (``__rich__``, ``to_json``).

The names below are re-exported so that ``from sglang_patcher.deploy import apply_to_host`` keeps
working.
"""

from ..remote.agent_client import (AgentClient, AgentDriftError, AgentError, AgentLockHeldError, AgentStateError,
                                   describe_holder, holder_is_stale, make_holder, payload_tar, untar)
from .plan import plan_apply
from .pristine import PristineSource, wheel_reader
from .prune import prune_host
from .records import ACTIVE, check_host_records, damaged_records, save_local_record, sync_local_records
from .results import (OVERALL_STATES, DeployPlan, DeployResult, FilePlan, FileStatus, PruneResult, RollbackResult,
                      StatusReport, diff_view, diffstat)
from .rollback import rollback_host
from .status import host_status
from .transaction import apply_to_host, new_deployment_id

__all__ = ["apply_to_host", "plan_apply", "rollback_host", "host_status", "prune_host", "DeployPlan",
           "DeployResult", "FilePlan", "StatusReport", "FileStatus", "RollbackResult", "PruneResult",
           "OVERALL_STATES", "ACTIVE", "PristineSource", "AgentClient", "AgentError", "AgentDriftError",
           "AgentLockHeldError", "AgentStateError", "wheel_reader", "save_local_record", "sync_local_records",
           "check_host_records", "damaged_records", "new_deployment_id", "make_holder", "describe_holder",
           "holder_is_stale", "payload_tar", "untar", "diff_view", "diffstat"]
