"""Whether a host can serve a DDTREE budget schedule, said before any server starts.

A profile's ``serve.ddtree.budget_schedule`` (or ``bench``'s ``auto`` arm) reaches the server as
``--speculative-ddtree-budget-schedule``. The server refuses what the deployed ddtree revision
cannot run — a schedule before revision 3, ``chain`` entries before 4, ``auto`` before 7,
— and,
before revision 9 (feature ``budget_schedule_graphs``), a schedule of several verify widths
(``auto`` and any ``chain`` entry included), or of one width other than the server budget's,
while the target's CUDA graphs are captured (at the server budget's width). From revision 9 the
graphs replay the server budget's width and the other widths verify eagerly; what the server still
refuses there (chain steps under a budget of the draft's block size - 1, whose width is the
captured one) needs the draft model's block size, which only the server reads: it says so at
start-up. The server refuses late: after it has parsed its arguments, or loaded the model.
``check``, ``bench`` and ``apply``'s gates ask :func:`refuse_unservable_schedule` first and stop
with one configuration error (exit 2) that names the host, the file and the way out; ``bench
--sweep`` asks :func:`schedule_refusal` and does not write a table the host could not serve.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from ..errors import ConfigError
from ..inventory import Host
from ..patchset import (BUDGET_AUTO, BUDGET_AUTO_DEFAULT, BUDGET_SCHEDULE, BUDGET_SCHEDULE_CHAIN,
                         BUDGET_SCHEDULE_GRAPHS)
from .profile import ServeProfile
from .schedule import CHAIN, is_auto, is_fixed, parse_entries

__all__ = ["ScheduleRefusal", "refuse_unservable_schedule", "schedule_refusal", "served_profile"]


def served_profile(profile: ServeProfile, features: Collection[str]) -> ServeProfile:
    """``profile`` as the deployed revision (its ``features``) reads it: a ``fixed`` schedule is
    left out before ddtree revision 13 (``budget_auto_default``), which has no such word and keeps
    every step at the budget when the schedule is unset. Any other profile comes back as is."""
    if not is_fixed(profile.ddtree.budget_schedule) or BUDGET_AUTO_DEFAULT in features:
        return profile
    return profile.model_copy(update={"ddtree": profile.ddtree.model_copy(update={"budget_schedule": None})})


@dataclass(frozen=True)
class ScheduleRefusal:
    """Why a host cannot serve a schedule: ``reason``, one sentence that names the host, and
    ``hint``, the way out (both plain text)."""

    reason: str
    hint: str


def schedule_refusal(host: Host, profile: ServeProfile, schedule: str | None, *,
                     features: Collection[str] | None, carried: str = "",
                     budget: int | None = None) -> ScheduleRefusal | None:
    """Why DDTREE with ``schedule`` (the profile's, a bench arm's ``"auto"`` or a sweep's table;
    None: nothing to check) cannot be served on ``host``, or None when it can: the deployed
    revision (``features`` of :data:`sglang_patcher.patchset.FEATURES`; ``carried`` says which,
    e.g. ``"ddtree r6"``; None: not known yet, nothing is refused) lacks what the schedule asks
    for, or — a revision without ``budget_schedule_graphs`` — the profile keeps CUDA graphs
    (captured at the server budget's verify width) for a schedule of several widths or of another
    width.
    ``budget``: the server's --speculative-ddtree-budget (the profile's when None), which clamps
    every tree budget of a table. Raises ScheduleError (a table that does not parse)."""
    if schedule is None:
        return None
    where = f"serve.ddtree.budget_schedule of host {host.name} in {host.inventory_file}"
    if is_auto(schedule):
        need, what, off_width = BUDGET_AUTO, "auto budget planner (ddtree revision 7 on)", "several widths"
    elif is_fixed(schedule):
        return None     # every revision serves it: before 13 sglpatch leaves it out (served_profile)
    else:
        entries = parse_entries(schedule)
        top = profile.ddtree.budget if budget is None else budget
        widths = {CHAIN if n == CHAIN else min(n, top) for _, n in entries}
        chain = CHAIN in widths
        need = BUDGET_SCHEDULE_CHAIN if chain else BUDGET_SCHEDULE
        what = ("chain entries in a budget schedule (ddtree revision 4 on)" if chain
                else "budget schedule (ddtree revision 3 on)")
        # the graphs are captured at the server budget's width: a table must verify there only
        off_width = ("several widths" if len(widths) > 1 else
                     None if widths == {top} else
                     f"{'DFlash' if chain else 'budget ' + str(min(widths))}'s width, not the server budget {top}'s")
    if features is None:   # the revision is not known yet: asked again once it is
        return None
    if need not in features:
        return ScheduleRefusal(f"host {host.name} carries {carried}, which has no {what}: DDTREE would not "
                               f"start with budget schedule {schedule!r}",
                               f"apply a newer ddtree revision first, or change {where}")
    if off_width and "--disable-cuda-graph" not in profile.args and BUDGET_SCHEDULE_GRAPHS not in features:
        return ScheduleRefusal(f"host {host.name}: DDTREE budget schedule {schedule!r} verifies at {off_width}, "
                               f"which {carried} runs only with --disable-cuda-graph (the target's "
                               "CUDA graphs are captured at the server budget's width)",
                               f"apply ddtree revision 9 or later (other widths verify eagerly beside the "
                               f"graphs), add --disable-cuda-graph to serve.args of host {host.name} in "
                               f"{host.inventory_file}, or use a fixed budget")
    return None


def refuse_unservable_schedule(host: Host, profile: ServeProfile, schedule: str | None, *,
                               features: Collection[str] | None, carried: str = "",
                               budget: int | None = None) -> None:
    """Raise ConfigError (the reason and hint of :func:`schedule_refusal`, same arguments) when
    DDTREE with ``schedule`` cannot be served on ``host``."""
    refusal = schedule_refusal(host, profile, schedule, features=features, carried=carried, budget=budget)
    if refusal is not None:
        raise ConfigError(refusal.reason, hint=refusal.hint)
