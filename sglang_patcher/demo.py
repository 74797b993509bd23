"""README command 1: the whole story on the embedded default target, printed step by step.

snapshot → diff → apply (with smoke checks) → status → re-apply (a clean no-op) → rollback → status,
against a local venv holding the real SGLang wheel (see :mod:`sglang_patcher.sandbox`).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from rich.constrain import Constrain
from rich.rule import Rule

from . import service_apply, service_diff, service_rollback, service_snapshot, service_status
from .deploy import ACTIVE
from .deploy.records import local_records_within, supersede_local_records
from .errors import DeployError, DriftError, StateError
from .patchset import load_patchset
from .sandbox import ensure_sandbox, sandbox_dir, sandbox_host
from .state import sglpatch_home

if TYPE_CHECKING:
    from .cli_app import AppContext


RULE_WIDTH = 100  # the step headings' rules: not the whole width of a log (200 columns when piped)


def _rule(title: str) -> Constrain:
    """A step heading: a rule at most ``RULE_WIDTH`` columns wide (the terminal's width if narrower)."""
    return Constrain(Rule(title), width=RULE_WIDTH)


def retire_sandbox_records(venv: Path, rebuilt: bool, *, home: Path | None = None, log=print) -> list[str]:
    """Before the sandbox venv is built (again): the local deployment records of the install in
    ``venv`` that still say active are marked superseded — that install is deleted now (or was
    deleted by hand), so nothing on it can be rolled back, and a record claiming otherwise would
    make every later ``rollback`` fail (``rebuilt``: the venv is there, to be deleted; else it was
    deleted by hand). Says so through ``log``; returns the ids marked. The sandbox build's
    ``before_build``."""
    home = home or sglpatch_home()
    stale = local_records_within(home, venv)
    if not stale:
        return []
    how = "deleted and built again" if rebuilt else "gone (deleted) and built again"
    ids = supersede_local_records(home, stale, f"the sandbox venv {venv} was {how}: the install this "
                                               "deployment patched no longer exists")
    if ids:
        log(f"sandbox: the venv {venv} is {how}, so the install that deployment(s) {', '.join(ids)} patched "
            f"is gone: their local records ({stale[0].parent}/) are marked superseded, not active — nothing "
            f"to roll back")
    return ids


def run_demo(app: "AppContext", *, version: str, patchset: str, with_deps: bool = False) -> None:
    """Run the story; raises the first :class:`SglpatchError` met (the CLI prints it)."""
    results: dict[str, object] = {}

    def step(title: str) -> None:
        app.say(_rule(f"[bold]{title}"))

    load_patchset(patchset).target(version)   # an unsupported release fails before any install
    step(f"0. the target: a local venv with sglang=={version} from PyPI")
    python = ensure_sandbox(version, with_deps=with_deps, log=app.say, meter=app.meter,
                            before_build=lambda venv, existed: retire_sandbox_records(venv, existed, log=app.say))
    host = sandbox_host(version)
    app.say(f"interpreter {python}")

    step("1. snapshot: mirror the install with a hashed manifest")
    snap = service_snapshot.snapshot_host(host, log=app.say, meter=app.meter)
    app.say(snap)
    results["snapshot"] = snap

    before = service_status.host_status(host, patchset=patchset)
    active = [d["id"] for d in before.deployments if d.get("phase") in ACTIVE]
    if active or before.journal or before.overall != "pristine":  # the user's own: never take it off
        rebuild = f"delete {sandbox_dir(version)} (the demo rebuilds it)"
        if active or before.journal:
            what = (f"deployment {', '.join(active) or before.journal.get('id')} (an earlier "
                    f"`sglpatch apply --host sandbox`?)")
            # stacked deployments (an upgrade over an earlier revision) need one rollback each
            undo = ("`sglpatch rollback --host sandbox`" if len(active) <= 1 else
                    f"`sglpatch rollback --host sandbox --to {active[0]}` (all {len(active)} deployments, newest first)")
            hint = f"take it off with {undo}, or {rebuild}; then run the demo again"
        else:
            edited = [f.path for f in before.files if f.state not in ("pristine", "absent")]
            what = (f"{len(edited)} file(s) that are not the release's ({', '.join(edited[:3])}"
                    f"{', …' if len(edited) > 3 else ''}), with no deployment of sglpatch behind them: edited by hand?")
            hint = f"{rebuild}, then run the demo again (`sglpatch status --host sandbox --patchset {patchset}` names them)"
        raise DeployError(f"sandbox: carries {what}; the demo starts from a pristine sandbox and would change it",
                          hint=hint)
    results["sandbox_before"] = before.overall

    step(f"2. diff: what patchset {patchset!r} would change (strict, fuzz 0)")
    diff = service_diff.diff_patchset(patchset, host=host, log=app.say)
    diff.full = False
    app.say(diff)
    results["diff"] = diff

    step(f"3. apply {patchset}: backup, stage + verify + rename, smoke checks L0/L1")
    try:
        applied = service_apply.apply_patchset(patchset, host, confirm=lambda plan: True, log=app.say)
    except DriftError as exc:
        raise DriftError(f"the sandbox was edited by hand: {exc.message}",
                         hint=f"the sandbox is the demo's own: delete {sandbox_dir(version)} and run "
                              f"the demo again (it rebuilds it)") from exc
    app.say(applied)
    results["apply"] = applied
    if applied.checks is not None and applied.checks.level_status("L1") == "skipped":
        app.say("[yellow]L1 was skipped: the sandbox holds sglang without its dependencies. "
                "`sglpatch demo --with-deps` installs them (~2 GB, once) so L1 really runs.[/]")

    step("4. status: every touched file by hash")
    status = service_status.host_status(host, patchset=patchset)
    app.say(status)
    results["status_after_apply"] = status

    step("5. apply again: a clean no-op")
    again = service_apply.apply_patchset(patchset, host, confirm=lambda plan: True, log=app.say)
    app.say(again)
    results["reapply"] = again

    step("6. rollback: restore the originals, verified against the wheel's RECORD")
    rolled = service_rollback.rollback(host, log=app.say)
    app.say(rolled)
    results["rollback"] = rolled

    step("7. status after rollback")
    final = service_status.host_status(host, patchset=patchset)
    app.say(final)
    results["status_after_rollback"] = final
    if final.overall != "pristine":
        raise StateError(f"sandbox: the files are {final.overall}, not pristine, after the rollback "
                         f"(something was deployed there before the demo started)",
                         hint=f"the sandbox is the demo's own: delete {sandbox_dir(version)} and run "
                              f"the demo again (it rebuilds it)")
    app.say(_rule("[bold green]done: applied, verified, and rolled back to pristine"))
    if app.as_json:
        app.result({k: (v.to_json() if hasattr(v, "to_json") else v) for k, v in results.items()})
