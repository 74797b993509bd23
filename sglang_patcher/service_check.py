"""``sglpatch check``: levels 0-1 (the active patchset's smoke checks on the host's files) and,
with a serve profile, 2 and 3 (the patched server starts and answers; DFLASH and DDTREE greedy
tokens equal the target alone's)."""

from __future__ import annotations

from pathlib import Path

from . import deploy
from .checks import CheckReport, CheckResult, run_checks
from .errors import ConfigError
from .inventory import Host
from .patchset import load_patchset
from .serve.check import CheckRun, load_prompts, run_serving_levels
from .serve.schedule_support import refuse_unservable_schedule, served_profile
from .service_sweep import deployed_features
from .serve.server import check_model_paths, list_servers, stop_server
from .service import Log, quiet, session

__all__ = ["check_host"]


def check_host(host: Host, *, level: int | None = None, prompts: str | Path | None = None,
               stop_leftovers: bool = False, log: Log = quiet) -> CheckRun:
    """``sglpatch check``: levels 0-1 (the active patchset's smoke checks on the host's files) and,
    with a serve profile, 2 (the patched server starts and answers) and 3 (greedy tokens of
    DFLASH and DDTREE equal the target alone's).

    ``level`` defaults to the highest the host's profile allows (3 with a draft model, 2 with a
    model, else 1). Raises ConfigError (a level the profile cannot run, a bad prompts file, a
    profile's model path missing on the host, a budget schedule the deployed revision or the
    profile cannot serve: :mod:`.serve.schedule_support`), TransportError; a failed check is a result (``CheckRun.passed``), not an exception.
    """
    most = host.serve.max_level() if host.serve is not None else 1
    level = most if level is None else level
    if level > most:
        why = ("it has no serve profile (`serve:` with model and draft_model)" if host.serve is None
               else "its serve profile has no draft_model")
        raise ConfigError(f"host {host.name} cannot be checked at level {level}: {why}",
                          hint=f"use --level {most}; " + host.serve_hint())
    texts = load_prompts(prompts) if level >= 2 else []
    with session(host) as (transport, info):
        if level >= 2 or stop_leftovers:
            for srv in list_servers(transport, host, info):
                if srv.get("alive") and stop_leftovers:
                    stop_server(transport, host, info, str(srv["name"]))
                    log(f"{host.name}: stopped the leftover server {srv['name']} (pid {srv['pid']}, "
                        f"port {srv.get('port')})")
        active = deploy.host_status(transport, host, info, None).active
        if level >= 2 and active and host.serve is not None:   # a missing model is said before any check runs
            check_model_paths(transport, host, host.serve)
            last = active[-1]
            refuse_unservable_schedule(host, host.serve, host.serve.ddtree.budget_schedule,
                                       features=deployed_features(str(last["patchset"]), int(last["revision"])),
                                       carried=f"{last['patchset']} r{last['revision']}")
        if active:
            last = active[-1]
            ps = load_patchset(f"{last['patchset']}@{last['revision']}")
            log(f"{host.name}: L0/L1 of {ps.name} r{ps.revision} (the active deployment {last['id']})")
            report = run_checks(transport, host, info, ps.touched_paths(str(info.sglang_version)), ps,
                                levels=("L0",) if level == 0 else ("L0", "L1"))
            if level == 1 and report.level_status("L1") == "skipped" and not report.failed:
                report.checks.append(_l1_proved_nothing(report, host.name))
        else:
            # nothing to check is a failed check (a CI job's `check` after a forgotten apply must not
            # pass); only a run that came to stop leftover servers leaves it at skipped
            missing = "skipped" if stop_leftovers else "failed"
            report = CheckReport(host=host.name)
            report.checks.append(CheckResult("L0", "a deployment to check", missing,
                                             "no active sglpatch deployment on this host: nothing to "
                                             "check (apply a patchset first)"))
        if level >= 2 and not active:
            report.checks.append(CheckResult("L2", "server start", missing,
                                             "nothing is deployed on this host: a server started now "
                                             "would test the release as it is (apply a patchset first)"))
            return CheckRun(report, level)
        if level >= 2:
            features = deployed_features(str(active[-1]["patchset"]), int(active[-1]["revision"]))
            return run_serving_levels(transport, host, info, report, level, texts, progress=log,
                                      profile=served_profile(host.serve, features) if host.serve else None)
        return CheckRun(report, level)


def _l1_proved_nothing(report: CheckReport, host_name: str) -> CheckResult:
    """L1 asked for (``check --level 1``, a ``check:1`` gate) and every L1 check skipped: a failed
    check, never a pass that proved nothing (the skips' reasons, e.g. a missing module, said)."""
    shown = report.skip_reasons("L1", 3)
    return CheckResult("L1", "smoke checks ran", "failed",
                       f"every L1 check was skipped on {host_name}" + (f" ({shown})" if shown else "")
                       + ": level 1 proved nothing here — install SGLang's dependencies on the host "
                       "(a serving install has them), or ask for --level 0")
