"""``sglpatch bench --sweep``'s last step: the fastest DDTREE budget per concurrency becomes the
host's ``serve.ddtree.budget_schedule`` in the inventory, as far as the revision deployed there can
take it (its ``features``)."""

from __future__ import annotations

from pathlib import Path

from .errors import SglpatchError
from .inventory import Host
from .inventory_edit import set_host_value
from .patchset import BUDGET_SCHEDULE_CHAIN, load_patchset
from .serve.bench import BenchRun, choose_schedule
from .serve.profile import ServeProfile
from .serve.schedule import CHAIN, is_auto, schedule_text
from .serve.schedule_support import schedule_refusal

__all__ = ["deployed_features", "write_sweep"]


def deployed_features(patchset: str | None, revision: int | None) -> frozenset[str]:
    """What the revision deployed on a host can do (:data:`sglang_patcher.patchset.FEATURES`), by
    the ``features`` of the newest revision of that patchset here (it speaks for earlier ones too);
    nothing for a host without a deployment or a patchset this checkout does not have."""
    if patchset is None or revision is None:
        return frozenset()
    try:
        return load_patchset(patchset).features_at(revision)
    except SglpatchError:
        return frozenset()


def write_sweep(run: BenchRun, host: Host, profile: ServeProfile, inventory_path: Path | None) -> None:
    """Set ``run.schedule`` to the schedule chosen from ``run``'s rows ("" without DDTREE rows) and
    write it into ``inventory_path`` as ``hosts.<host>.serve.ddtree.budget_schedule`` (comments
    kept; ``budget`` widened to the widest budget chosen, or set to the one budget of a table
    without chain entries that chose one everywhere: then it serves beside CUDA graphs) — where
    the host could serve it
    (:func:`~sglang_patcher.serve.schedule_support.schedule_refusal`: the deployed revision's
    ``features``, chain entries only with ``budget_schedule_chain``; several widths only with
    ``--disable-cuda-graph``), the profile does not ask for ``auto`` and the host comes from that
    file.
    ``run.schedule_written`` says where it went, or why not. Raises InventoryError (the file does
    not take the value; it is left untouched)."""
    features = deployed_features(run.patchset, run.revision)
    # chain entries (DFlash's own step) only where the deployed revision runs them
    entries = choose_schedule(run, chain=BUDGET_SCHEDULE_CHAIN in features)
    if not entries:
        run.schedule = ""
        return
    run.schedule = schedule_text(entries)
    widths = {n for _, n in entries}
    top = max([n for n in widths if n != CHAIN], default=0)
    # one tree width everywhere: the server budget becomes it (lowered too), so that its CUDA
    # graphs are captured at the one width the table verifies; else widened to the widest only
    budget = top if len(widths) == 1 and CHAIN not in widths else max(top, profile.ddtree.budget)
    carried = f"{run.patchset} r{run.revision}" if run.patchset else "no sglpatch deployment"
    # what check/bench/apply would refuse to serve is not written either
    refusal = schedule_refusal(host, profile, run.schedule, features=features, carried=carried, budget=budget)
    if refusal is not None:
        run.schedule_written = f"not written to {host.name}'s profile: {refusal.reason}"
        return
    if is_auto(profile.ddtree.budget_schedule):
        run.schedule_written = (f"not written to {host.name}'s profile: it asks for auto (the server's own "
                                "planner); set serve.ddtree.budget_schedule to this table yourself to replace it")
        return
    if inventory_path is None or not Path(inventory_path).is_file():
        run.schedule_written = f"not written: {host.name} comes from no inventory file"
        return
    set_host_value(Path(inventory_path), host.name, ["serve", "ddtree", "budget_schedule"], run.schedule)
    if budget != profile.ddtree.budget:
        set_host_value(Path(inventory_path), host.name, ["serve", "ddtree", "budget"], budget)
    run.schedule_written = (f"written to {inventory_path}: hosts.{host.name}.serve.ddtree.budget_schedule"
                            f" = {run.schedule!r}"
                            + (f" and budget = {budget} (was {profile.ddtree.budget})"
                               if budget != profile.ddtree.budget else "")
                            + " (DDTREE starts pass --speculative-ddtree-budget-schedule)")
