"""What each ``sglpatch`` command does, as library calls a user could make from Python.

Every function takes inventory :class:`~sglang_patcher.inventory.Host` objects and names, opens and
closes its own transport, and returns a result object with ``to_json()`` and ``__rich__``. Errors are
the :mod:`sglang_patcher.errors` classes.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from rich.console import Group
from rich.table import Table
from rich.text import Text

from . import deploy, discovery, mirror
from .catalog import list_patchsets, show_patchset  # noqa: F401  (sglpatch patchset list / show)
from .checks import CheckReport, CheckResult, run_checks
from .errors import CheckFailedError, ConfigError, DriftError, SglpatchError, StateError
from .inventory import Host
from .patchset import BUDGET_SCHEDULE, BUDGET_SCHEDULE_CHAIN, Patchset, load_patchset
from .progress import SILENT, Meter
from .serve.check import CheckRun, load_prompts, run_serving_levels
from .inventory_edit import set_host_value
from .serve.bench import Arm as BenchArm, BenchRun, choose_schedule, last_comparable, plot, run_bench, store
from .serve.profile import ServeProfile
from .serve.schedule import CHAIN, schedule_text
from .serve.gate import Gate
from .serve.server import list_servers, stop_server
from .state import sglpatch_home
from .transport import connect

Log = Callable[[Any], None]


def _quiet(_: Any) -> None:
    pass


def _human_bytes(n: int | None) -> str:
    if n is None:
        return "?"
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"


def _progress(log: Log) -> Callable[[str, str], None]:
    def progress(step: str, detail: str) -> None:
        log(Text.assemble(("  • ", "dim"), (f"{step}: ", "bold"), detail))
    return progress


# ------------------------------------------------------------------------------------ inventory

@dataclass
class InventoryListing:
    """The hosts of an inventory, as given (no connection made)."""

    hosts: list[Host]

    def to_json(self) -> dict[str, Any]:
        return {"hosts": [h.model_dump() for h in self.hosts]}

    def __rich__(self) -> Table:
        t = Table(title="hosts", title_justify="left")
        for col in ("host", "transport", "address", "python", "sudo", "tags"):
            t.add_column(col)
        for h in self.hosts:
            t.add_row(h.name, h.transport, h.address, h.python, "yes" if h.sudo else "no",
                      ", ".join(h.tags))
        return t


@dataclass
class HostCheck:
    """One host's ``hosts --check`` outcome: its discovery info, or the error met (never both)."""

    host: Host
    info: Any = None
    error: SglpatchError | None = None
    seconds: float = 0.0


@dataclass
class HostsCheckReport:
    """Per host: discovery info or the error — one failed host never hides the others."""

    checks: list[HostCheck]

    @property
    def ok(self) -> bool:
        return all(c.error is None for c in self.checks)

    @property
    def exit_code(self) -> int:
        codes = [c.error.exit_code for c in self.checks if c.error is not None]
        return max(codes) if codes else 0

    def to_json(self) -> dict[str, Any]:
        out = {}
        for c in self.checks:
            if c.error is not None:
                out[c.host.name] = {"ok": False, "error": c.error.message, "hint": c.error.hint,
                                    "exit_code": c.error.exit_code}
            else:
                out[c.host.name] = {"ok": True, **c.info.to_dict(), "seconds": round(c.seconds, 3)}
        return {"hosts": out, "ok": self.ok}

    def __rich__(self) -> Group:
        t = Table(title="hosts --check", title_justify="left")
        for col in ("host", "python", "sglang", "install", "writable", "free disk", "status"):
            t.add_column(col)
        errors: list[Text] = []   # below the table, full width: a narrow cell wrapped them word by word
        for c in self.checks:
            if c.error is not None:
                t.add_row(c.host.name, c.host.python, "-", "-", "-", "-", Text("failed, below", style="red"))
                named = c.error.message.startswith(f"{c.host.name}:") or c.error.message.startswith(f"{c.host.name} (")
                said = Text.assemble(("" if named else f"{c.host.name}: ", "bold red"), (c.error.message, "red"))
                if c.error.hint:  # what to do (e.g. the ssh-keyscan line), as with --json
                    said.append(f"\n  hint: {c.error.hint}", style="yellow")
                errors.append(said)
                continue
            i = c.info
            t.add_row(c.host.name, f"{i.interpreter} ({i.python_version})", str(i.sglang_version),
                      str(i.package_dir), "yes" if i.writable else Text("no", style="yellow"),
                      _human_bytes(i.free_bytes), Text("ok", style="green"))
        return Group(t, *errors)


def check_hosts(hosts: Iterable[Host]) -> HostsCheckReport:
    """Connect to each host and discover its SGLang install (errors are collected per host)."""
    checks = []
    for h in hosts:
        t0 = time.monotonic()
        try:
            with _session(h) as (transport, info):
                checks.append(HostCheck(h, info=info, seconds=time.monotonic() - t0))
        except SglpatchError as exc:
            checks.append(HostCheck(h, error=exc, seconds=time.monotonic() - t0))
    return HostsCheckReport(checks)


class _session:
    """``with _session(host) as (transport, info)``: connect, discover, always close."""

    def __init__(self, host: Host, *, record: bool = True):
        self.host = host
        self.record = record
        self.transport = None

    def __enter__(self):
        self.transport = connect(self.host)
        try:
            info = discovery.discover(self.transport, self.host, record=self.record)
        except BaseException:
            self.transport.close()
            raise
        return self.transport, info

    def __exit__(self, *exc):
        self.transport.close()


# ------------------------------------------------------------------------------------- snapshot

@dataclass
class SnapshotReport:
    """A snapshot's result plus the host's discovery info."""

    host: Host
    info: Any
    result: mirror.SnapshotResult

    def to_json(self) -> dict[str, Any]:
        return {**self.result.to_dict(), "install": str(self.info.package_dir),
                "interpreter": self.info.interpreter}

    def __rich__(self) -> Table:
        r = self.result
        t = Table(title=f"snapshot of {self.host.name}", title_justify="left", show_header=False)
        t.add_column("", style="bold")
        t.add_column("")
        t.add_row("sglang", f"{self.info.sglang_version} at {self.info.package_dir}")
        t.add_row("mirror", str(r.mirror.root))
        t.add_row("files", f"{r.files} ({r.counts()})")
        t.add_row("transferred", _human_bytes(r.bytes_fetched))
        t.add_row("round trips", str(r.round_trips))
        t.add_row("seconds", f"{r.seconds:.2f}")
        return t


def snapshot_host(host: Host, *, home: Path | None = None, log: Log = _quiet,
                  meter: Meter = SILENT) -> SnapshotReport:
    """Mirror ``host``'s SGLang install locally (only changed files travel; ``meter`` shows it)."""
    with _session(host, record=False) as (transport, info):   # the mirror holds RECORD itself
        log(f"{host.name}: sglang {info.sglang_version} at {info.package_dir}")
        result = mirror.snapshot(transport, host, info, home=home, meter=meter)
    return SnapshotReport(host, info, result)


# ----------------------------------------------------------------------------------------- diff

@dataclass
class DiffReport:
    """The unified diff a patchset makes against one pristine tree, and its per-hunk report."""

    patchset: Patchset
    version: str
    source: str
    result: Any  # applier.ApplyResult
    full: bool = True  # False: a diffstat instead of the whole diff (the demo's view)
    drifted: list[str] = field(default_factory=list)  # host files apply would refuse (diff --host)
    host_plan: str | None = None  # diff --host: what apply would do (DeployPlan.kind)

    @property
    def uncropped(self) -> bool:
        """True when the rendering holds the whole diff: its lines must reach the output whole,
        never cropped or wrapped at the terminal width (``AppContext.result`` honours it)."""
        return self.full

    def diffstat(self) -> list[tuple[str, int, int]]:
        """(path, lines added, lines removed) per changed file, from the unified diff."""
        stats: dict[str, list[int]] = {}
        current = None
        for line in self.result.diff_text().splitlines():
            if line.startswith("+++ "):
                current = line[4:].removeprefix("b/")
                if current == "/dev/null":
                    current = None
                continue
            if line.startswith("--- "):
                old = line[4:].removeprefix("a/")
                current = None if old == "/dev/null" else old
                continue
            if line.startswith("diff --git "):
                current = line.split(" b/", 1)[-1]
                stats.setdefault(current, [0, 0])
                continue
            if current is None:
                continue
            if line.startswith("+"):
                stats.setdefault(current, [0, 0])[0] += 1
            elif line.startswith("-"):
                stats.setdefault(current, [0, 0])[1] += 1
        return [(p, a, r) for p, (a, r) in sorted(stats.items())]

    def to_json(self) -> dict[str, Any]:
        return {
            "patchset": self.patchset.name, "revision": self.patchset.revision,
            "sglang_version": self.version, "against": self.source,
            "files": {p: {"old": c.old is not None and c.changed, "deleted": c.new is None,
                          "added": c.old is None}
                      for p, c in sorted(self.result.changed_files().items())},
            "hunks": [{"patch": h.patch, "path": h.path, "index": h.index, "status": h.status,
                       "offset": h.offset_lines} for h in self.result.hunks],
            "notes": list(self.result.notes),
            "drifted": list(self.drifted),
            "host_plan": self.host_plan,
            "diff": self.result.diff_text(),
            # drift: the diff is shown, but apply would refuse (the command exits with DriftError's code)
            "ok": not self.drifted,
            **({"exit_code": DriftError.exit_code} if self.drifted else {}),
        }

    def summary(self) -> Group:
        """What the diff is (patchset, revision, release, source, counts), its hunks applied at an
        offset, the applier's notes and the drifted host files: everything but the diff itself
        (``sglpatch diff`` prints it on stderr, so that stdout is a clean patch)."""
        changed = self.result.changed_files()
        head = Text.assemble(
            (f"{self.patchset.name} revision {self.patchset.revision}", "bold"),
            f" against sglang {self.version} ({self.source}): {len(changed)} file(s), "
            f"{len(self.result.hunks)} hunk(s) applied strictly")
        offsets = [h for h in self.result.hunks if h.status != "applied"]
        parts: list[Any] = [head]
        for h in offsets:
            parts.append(Text(f"  {h.status}: {h.path} hunk {h.index} ({h.patch})"
                              + (f", offset {h.offset_lines:+d} lines" if h.offset_lines else ""),
                              style="yellow"))
        for note in self.result.notes:
            parts.append(Text(f"  note: {note}", style="yellow"))
        if self.drifted:
            parts.append(Text(f"  drifted on the host ({len(self.drifted)} file(s) match neither the "
                              f"pristine release nor any revision of {self.patchset.name}; this diff starts "
                              f"from their pristine copies, and apply refuses them unless --force): "
                              + ", ".join(self.drifted), style="bold red"))
        return Group(*parts)

    def __rich__(self) -> Group:
        parts: list[Any] = [self.summary()]
        if self.full:
            parts.append(deploy.diff_view(self.result.diff_text()))
        else:
            t = Table(show_header=True, box=None, pad_edge=False)
            t.add_column("file")
            t.add_column("+", justify="right", style="green")
            t.add_column("-", justify="right", style="red")
            for path, added, removed in self.diffstat():
                t.add_row(path, str(added), str(removed))
            parts.append(t)
            parts.append(Text("(`sglpatch diff` shows the whole unified diff)", style="dim"))
        return Group(*parts)


def diff_patchset(name: str, *, host: Host | None = None, version: str | None = None,
                  home: Path | None = None, log: Log = _quiet, meter: Meter = SILENT) -> DiffReport:
    """The diff ``name`` makes: against ``host``'s install (snapshot first) or, with ``version``
    and no host, against the pristine PyPI wheel (no SSH). Against a host the report also says
    what apply would find there (``host_plan``) and which files it would refuse as drifted
    (``drifted``: edited on the host; the diff starts from their pristine copies).

    Raises UnsupportedVersionError, ApplyError (per hunk), PatchsetError, TransportError.
    """
    ps = load_patchset(name)
    if host is None:
        if version is None:
            raise SglpatchError("diff needs a host or an SGLang version")
        ps.target(version)  # unsupported versions fail before any download
        from .wheelcache import pristine_tree

        log(f"pristine tree: sglang=={version} from the PyPI wheel (downloaded once, then cached)")
        tree = pristine_tree(version, home=home, log=log, meter=meter)
        return DiffReport(ps, version, f"wheel sglang=={version}", ps.render(version, tree.read))
    with _session(host) as (transport, info):
        version = str(info.sglang_version)
        ps.target(version)
        snap = mirror.snapshot(transport, host, info, home=home, meter=meter)
        # apply's own plan (one more round trip; writes nothing): its rendering is the diff, its
        # hashes say what apply would find there
        plan = deploy.plan_apply(transport, host, info, ps, pristine=snap.mirror, home=home)
        via = ", ".join(sorted(set(plan.pristine_sources.values())))
        return DiffReport(ps, version, f"host {host.name} (pristine via {via})", plan.result,
                          drifted=plan.drifted, host_plan=plan.kind)


# ------------------------------------------------------------------------ apply / status / rollback

def apply_patchset(name: str, host: Host, *, dry_run: bool = False, force: bool = False,
                   break_lock: bool = False, confirm: Callable[[Any], bool] | None = None,
                   gates: Iterable[Gate] = (), home: Path | None = None,
                   log: Log = _quiet, meter: Meter = SILENT) -> deploy.DeployResult:
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
    with _session(host) as (transport, info):
        version = str(info.sglang_version)
        ps.target(version)
        log(f"{host.name}: sglang {version} at {info.package_dir}")
        snap = mirror.snapshot(transport, host, info, home=home, meter=meter)
        log(f"{host.name}: mirror refreshed ({snap.counts()})")
        result = deploy.apply_to_host(transport, host, info, ps, pristine=snap.mirror,
                                      dry_run=dry_run, force=force, break_lock=break_lock,
                                      confirm=confirm, progress=_progress(log), home=home)
    if result.status in ("dry_run", "aborted"):
        return result
    withdrawn = ps.spec.withdrawn.get(ps.revision)
    if not withdrawn:
        try:
            withdrawn = load_patchset(ps.name).spec.withdrawn.get(ps.revision)
        except SglpatchError:     # given as a directory of a patchset this checkout does not have
            withdrawn = None
    if withdrawn:
        log(f"warning: {ps.name} r{ps.revision} is withdrawn: {withdrawn}")
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
                                   hint=f"`sglpatch check --host {host.name}` reruns the checks")
        raise CheckFailedError(f"{host.name}: gate {gate} failed on a host that already carried this "
                               f"revision (nothing was deployed now, so nothing was rolled back)\n{failure}",
                               hint=f"`sglpatch rollback --host {host.name}` takes the revision off")
    return result


def _gate_possible(host: Host, gate: Gate) -> None:
    most = host.serve.max_level() if host.serve is not None else 1
    need = gate.level if gate.kind == "check" and gate.level is not None else (3 if gate.kind == "bench" else 0)
    if need > most:
        raise ConfigError(f"host {host.name} cannot run the gate {gate}: "
                          + ("it has no serve profile" if host.serve is None else "its serve profile has no draft_model"),
                          hint=f"add `serve:` (model, draft_model) to {host.name} in the inventory")


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


def host_status(host: Host, *, patchset: str | None = None) -> deploy.StatusReport:
    """Per touched file: pristine / patched (patchset, revision) / drifted; history; journal."""
    ps = load_patchset(patchset) if patchset else None
    with _session(host) as (transport, info):
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


def rollback(host: Host, *, deployment: str | None = None, break_lock: bool = False,
             force: bool = False, home: Path | None = None,
             log: Log = _quiet) -> deploy.RollbackResult:
    """Undo ``deployment`` (default: the latest active one) on ``host``, verified by hash.

    Files edited on the host since the deployment are refused as drift unless ``force``."""
    with _session(host) as (transport, info):
        return deploy.rollback_host(transport, host, info, deployment, break_lock=break_lock,
                                    force=force, home=home, progress=_progress(log))


def prune(host: Host, *, keep: int = 3, dry_run: bool = False, break_lock: bool = False,
          home: Path | None = None) -> deploy.PruneResult:
    """Delete ``host``'s backups of rolled-back deployments but the ``keep`` newest, and their local
    copies (:func:`sglang_patcher.deploy.prune_host`)."""
    with _session(host) as (transport, info):
        return deploy.prune_host(transport, host, info, keep=keep, dry_run=dry_run, break_lock=break_lock,
                                 home=home)


def latest_deployment_host(home: Path | None = None) -> str:
    """The host of the newest local deployment record. Raises StateError when there is none."""
    base = (home or sglpatch_home()) / "deployments"
    newest: tuple[str, str] | None = None
    for f in base.glob("*/*.json") if base.is_dir() else []:
        try:
            rec = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
        if not isinstance(rec, dict):  # not a record (hand-edited or foreign): passed over
            continue
        stamp = str(rec.get("created") or rec.get("started") or rec.get("id") or "")
        host = rec.get("host") or f.parent.name
        if newest is None or stamp > newest[0]:
            newest = (stamp, host)
    if newest is None:
        raise StateError(f"no local deployment records under {base}",
                         hint="name the host: `sglpatch rollback --host HOST`")
    return newest[1]


# ------------------------------------------------------------------------------------ maintainer

@dataclass
class RefreshReport:
    patchset: str
    version: str
    hashes: dict[str, dict[str, str | None]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"patchset": self.patchset, "sglang_version": self.version, **self.hashes}

    def __rich__(self):
        t = Table(title=f"{self.patchset}: hashes for sglang {self.version}", title_justify="left")
        t.add_column("file")
        t.add_column("pristine")
        t.add_column("expected")
        for p in sorted(self.hashes.get("expected", {})):
            pr = self.hashes["pristine"].get(p)
            ex = self.hashes["expected"].get(p)
            t.add_row(p, (pr or "absent")[:16], (ex or "deleted")[:16])
        merged = self.hashes.get("already_applied") or []
        if not merged:
            return t
        return Group(t, Text(f"{len(merged)} change(s) already in sglang {self.version} (merged upstream: "
                             f"drop them from this release's series):", style="yellow"),
                     *(Text(f"  {m}", style="yellow") for m in merged))


def _release_tree_reader(base: Path, version: str, log: Log, *, unverified: bool = False,
                         supported: list[str] | None = None) -> Callable[[str], bytes | None]:
    """A reader of the release files under ``base`` (a site-packages-like directory) for refresh.

    Where ``base`` holds ``sglang-<v>.dist-info`` (an install or an unpacked wheel), its version
    must be ``version`` and every file read must match its RECORD: a patched or hand-edited install
    is refused (its hashes would be pinned as "pristine"). Without dist-info (a source checkout)
    nothing can check the files: refused unless ``unverified``. ``supported``: the patchset's
    releases, for the hint. Raises ConfigError naming the directory."""
    from .manifest import read_record, sha256_bytes

    if not (base / "sglang").is_dir():
        raise ConfigError(f"{base}: no sglang/ package there",
                          hint="--tree takes a site-packages directory: the one that holds sglang/")
    infos = sorted(base.glob("sglang-*.dist-info"))
    record: dict[str, str | None] | None = None
    if infos:
        found = infos[-1].name[len("sglang-"):-len(".dist-info")]
        if len(infos) > 1 or found != version:
            other = (f", or --sglang {found}" if len(infos) == 1 and found in (supported or [found]) else
                     f" (the patchset has no target {found}: add one to patchset.yaml first)" if len(infos) == 1
                     else "")
            raise ConfigError(f"{base}: holds {', '.join(i.name for i in infos)}, not sglang {version}",
                              hint=f"give the site-packages of sglang {version}{other}")
        try:
            record = read_record((infos[-1] / "RECORD").read_text(encoding="utf-8"))
        except OSError as exc:
            raise ConfigError(f"{infos[-1]}: cannot read RECORD ({exc.strerror or exc})",
                              hint="give an intact install or unpacked wheel") from exc
        log(f"pristine tree: {base} (sglang {version}, each file checked against its RECORD)")
    elif not unverified:
        raise ConfigError(f"{base}: no sglang-*.dist-info/RECORD to check its files against, so nothing shows "
                          f"they are the sglang {version} release's (an edited file would be pinned as pristine)",
                          hint="give an install or an unpacked wheel of that release, or pass --unverified if "
                               "these files are the release's as published (e.g. a source checkout of its tag)")
    else:
        log(f"pristine tree: {base} (no sglang-*.dist-info: taken as sglang=={version} unchecked, --unverified)")

    def read(p: str) -> bytes | None:
        f = base / p
        data = f.read_bytes() if f.is_file() else None
        if record is not None and (data is not None or p in record):
            want = record.get(p)
            got = None if data is None else sha256_bytes(data)
            if p not in record or got != want:
                why = "is not in its RECORD" if p not in record else (
                    "is missing" if data is None else "differs from its RECORD (patched or edited)")
                raise ConfigError(f"{base}: {p} {why}: not the sglang {version} release file",
                                  hint="refresh from a pristine install (e.g. drop --tree: the PyPI wheel), "
                                       "or roll the patchset back on that install first")
        return data
    return read


def refresh_patchset(name: str, version: str, *, tree: Path | None = None, unverified: bool = False,
                     home: Path | None = None, log: Log = _quiet, meter: Meter = SILENT) -> RefreshReport:
    """Recompute and rewrite ``pristine``/``expected`` of ``name`` for ``version``.

    The pristine files come from the PyPI wheel of ``version`` (downloaded once, then cached) or,
    with ``tree``, from that site-packages-like directory (the one holding ``sglang/``: a release
    not on PyPI, or an unpacked wheel), checked against its RECORD (``unverified``: a tree without
    one is taken as it is). Raises UnsupportedVersionError (before any download) when
    ``name`` has no target ``version``, ConfigError when ``tree`` holds no ``sglang/`` package,
    ApplyError when the series no longer applies to that release."""
    from .patchset import refresh_hashes
    from .wheelcache import pristine_tree

    ps = load_patchset(name)
    ps.target(version)  # an unsupported version fails before any download (as diff does)
    if tree is not None:
        read = _release_tree_reader(Path(tree), version, log, unverified=unverified, supported=ps.versions)
    else:
        log(f"pristine tree: sglang=={version} from the PyPI wheel (downloaded once, then cached)")
        read = pristine_tree(version, home=home, log=log, meter=meter).read
    hashes = refresh_hashes(ps.root, version, read)
    return RefreshReport(ps.name, version, hashes)


# ------------------------------------------------------------------------------------ check

def check_host(host: Host, *, level: int | None = None, prompts: str | Path | None = None,
               stop_leftovers: bool = False, log: Log = _quiet) -> CheckRun:
    """``sglpatch check``: levels 0-1 (the active patchset's smoke checks on the host's files) and,
    with a serve profile, 2 (the patched server starts and answers) and 3 (greedy tokens of
    DFLASH and DDTREE equal the target alone's).

    ``level`` defaults to the highest the host's profile allows (3 with a draft model, 2 with a
    model, else 1). Raises ConfigError (a level the profile cannot run, a bad prompts file),
    TransportError; a failed check is a result (``CheckRun.passed``), not an exception.
    """
    most = host.serve.max_level() if host.serve is not None else 1
    level = most if level is None else level
    if level > most:
        why = ("it has no serve profile (`serve:` with model and draft_model)" if host.serve is None
               else "its serve profile has no draft_model")
        raise ConfigError(f"host {host.name} cannot be checked at level {level}: {why}",
                          hint=f"use --level {most}, or add them under `serve:` for {host.name} in the "
                               "inventory (the repository's hosts.yaml shows one for ct200)")
    texts = load_prompts(prompts) if level >= 2 else []
    with _session(host) as (transport, info):
        if level >= 2 or stop_leftovers:
            for srv in list_servers(transport, host, info):
                if srv.get("alive") and stop_leftovers:
                    stop_server(transport, host, info, str(srv["name"]))
                    log(f"{host.name}: stopped the leftover server {srv['name']} (pid {srv['pid']}, "
                        f"port {srv.get('port')})")
        active = deploy.host_status(transport, host, info, None).active
        if active:
            last = active[-1]
            ps = load_patchset(f"{last['patchset']}@{last['revision']}")
            log(f"{host.name}: L0/L1 of {ps.name} r{ps.revision} (the active deployment {last['id']})")
            report = run_checks(transport, host, info, ps.touched_paths(str(info.sglang_version)), ps,
                                levels=("L0",) if level == 0 else ("L0", "L1"))
        else:
            report = CheckReport(host=host.name)
            report.checks.append(CheckResult("L0", "patched files compile", "skipped",
                                             "no active sglpatch deployment on this host"))
        if level >= 2 and not active:
            report.checks.append(CheckResult("L2", "server start", "skipped",
                                             "nothing is deployed on this host: a server started now "
                                             "would test the release as it is (apply a patchset first)"))
            return CheckRun(report, level)
        if level >= 2:
            return run_serving_levels(transport, host, info, report, level, texts, progress=log)
        return CheckRun(report, level)


# ------------------------------------------------------------------------------------ bench

def bench_host(host: Host, *, arms: Sequence[str] = ("none", "DFLASH", "DDTREE"),
               concurrency: Sequence[int] | None = None, budgets: Sequence[int] | None = None,
               requests: int | None = None, max_new_tokens: int | None = None,
               prompts: str | Path | None = None, rounds: int = 1, compare: bool = False,
               plot_path: Path | None = None, store_run: bool = True, sweep: bool = False,
               inventory_path: Path | None = None, client: str = "auto", home: Path | None = None,
               log: Log = _quiet) -> BenchRun:
    """``sglpatch bench``: output tokens/s, time per output token and accept length of ``arms``
    (``none``, ``DFLASH``, ``DDTREE`` at each of ``budgets``) at each ``concurrency``, measured
    side by side on the host (defaults from the host's ``serve.bench`` profile). The run is stored
    in the local history; ``compare`` attaches the last comparable run; ``plot_path`` draws tokens/s
    against concurrency. ``sweep``: DDTREE at every budget (DFLASH beside it), then the fastest
    budget per concurrency becomes the host's ``serve.ddtree.budget_schedule`` in
    ``inventory_path`` (comments kept) — when the profile serves without CUDA graphs, which this
    patchset revision needs for several widths; otherwise the schedule is only shown.

    Raises ConfigError (no serve profile, no draft model for a speculative arm), ServerError
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
        arm_list += [BenchArm("DDTREE", b, profile.ddtree.topk) for b in bud]
    texts = load_prompts(prompts)
    with _session(host) as (transport, info):
        active = deploy.host_status(transport, host, info, None).active
        ps = (str(active[-1]["patchset"]), int(active[-1]["revision"])) if active else None
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
        _write_sweep(run, host, profile, inventory_path)
    return run


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


def _write_sweep(run: BenchRun, host: Host, profile: ServeProfile, inventory_path: Path | None) -> None:
    features = deployed_features(run.patchset, run.revision)
    # chain entries (DFlash's own step) only where the deployed revision runs them
    entries = choose_schedule(run, chain=BUDGET_SCHEDULE_CHAIN in features)
    if not entries:
        run.schedule = ""
        return
    run.schedule = schedule_text(entries)
    if BUDGET_SCHEDULE not in features:
        carried = f"{run.patchset} r{run.revision}" if run.patchset else "no sglpatch deployment"
        run.schedule_written = (f"not written to {host.name}'s profile: the host carries {carried}, "
                                "which takes no budget schedule")
        return
    if "--disable-cuda-graph" not in profile.args:
        run.schedule_written = (f"not written to {host.name}'s profile: this ddtree revision applies a "
                                "schedule of several budgets only with --disable-cuda-graph (its CUDA "
                                "graphs are captured at one width); set serve.ddtree.budget_schedule "
                                "yourself once it does")
        return
    if inventory_path is None or not Path(inventory_path).is_file():
        run.schedule_written = f"not written: {host.name} comes from no inventory file"
        return
    top = max([n for _, n in entries if n != CHAIN], default=0)
    set_host_value(Path(inventory_path), host.name, ["serve", "ddtree", "budget_schedule"], run.schedule)
    if top > profile.ddtree.budget:
        set_host_value(Path(inventory_path), host.name, ["serve", "ddtree", "budget"], top)
    run.schedule_written = (f"written to {inventory_path}: hosts.{host.name}.serve.ddtree.budget_schedule"
                            f" = {run.schedule!r} (DDTREE starts pass --speculative-ddtree-budget-schedule)")


# ------------------------------------------------------------------------------------ port

def port_patchset(name: str, from_version: str, to_version: str, *, check: bool = False,
                  out: Path | None = None, partial: bool = False, home: Path | None = None,
                  log: Log = _quiet) -> Any:
    """``sglpatch patchset port``: carry ``name``'s series for ``from_version`` to ``to_version``
    (both pristine trees from their PyPI wheels; :mod:`sglang_patcher.port` says how).

    Where it writes: ``check`` — nothing but, with ``out``, the conflicted files and the report;
    ``out`` — a copy of the patchset at ``out/<name>/`` gets the port (the patchset itself is not
    touched), conflicted files under ``out/conflicts/sglang-<to>/``, the report at
    ``out/report-sglang-<to>.json``; neither — the patchset itself, conflicted files under
    ``$SGLPATCH_HOME/port/<name>/sglang-<to>/``. The target goes into ``patchset.yaml`` only when
    every hunk carried, or with ``partial``. Returns the :class:`~sglang_patcher.port.PortResult`
    (what did not carry is in it, not raised). Raises UnsupportedVersionError (no target
    ``from_version``), ConfigError (``to_version`` already a target, ``out/<name>`` exists),
    PatchsetError (the ``from`` target does not render on its wheel, a release not on PyPI)."""
    from .port import port_series, save_report, write_conflicts, write_port
    from .wheelcache import pristine_tree

    ps = load_patchset(name)
    ps.target(from_version)
    if from_version == to_version:
        raise ConfigError(f"--from and --to are both {from_version}", hint="port to another release")
    if partial and check:
        raise ConfigError("--check writes nothing, so --partial has nothing to do", hint="drop one of them")
    if not check:
        if to_version in ps.versions:
            raise ConfigError(f"patchset {ps.name} already has a target {to_version}",
                              hint=f"`--check` only reports how the port goes; to port again, remove "
                                   f"targets.{to_version} and its series first")
        if out is None and "@" in name:
            raise ConfigError(f"{name} is a frozen earlier revision: a port is not written into history",
                              hint="port it into a scratch copy with --out DIR")
    dest = Path(out) / ps.name if out is not None else None
    if dest is not None and not check and dest.exists():
        raise ConfigError(f"{dest} exists: --out makes a fresh copy of the patchset there",
                          hint="give another directory, or port that copy in place: "
                               f"`sglpatch patchset port {dest} --from {from_version} --to {to_version}`")
    t0 = time.monotonic()
    log(f"pristine trees: sglang=={from_version} and sglang=={to_version} from their PyPI wheels "
        "(downloaded once, then cached)")
    old = pristine_tree(from_version, home=home, log=log)
    new = pristine_tree(to_version, home=home, log=log)
    tree_seconds = time.monotonic() - t0
    result = port_series(ps, from_version, to_version, old.read, new.read,
                         old_paths=old.manifest.files, new_paths=new.manifest.files)
    result.tree_seconds = tree_seconds
    if check:
        result.mode = "check"
        result.written = {"patchset_yaml": None, "reason": "--check writes nothing"}
    elif dest is not None:
        import shutil

        result.mode = "out"
        shutil.copytree(ps.root, dest, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        result.written = write_port(result, dest, new.read, partial=partial)
        result.written["copy"] = str(dest)
    else:
        result.mode = "in_place"
        result.written = write_port(result, ps.root, new.read, partial=partial)
    if out is not None:
        where = write_conflicts(result, Path(out) / "conflicts" / f"sglang-{to_version}")
        result.written["report"] = str(Path(out) / f"report-sglang-{to_version}.json")
    elif not check:
        where = write_conflicts(result, (home or sglpatch_home()) / "port" / ps.name / f"sglang-{to_version}")
    else:
        where = None
    if where is not None:
        result.written["conflicts_dir"] = str(where)
    if out is not None:
        save_report(result, Path(result.written["report"]))
    return result
