"""The apply transaction: inspect, plan, push, smoke checks, finish — as one named deployment that
either ends ``verified`` on the host or is rolled back, and is never left half-written.

A user's ``sglpatch apply`` is :func:`apply_to_host`, in round trips over one transport:

1. ``inspect`` — live sha256/mode/owner of every touched file, the lock, a pending journal, history.
   A pending journal from an interrupted run is dealt with first: the same patchset+revision is
   resumed (``resume``) and verified by the smoke checks; anything else is rolled back. The result
   says which (``DeployResult.recovered``).
2. The plan (:mod:`.plan`): the patchset rendered against PRISTINE bytes (the mirror; the PyPI
   wheel cache or a backup when the mirror holds patched files), every pristine byte checked against
   the patchset's pristine sha256; each file's state by hashes. Drifted files →
   :class:`DriftError` listing them (unless ``force``). A file to write or delete that the host's
   user cannot replace (immutable, its directory not writable by that user, ...: ``inspect``'s
   ``blocked``) → :class:`DeployError` (exit 8) naming each, before anything is written, a dry run
   too (:mod:`.preflight`). All patched → a clean no-op.
3. ``push`` — one tar of the new contents; the host agent locks, checks disk and permission,
   compares each file's live sha256 with the one the plan saw (a compare-and-swap under the lock:
   another apply or rollback that ran between this one's inspect and its push makes it refuse,
   ``changed``, exit 8, before any write), checks drift again against the allowed hashes,
   journals the deployment (``staging``), backs up
   the originals, stages each new file beside its target and verifies its sha256, renames them over
   the targets (``committing``), purges bytecode and records the deployment (``pushed``).
4. Smoke checks (:mod:`sglang_patcher.checks`): L0 ``py_compile`` (1 round trip), L1 the patchset
   script (1). A failed gate rolls back by itself and raises :class:`CheckFailedError` with the
   check output.
5. ``finish`` — record verified, release the lock. A local copy of the record and of the backups
   is kept under ``sglpatch_home()/deployments/<host>/`` and ``backups/<host>/`` (:mod:`.records`).

Interruptions (a killed agent, a dropped connection, Ctrl-C during the checks) leave the host's
journal and lock behind; the next apply resumes (same patchset and revision) or rolls back, and says
so. A lock whose holder is a dead process of THIS machine is taken over by itself; any other holder
needs ``break_lock`` (the CLI's ``--break-lock``).

So a first apply is 5 round trips whatever the number of files (plus 1 when the originals are at an
earlier revision and must be fetched for the local backup copy); a re-apply is 1.
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any, Callable

from ..checks import CheckReport, run_checks
from ..discovery import HostInfo
from ..errors import CheckFailedError, DriftError
from ..inventory import Host
from ..mirror import Mirror
from ..patchset import Patchset
from ..remote.agent_client import AgentClient, AgentError, make_holder
from ..state import sglpatch_home
from ..transport.base import Transport
from .agent import Progress, agent_for, host_name, lock_takeover, no_progress
from .plan import allowed_hashes, patchset_view, plan_apply, refuse_downgrade
from .preflight import refuse_unwritable
from .pristine import Reader, sha256_or_none
from .records import check_host_records, check_local_writable, save_local_record, sync_local_records
from .results import DeployPlan, DeployResult


def new_deployment_id(patchset: str, revision: int | str) -> str:
    """A unique, time-sortable deployment id: ``<UTC time>-<patchset>-r<revision>-<6 hex>``."""
    return f"{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{patchset}-r{revision}-{uuid.uuid4().hex[:6]}"


def backups_for_local(agent: AgentClient, plan: DeployPlan, record: dict[str, Any]) -> dict[str, bytes]:
    """Originals of a pushed deployment, from bytes we hold when the hash matches, else the host."""
    out: dict[str, bytes] = {}
    need_host = False
    for p, f in record.get("files", {}).items():
        before = f.get("before")
        if before is None:
            continue
        data = None
        for cand in (plan.contents.get(p), plan.pristine_bytes.get(p)):
            if cand is not None and sha256_or_none(cand) == before:
                data = cand
                break
        if data is None:
            need_host = True
        else:
            out[p] = data
    if need_host:
        out.update(agent.backup_tar(record["id"]))
    return out


def verify_and_finish(agent: AgentClient, transport: Transport, host: Host, info: HostInfo, patchset: Patchset,
                      record: dict[str, Any], holder: dict[str, Any], home: Path, name: str,
                      progress: Progress) -> CheckReport:
    """Run the smoke checks on a pushed deployment; finish it, or roll it back and raise."""
    files = sorted(p for p, f in record["files"].items() if f.get("after") is not None)
    progress("checks", f"L0 py_compile of {sum(p.endswith('.py') for p in files)} file(s), then L1")
    report = run_checks(transport, host, info, files, patchset)
    if not report.gate_passed:
        progress("rollback", f"smoke checks failed; rolling back {record['id']}")
        rb = agent.rollback(record["id"], holder)
        rec = dict(rb["deployment"], checks=report.summary())
        save_local_record(home, name, rec)
        raise CheckFailedError(
            f"{name}: smoke checks failed after pushing {record.get('patchset')} r{record.get('revision')}; "
            f"deployment {record['id']} was rolled back (every file verified against its pre-deploy "
            f"sha256)\n{report.text()}",
            hint="fix the patchset (see the failed checks above) and apply again")
    fin = agent.finish(record["id"], holder, checks=report.summary())
    save_local_record(home, name, fin["deployment"])
    return report


def apply_to_host(transport: Transport, host: Host, info: HostInfo, patchset: Patchset, *,
                  pristine: Mirror | Reader | None = None,
                  dry_run: bool = False, force: bool = False, break_lock: bool = False,
                  confirm: Callable[[DeployPlan], bool] | None = None, progress: Progress | None = None,
                  home: Path | None = None, reserve_bytes: int = 16 << 20) -> DeployResult:
    """Apply ``patchset`` to ``host`` as one transaction (see the module docstring); return what happened.

    ``info`` is the discovery HostInfo of the host. ``confirm(plan)`` is asked before the push
    (False → status ``aborted``, nothing written). ``progress(step, detail)`` is told each step.
    Raises UnsupportedVersionError (the host's SGLang version is not a target), DriftError (files
    changed on the host; lists them; ``force`` overrides), LockHeldError (names the holder;
    ``break_lock`` overrides), DeployError (``kind`` not_writable: a file to write or delete that the
    host's user cannot replace, named with why before anything is written — also when ``dry_run``;
    disk, permission, push failure — nothing half-written, nothing left behind),
    CheckFailedError (a smoke check failed; already rolled back), TransportError.
    """
    t0 = time.monotonic()
    rt0 = transport.round_trips
    home = home or sglpatch_home()
    progress = progress or no_progress
    name = host_name(host, transport)
    agent = agent_for(transport, host, info)
    version = str(info.sglang_version)
    paths, _pristine_h, _expected_h, history = patchset_view(patchset, version, info)
    progress("inspect", f"hashing {len(paths)} file(s) on {name}")
    ins = agent.inspect(sorted(paths))
    check_host_records(name, ins)
    sync_local_records(home, name, ins.get("deployments", []))
    refuse_downgrade(name, ins, patchset)
    recovered: list[str] = []

    def done(status: str, plan: DeployPlan, **kw: Any) -> DeployResult:
        return DeployResult(host=name, status=status, plan=plan, recovered=recovered,
                            round_trips=transport.round_trips - rt0, seconds=time.monotonic() - t0, **kw)

    j = ins.get("journal")
    if not dry_run:  # every path below may change the host: its local records must be writable
        check_local_writable(home, name)
    if j is not None and dry_run:
        recovered.append(f"deployment {j.get('id')} ({j.get('patchset')} r{j.get('revision')}) was interrupted "
                         f"in phase {j.get('phase')}; a real run resumes it (same patchset and revision) or "
                         f"rolls it back first")
    if j is not None and not dry_run:
        takeover = lock_takeover(name, ins.get("lock"), break_lock, f"deployment {j.get('id')} is pending")
        holder = make_holder(j.get("id"))
        same = j.get("patchset") == patchset.name and str(j.get("revision")) == str(patchset.revision)
        resumed = None
        if same and j.get("phase") in ("staging", "committing", "pushed"):
            try:
                resumed = agent.resume(j["id"], holder, break_lock=takeover)["deployment"]
            except AgentError as exc:
                if exc.kind != "not_resumable":
                    raise
        if resumed is not None:
            progress("resume", f"deployment {j['id']} was interrupted in phase {j.get('phase')}; verifying it")
            plan = plan_apply(transport, host, info, patchset, pristine=pristine, agent=agent,
                              inspect=agent.inspect(sorted(paths)), home=home)
            save_local_record(home, name, resumed, backups_for_local(agent, plan, resumed))  # as a push does
            report = verify_and_finish(agent, transport, host, info, patchset, resumed, holder, home, name,
                                       progress)
            recovered.append(f"resumed interrupted deployment {j['id']} (was {j.get('phase')}) and verified it")
            return done("resumed", plan, deployment_id=j["id"], record=resumed, checks=report)
        progress("rollback", f"rolling back interrupted deployment {j.get('id')} (phase {j.get('phase')})")
        rb = agent.rollback(j["id"], holder, break_lock=takeover)
        save_local_record(home, name, rb["deployment"])
        recovered.append(f"rolled back interrupted deployment {j['id']} (was {j.get('phase')})")
        ins = agent.inspect(sorted(paths))

    plan = plan_apply(transport, host, info, patchset, pristine=pristine, agent=agent, inspect=ins, home=home)
    if plan.drifted and not force:
        lines = [f"{p}: live {(plan.files[p].live or 'absent')[:16]}, pristine "
                 f"{(plan.files[p].pristine or 'absent')[:16]}, expected {(plan.files[p].expected or 'absent')[:16]}"
                 for p in plan.drifted]
        err = DriftError(f"{name}: {len(plan.drifted)} file(s) match neither the pristine nor any revision "
                         f"of {patchset.name}:\n    " + "\n    ".join(lines),
                         hint="someone changed them on the host; look at them, then rerun with --force "
                              "to overwrite (they are backed up first)")
        err.files = plan.drifted  # type: ignore[attr-defined]
        raise err
    refuse_unwritable(name, plan, ins)   # a file the push could not replace: refused now, a dry run too
    if dry_run and (plan.to_push or j is not None):  # a pending journal: the real run would
        return done("dry_run", plan)                 # resume it or roll it back, never a no-op
    if not plan.to_push:
        return done("already_applied", plan)
    if ins.get("journal") is None:
        push_takeover = lock_takeover(name, ins.get("lock"), break_lock, "cannot deploy")
    else:
        push_takeover = False
    if confirm is not None and not confirm(plan):
        return done("aborted", plan)

    did = new_deployment_id(str(patchset.name), patchset.revision)
    holder = make_holder(did)
    files_spec = {}
    for p, fp in plan.to_push.items():
        files_spec[p] = {"action": fp.action, "sha256": fp.expected if fp.action == "write" else None,
                         "mode": fp.mode, "allowed": allowed_hashes(fp, history),
                         "expect": fp.live}  # compare-and-swap: the agent refuses if the host moved on
    deployment = {"id": did, "patchset": patchset.name, "revision": int(patchset.revision),
                  "sglang_version": version,
                  "client": {k: holder[k] for k in ("user", "host", "pid")}}
    progress("push", f"{len(files_spec)} file(s) → {name} (stage, verify, rename)")
    pushed = agent.push(deployment, files_spec, plan.contents, holder, force=force, break_lock=push_takeover,
                        reserve_bytes=reserve_bytes)["deployment"]
    backups = backups_for_local(agent, plan, pushed)
    local = save_local_record(home, name, pushed, backups)
    report = verify_and_finish(agent, transport, host, info, patchset, pushed, holder, home, name, progress)
    record = json.loads(local.read_text())
    return done("applied", plan, deployment_id=did, record=record, checks=report, local_record=str(local))
