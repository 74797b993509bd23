"""``sglpatch status``: the state of every touched file on a host, by hashes; with no records there,
judged by the patchsets that target its release; withdrawn revisions named."""

from __future__ import annotations

from typing import Any

from . import deploy
from .errors import SglpatchError
from .inventory import Host
from .patchset import Patchset, load_patchset
from .service import session

__all__ = ["host_status", "withdrawn_warnings"]


def host_status(host: Host, *, patchset: str | None = None) -> deploy.StatusReport:
    """Per touched file: pristine / patched (patchset, revision) / drifted; history; journal."""
    ps = load_patchset(patchset) if patchset else None
    with session(host) as (transport, info):
        report = deploy.host_status(transport, host, info, ps)
        if ps is None and report.journal is None and not report.damaged:
            if not report.files and not report.deployments:
                report = _status_without_records(transport, host, info, report)
            else:
                _add_unrecorded(transport, host, info, report)
    report.warnings += withdrawn_warnings(report.active, ps)
    return report


def withdrawn_warnings(active: list[dict[str, Any]], judged_by: Patchset | None = None) -> list[str]:
    """One line per patchset whose newest active revision on the host (a later revision deployed
    over it supersedes it) is listed as ``withdrawn`` by the patchset (the newest one this checkout
    has, or ``judged_by``), saying why."""
    newest_active: dict[str, dict[str, Any]] = {}
    for dep in active:
        name, rev = dep.get("patchset"), dep.get("revision")
        if name and rev is not None and int(rev) >= int(newest_active.get(name, {}).get("revision", 0)):
            newest_active[str(name)] = dep
    out = []
    for name, dep in sorted(newest_active.items()):
        try:
            newest = judged_by if judged_by is not None and judged_by.name == name else load_patchset(name)
        except SglpatchError:
            continue          # a patchset this checkout does not have: nothing to say about it
        why = newest.spec.withdrawn.get(int(dep["revision"]))
        if why:
            out.append(f"{name} r{dep['revision']} (deployment {dep.get('id')}) is withdrawn: {why}")
    return out


def _add_unrecorded(transport: Any, host: Host, info: Any, report: deploy.StatusReport) -> None:
    """A host with records, judged by them: also judge the files of the patchsets that target its
    release which no record names, and add those not at rest (patched or drifted with no
    deployment of sglpatch behind them — copied in by hand, or left by lost records), so that they
    count in the verdict ("mixed") and the note names them: no rollback will touch them."""
    fits, _ = _patchsets_for(str(info.sglang_version))
    have = {f.path for f in report.files}
    extra = []
    for ps in fits:
        for f in deploy.host_status(transport, host, info, ps).files:
            if f.path not in have and f.state not in ("pristine", "absent"):
                extra.append(f)
                have.add(f.path)
    if extra:
        report.files = sorted(report.files + extra, key=lambda f: f.path)
        said = (f"{len(extra)} file(s) no sglpatch deployment records are not at rest: "
                + ", ".join(f"{f.path} ({f.state}{f' {f.patchset} r{f.revision}' if f.patchset else ''})"
                            for f in extra)
                + " — no rollback will touch them; `sglpatch apply` over them, then rollback, or reinstall sglang")
        report.note = f"{report.note}; {said}" if report.note else said


def _status_without_records(transport: Any, host: Host, info: Any,
                            bare: deploy.StatusReport) -> deploy.StatusReport:
    """A host with no sglpatch record: its state is still decided by hashes — the files of every
    patchset here that targets its release, judged against each (one round trip each); the first
    that is not pristine is the report, else the first. No such patchset: ``bare`` marked
    unchecked (overall "unknown"). The note says what the verdict rests on."""
    version = str(info.sglang_version)
    fits, others = _patchsets_for(version)
    said = "no sglpatch deployment is recorded on this host"
    if not fits:
        bare.unchecked = True
        bare.note = (f"{said} and no patchset here supports sglang {version}, so no file was checked" +
                     (f" (supported: {'; '.join(f'{p.name} ({v})' for p, v in others)})" if others else ""))
        return bare
    judged = [deploy.host_status(transport, host, info, p) for p in fits]
    report = next((r for r in judged if r.overall != "pristine"), judged[0])
    names = ", ".join(f"{p.name} r{p.revision}" for p in fits)
    report.note = f"{said}; judged by the files of {names}"
    if report.overall != "pristine":
        report.note += (f" — {report.patchset}'s files are {report.overall} with no record of a deployment "
                        f"(its records lost or moved?): rollback cannot undo this; restore the host's "
                        f".sglpatch/ records, or reinstall sglang {version}")
    return report


def _patchsets_for(version: str) -> tuple[list[Any], list[tuple[Any, str]]]:
    """The loadable patchsets that target sglang ``version``, and the others with their releases."""
    from .patchset import available_patchsets

    fits, others = [], []
    for _name, where in sorted(available_patchsets().items()):
        try:
            ps = load_patchset(where)
        except SglpatchError:
            continue
        if version in ps.versions:
            fits.append(ps)
        else:
            others.append((ps, ", ".join(ps.versions)))
    return fits, others
