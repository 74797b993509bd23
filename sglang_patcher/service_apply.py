"""``sglpatch apply``: a patchset onto a host (the deploy transaction), then its gates (``check:N``,
``bench:min-ratio=R``), rolling the deployment back when one fails."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Iterable

from . import deploy, mirror
from .errors import CheckFailedError, ConfigError, SglpatchError
from .inventory import Host
from .patchset import Patchset, load_patchset, withdrawn_warning
from .patchset_identity import check_not_an_impostor, check_port_finished
from .progress import SILENT, Meter
from .serve.gate import Gate
from .serve.schedule_support import refuse_unservable_schedule
from .service_sweep import deployed_features
from .serve.server import check_model_paths
from .service import Log, quiet, session, step_progress
from .service_bench import bench_host
from .service_check import check_host
from .service_rollback import rollback

__all__ = ["apply_patchset"]


def apply_patchset(name: str, host: Host, *, dry_run: bool = False, force: bool = False,
                   break_lock: bool = False, confirm: Callable[[Any], bool] | None = None,
                   gates: Iterable[Gate] = (), home: Path | None = None,
                   log: Log = quiet, meter: Meter = SILENT) -> deploy.DeployResult:
    """Apply patchset ``name`` to ``host`` (see :func:`sglang_patcher.deploy.apply_to_host`), then
    run ``gates`` (``check:N``, ``bench:min-ratio=R``).

    Refreshes the host's mirror first (only changed files travel) so pristine bytes are local.
    Raises CheckFailedError (exit 9) when a gate fails, after rolling this deployment back (a
    no-op apply deployed nothing, so nothing is rolled back then; the error says so).
    """
    ps = load_patchset(name)
    gates = list(gates)
    for gate in gates:      # a gate the host cannot run is refused before anything is written
        _gate_possible(host, gate)
    if any(_gate_starts_servers(g) for g in gates) and host.serve is not None:
        refuse_unservable_schedule(host, host.serve, host.serve.ddtree.budget_schedule,
                                   features=deployed_features(ps.name, ps.revision), carried=f"{ps.name} r{ps.revision}")
    # an exact pin of a withdrawn revision is deployed, as pip installs a yanked release pinned with
    # ==, but said before the plan and its confirmation, so that the user can still decline
    withdrawn = withdrawn_warning(ps)
    if withdrawn:
        log(f"warning: {withdrawn}")
    with session(host) as (transport, info):
        if any(_gate_starts_servers(g) for g in gates) and host.serve is not None:
            check_model_paths(transport, host, host.serve)   # a gate that cannot start: said before the push
        version = str(info.sglang_version)
        ps.target(version)
        check_not_an_impostor(ps, version)
        check_port_finished(ps, version)
        log(f"{host.name}: sglang {version} at {info.package_dir}")
        snap = mirror.snapshot(transport, host, info, home=home, meter=meter)
        log(f"{host.name}: mirror refreshed ({snap.counts()})")
        result = deploy.apply_to_host(transport, host, info, ps, pristine=snap.mirror,
                                      dry_run=dry_run, force=force, break_lock=break_lock,
                                      confirm=confirm, progress=step_progress(log), home=home)
    if withdrawn:     # said again beside the plan, and in --json
        result.warnings.append(withdrawn)
    if result.status in ("dry_run", "aborted"):
        return result
    proved_nothing = _l1_all_skipped(result)
    if proved_nothing:    # the apply's smoke gate lets skips pass; `check --level 1` fails them
        result.warnings.append(proved_nothing)
    for gate in gates:
        log(f"{host.name}: gate {gate}")
        try:
            failure = _run_gate(host, gate, log)
        except KeyboardInterrupt:
            raise
        except SglpatchError as exc:    # a server that did not start, a host gone: the gate failed
            failure = str(exc)
        if failure is None:
            continue
        if result.status == "applied" and result.deployment_id:
            rollback(host, deployment=result.deployment_id, home=home, log=log)
            raise CheckFailedError(f"{host.name}: gate {gate} failed; deployment {result.deployment_id} "
                                   f"was rolled back\n{failure}",
                                   hint=f"the host is as it was before this apply; to look at the failure "
                                        f"deployed, apply {name} without the gate, then `sglpatch check "
                                        f"--host {host.name}`")
        raise CheckFailedError(f"{host.name}: gate {gate} failed on a host that already carried this "
                               f"revision (nothing was deployed now, so nothing was rolled back)\n{failure}",
                               hint=f"`sglpatch rollback --host {host.name}` takes the revision off")
    return result


def _gate_starts_servers(gate: Gate) -> bool:
    return gate.kind == "bench" or (gate.kind == "check" and (gate.level is None or gate.level >= 2))


def _gate_possible(host: Host, gate: Gate) -> None:
    most = host.serve.max_level() if host.serve is not None else 1
    need = gate.level if gate.kind == "check" and gate.level is not None else (3 if gate.kind == "bench" else 0)
    if need > most:
        raise ConfigError(f"host {host.name} cannot run the gate {gate}: "
                          + ("it has no serve profile" if host.serve is None else "its serve profile has no draft_model"),
                          hint=host.serve_hint())


def _run_gate(host: Host, gate: Gate, log: Log) -> str | None:
    """None when ``gate`` passes, else what failed (text)."""
    if gate.kind == "check":
        result = check_host(host, level=gate.level, log=log)
        return None if result.passed else result.report.text()
    run = bench_host(host, arms=("DFLASH", "DDTREE"), log=log)
    short = []
    for row in run.rows:
        if row.algorithm != "DDTREE":
            continue
        ratio = run.ratio(row.arm, "DFLASH", row.concurrency)
        if ratio is None or ratio < gate.min_ratio:
            short.append(f"{row.arm} at concurrency {row.concurrency}: "
                         + ("no DFLASH figure" if ratio is None else f"{ratio:.2f}x"))
    if not short:
        return None
    return f"DDTREE tokens/s below {gate.min_ratio:g} x DFLASH's: " + "; ".join(short)


def _l1_all_skipped(result: deploy.DeployResult) -> str | None:
    """The warning for an apply whose L1 smoke checks all skipped (e.g. SGLang's dependencies are
    missing on the host): the deployment was not shown to import, though apply's gate passed
    (skips do not fail it; ``check --level 1`` does fail them). None otherwise."""
    checks = result.checks
    l1 = [c for c in checks.checks if c.level == "L1"] if checks is not None else []
    if not l1 or any(c.status != "skipped" for c in l1):
        return None
    shown = checks.skip_reasons("L1", 2)
    return (f"every L1 smoke check was skipped on {result.host}" + (f" ({shown})" if shown else "")
            + ": the patched modules were not imported, so this apply proves only that they compile "
              f"(L0); `sglpatch check --host {result.host} --level 1` fails until the host has SGLang's "
              "dependencies (a serving install has them)")
