"""``sglpatch bench``: the arms' throughput side by side on a host, stored, compared, plotted; with
``--sweep`` the schedule it picks goes into the inventory (:mod:`.service_sweep`)."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from . import deploy
from .errors import ConfigError
from .inventory import Host
from .serve.bench import Arm as BenchArm, BenchRun, last_comparable, plot, run_bench, store
from .serve.check import load_prompts
from .serve.profile import PROFILE_SCHEDULE, ServeProfile
from .patchset import BUDGET_AUTO_DEFAULT
from .serve.schedule import AUTO, FIXED, is_auto
from .serve.schedule_support import refuse_unservable_schedule
from .serve.server import check_model_paths
from .service import Log, quiet, session
from .service_sweep import deployed_features, write_sweep

__all__ = ["bench_host"]


def bench_host(host: Host, *, arms: Sequence[str] = ("none", "DFLASH", "DDTREE"),
               concurrency: Sequence[int] | None = None, budgets: Sequence[int | str] | None = None,
               requests: int | None = None, max_new_tokens: int | None = None,
               prompts: str | Path | None = None, rounds: int = 1, compare: bool = False,
               plot_path: Path | None = None, store_run: bool = True, sweep: bool = False,
               inventory_path: Path | None = None, client: str = "auto", home: Path | None = None,
               log: Log = quiet) -> BenchRun:
    """``sglpatch bench``: output tokens/s, time per output token and accept length of ``arms``
    (``none``, ``DFLASH``, ``DDTREE`` at each of ``budgets``; ``"auto"`` among them: DDTREE with
    ``--speculative-ddtree-budget-schedule auto`` up to the profile's budget, where the deployed
    revision has the planner; ``"schedule"``: the profile's ``ddtree.budget_schedule``, the
    default where it has one — DDTREE as the host serves it) at each ``concurrency``, measured
    side by side on the host (defaults from the host's ``serve.bench`` profile). The run is stored
    in the local history; ``compare`` attaches the last comparable run; ``plot_path`` draws tokens/s
    against concurrency. ``sweep``: DDTREE at every budget (DFLASH beside it), then the fastest
    budget per concurrency becomes the host's ``serve.ddtree.budget_schedule`` in
    ``inventory_path`` (comments kept) — where the deployed revision can serve it
    (:mod:`.service_sweep`); otherwise the schedule is only shown.

    Raises ConfigError (no serve profile, ``plot_path`` without matplotlib, no draft model for a
    speculative arm, a model path
    missing on the host, ``auto`` or a schedule the deployed revision cannot serve — before
    revision 9 none of several widths beside CUDA graphs — said before any server starts),
    ServerError
    (exit 9: a server did not start, or failed or died during the run), TransportError.
    """
    profile = host.serve
    if profile is None:
        raise ConfigError(f"host {host.name} has no serve profile: bench starts servers",
                          hint=host.serve_hint("`serve:` (model, draft_model, args...)"))
    unknown = [a for a in arms if a not in ("none", "DFLASH", "DDTREE")]
    if unknown:
        raise ConfigError(f"unknown bench arm(s) {', '.join(unknown)}", hint="arms are none, DFLASH, DDTREE")
    if any(a != "none" for a in arms) and not profile.draft_model:
        raise ConfigError(f"host {host.name}: DFLASH and DDTREE need serve.draft_model",
                          hint="add the DFlash draft model's path on the host, or bench --arms none")
    if plot_path is not None:   # said before the run, not after an hour of it
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise ConfigError("--plot needs matplotlib, which is not installed here",
                              hint="pip install matplotlib (it comes with sglpatch's ddtree extra: "
                                   "pip install -e '.[ddtree]'), or leave --plot out") from None
    cfg = profile.bench
    conc = list(concurrency or cfg.concurrency)
    arm_list = [BenchArm(a) for a in arms if a != "DDTREE"]
    if "DDTREE" in arms:
        arm_list += _ddtree_arms(host, profile, list(budgets or cfg.budgets), sweep=sweep, log=log)
    texts = load_prompts(prompts)
    with session(host) as (transport, info):
        check_model_paths(transport, host, profile, draft=any(a != "none" for a in arms))
        active = deploy.host_status(transport, host, info, None).active
        ps = (str(active[-1]["patchset"]), int(active[-1]["revision"])) if active else None
        features = deployed_features(*(ps or (None, None)))
        # a fixed budget is said as `fixed` where an unset schedule is auto (revision 13 on)
        arm_list = [a.for_revision(BUDGET_AUTO_DEFAULT in features) for a in arm_list]
        for sched in sorted({a.schedule for a in arm_list if a.schedule}):
            refuse_unservable_schedule(host, profile, sched, features=features,
                                       carried=f"{ps[0]} r{ps[1]}" if ps else "no sglpatch deployment")
        run = run_bench(transport, host, info, arm_list, conc, texts,
                        requests=requests or cfg.requests, max_new_tokens=max_new_tokens or cfg.max_new_tokens,
                        rounds=rounds, patchset=ps, client=client, progress=log)
    if compare:
        run.previous = last_comparable(run, home)
    if store_run:
        store(run, home)
    if plot_path is not None:
        plot(run, plot_path)
    if sweep:
        write_sweep(run, host, profile, inventory_path)
    return run


def _ddtree_arms(host: Host, profile: ServeProfile, budgets: list[int | str], *, sweep: bool,
                 log: Log) -> list[BenchArm]:
    """The DDTREE arms of ``budgets`` (``bench --budgets`` or ``serve.bench.budgets``; empty: the
    profile's budget schedule as served, else its fixed budget; a sweep measures fixed budgets).
    Raises ConfigError for ``schedule`` on a profile without one."""
    schedule = profile.ddtree.budget_schedule
    if not budgets and not sweep:
        # DDTREE as served: the profile's schedule, else the server's default (auto from ddtree
        # revision 13 on, the fixed budget before: Arm.for_revision tells once it is known)
        return [BenchArm("DDTREE", profile.ddtree.budget, profile.ddtree.topk, schedule)]
    if not budgets:
        budgets = [profile.ddtree.budget]
    elif schedule is not None and schedule != FIXED and PROFILE_SCHEDULE not in budgets and not sweep:
        # said, not silently dropped: the host serves DDTREE with its schedule, these arms do not
        log(f"{host.name}: the DDTREE arm(s) run fixed budgets {', '.join(map(str, budgets))}; the profile "
            f"serves DDTREE with budget_schedule {schedule!r} — add `schedule` to --budgets to measure it too")
    out: list[BenchArm] = []
    for b in budgets:
        if b == PROFILE_SCHEDULE:
            if schedule is None:
                raise ConfigError(f"--budgets schedule: host {host.name}'s serve profile has no "
                                  "ddtree.budget_schedule to measure",
                                  hint=f"set serve.ddtree.budget_schedule of {host.name} in {host.inventory_file}, "
                                       "or give fixed budgets / auto")
            arm = BenchArm("DDTREE", profile.ddtree.budget, profile.ddtree.topk, schedule)
        elif is_auto(b):
            arm = BenchArm("DDTREE", profile.ddtree.budget, profile.ddtree.topk, AUTO)
        else:
            arm = BenchArm("DDTREE", int(b), profile.ddtree.topk, FIXED)
        if arm not in out:   # `auto,schedule` on a profile whose schedule is auto: one arm
            out.append(arm)
    return out
