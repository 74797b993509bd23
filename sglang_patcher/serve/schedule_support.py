"""Whether a host can serve a DDTREE budget schedule, said before any server starts.

A profile's ``serve.ddtree.budget_schedule`` (or ``bench``'s ``auto`` arm) reaches the server as
``--speculative-ddtree-budget-schedule``. The server refuses what the deployed ddtree revision
cannot run — a schedule before revision 3, ``chain`` entries before 4, ``auto`` before 7 — and, in
every revision so far, a schedule of several verify widths (``auto`` and any ``chain`` entry
included) while the target's CUDA graphs are captured (one width). It refuses late: after the
server has parsed its arguments, or loaded the model. ``check``, ``bench`` and ``apply``'s gates
ask :func:`refuse_unservable_schedule` first and stop with one configuration error (exit 2) that
names the host, the file and the way out.
"""

from __future__ import annotations

from collections.abc import Collection

from ..errors import ConfigError
from ..inventory import Host
from ..patchset import BUDGET_AUTO, BUDGET_SCHEDULE, BUDGET_SCHEDULE_CHAIN
from .profile import ServeProfile
from .schedule import CHAIN, is_auto, parse_entries

__all__ = ["refuse_unservable_schedule"]


def refuse_unservable_schedule(host: Host, profile: ServeProfile, schedule: str | None, *,
                               features: Collection[str] | None, carried: str = "",
                               budget: int | None = None) -> None:
    """Raise ConfigError when DDTREE with ``schedule`` (the profile's, or a bench arm's ``"auto"``;
    None: nothing to check) cannot be served on ``host``: the deployed revision (``features`` of
    :data:`sglang_patcher.patchset.FEATURES`; ``carried`` says which, e.g. ``"ddtree r6"``; None:
    not known yet, only the profile is checked) lacks what the schedule asks for, or the profile
    keeps CUDA graphs for a schedule of several widths.
    ``budget``: the server's --speculative-ddtree-budget (the profile's when None), which clamps
    every tree budget of a table."""
    if schedule is None:
        return
    where = f"serve.ddtree.budget_schedule of host {host.name} in {host.inventory_file}"
    if is_auto(schedule):
        need, what, several = BUDGET_AUTO, "auto budget planner (ddtree revision 7 on)", True
    else:
        entries = parse_entries(schedule)
        top = profile.ddtree.budget if budget is None else budget
        widths = {CHAIN if n == CHAIN else min(n, top) for _, n in entries}
        chain = CHAIN in widths
        need = BUDGET_SCHEDULE_CHAIN if chain else BUDGET_SCHEDULE
        what = ("chain entries in a budget schedule (ddtree revision 4 on)" if chain
                else "a budget schedule (ddtree revision 3 on)")
        several = len(widths) > 1
    if features is not None and need not in features:
        raise ConfigError(f"host {host.name} carries {carried}, which has no {what}: DDTREE would not "
                          f"start with budget schedule {schedule!r}",
                          hint=f"apply a newer ddtree revision first, or change {where}")
    if several and "--disable-cuda-graph" not in profile.args:
        raise ConfigError(f"host {host.name}: DDTREE budget schedule {schedule!r} verifies at several "
                          "widths, which this ddtree revision runs only with --disable-cuda-graph (the "
                          "target's CUDA graphs are captured at one width)",
                          hint=f"add --disable-cuda-graph to serve.args of host {host.name} in "
                               f"{host.inventory_file}, or use a fixed budget")
