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
from .serve.schedule import AUTO, is_auto
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
    revision has the planner) at each ``concurrency``, measured
    side by side on the host (defaults from the host's ``serve.bench`` profile). The run is stored
    in the local history; ``compare`` attaches the last comparable run; ``plot_path`` draws tokens/s
    against concurrency. ``sweep``: DDTREE at every budget (DFLASH beside it), then the fastest
    budget per concurrency becomes the host's ``serve.ddtree.budget_schedule`` in
    ``inventory_path`` (comments kept) — when the profile serves without CUDA graphs, which this
    patchset revision needs for several widths; otherwise the schedule is only shown.

    Raises ConfigError (no serve profile, no draft model for a speculative arm, a model path
    missing on the host, ``auto`` on a host whose revision has no planner or a profile with CUDA
    graphs — said before any server starts), ServerError
    (exit 9: a server did not start, or failed or died during the run), TransportError.
    """
    profile = host.serve
    if profile is None:
        raise ConfigError(f"host {host.name} has no serve profile: bench starts servers",
                          hint=f"add `serve:` (model, draft_model, args...) to {host.name} in the inventory")
    unknown = [a for a in arms if a not in ("none", "DFLASH", "DDTREE")]
    if unknown:
        raise ConfigError(f"unknown bench arm(s) {', '.join(unknown)}", hint="arms are none, DFLASH, DDTREE")
    if any(a != "none" for a in arms) and not profile.draft_model:
        raise ConfigError(f"host {host.name}: DFLASH and DDTREE need serve.draft_model",
                          hint="add the DFlash draft model's path on the host, or bench --arms none")
    cfg = profile.bench
    conc = list(concurrency or cfg.concurrency)
    bud = list(budgets or cfg.budgets or [profile.ddtree.budget])
    arm_list = [BenchArm(a) for a in arms if a != "DDTREE"]
    if "DDTREE" in arms:
        arm_list += [BenchArm("DDTREE", profile.ddtree.budget, profile.ddtree.topk, AUTO) if is_auto(b)
                     else BenchArm("DDTREE", int(b), profile.ddtree.topk) for b in bud]
    schedules = sorted({a.schedule for a in arm_list if a.schedule})
    for sched in schedules:     # the profile's side (CUDA graphs) before any connection
        refuse_unservable_schedule(host, profile, sched, features=None)
    texts = load_prompts(prompts)
    with session(host) as (transport, info):
        check_model_paths(transport, host, profile, draft=any(a != "none" for a in arms))
        active = deploy.host_status(transport, host, info, None).active
        ps = (str(active[-1]["patchset"]), int(active[-1]["revision"])) if active else None
        for sched in schedules:
            refuse_unservable_schedule(host, profile, sched, features=deployed_features(*(ps or (None, None))),
                                       carried=f"{ps[0]} r{ps[1]}" if ps else "no sglpatch deployment")
        run = run_bench(transport, host, info, arm_list, conc, texts,
                        requests=requests or cfg.requests, max_new_tokens=max_new_tokens or cfg.max_new_tokens,
                        rounds=rounds, patchset=ps, client=client, progress=log)
    if compare:
        run.previous = last_comparable(run, home)
    if store_run:
        store(run, home)
    if plot_path is not None:
        try:
            plot(run, plot_path)
        except ImportError:
            log("no plot: matplotlib is not installed (pip install matplotlib)")
    if sweep:
        write_sweep(run, host, profile, inventory_path)
    return run
