"""The results of each step — plan, apply, status, rollback, prune — and how each renders for
people (``__rich__``, what the CLI prints) and for scripts (``to_json``, what ``--json`` prints).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Iterable

from ..applier import ApplyResult
from ..checks import CheckReport
from ..remote.agent_client import describe_holder, describe_running, holder_is_stale, holder_liveness
from .records import ACTIVE, damaged_hint, record_summary

if TYPE_CHECKING:
    from rich.console import RenderableType


@dataclass
class FilePlan:
    """One touched file: ``state`` pristine|patched|older|drifted|absent by hashes, ``found_revision``
    (for patched/older), ``live``/``pristine``/``expected`` sha256 (None = absent), ``action``
    write|delete|none, ``mode`` to set (None keeps the host's)."""

    path: str
    state: str
    live: str | None
    pristine: str | None
    expected: str | None
    found_revision: int | None = None
    action: str = "none"
    mode: int | None = None
    live_mode: int | None = None
    owner: str | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class DeployPlan:
    """What an apply would do on one host (no lock taken, nothing written)."""

    host: str
    patchset: str
    revision: int
    sglang_version: str
    files: dict[str, FilePlan]
    contents: dict[str, bytes] = field(default_factory=dict, repr=False)
    diff: str = ""
    inspect: dict[str, Any] = field(default_factory=dict, repr=False)
    pristine_sources: dict[str, str] = field(default_factory=dict)
    pristine_bytes: dict[str, bytes | None] = field(default_factory=dict, repr=False)
    result: ApplyResult | None = field(default=None, repr=False)  # the applier's result that ``diff`` shows
    patchset_arg: str | None = None  # how the command line names this patchset revision (NAME, NAME@REV, DIR)

    @property
    def drifted(self) -> list[str]:
        return sorted(p for p, f in self.files.items() if f.state == "drifted")

    @property
    def to_push(self) -> dict[str, FilePlan]:
        return {p: f for p, f in self.files.items() if f.action != "none"}

    @property
    def kind(self) -> str:
        """noop (all patched at this revision) | apply | upgrade (some at an earlier revision) |
        complete (mixed pristine/patched) | drift."""
        states = {f.state for f in self.files.values()}
        if "drifted" in states:
            return "drift"
        if not self.to_push:
            return "noop"
        if "older" in states:
            return "upgrade"
        if "patched" in states:
            return "complete"
        return "apply"

    def to_json(self) -> dict[str, Any]:
        return {"host": self.host, "patchset": self.patchset, "revision": self.revision,
                "sglang_version": self.sglang_version, "kind": self.kind,
                "files": {p: f.to_json() for p, f in sorted(self.files.items())},
                "pristine_sources": self.pristine_sources}

    def __rich__(self):
        return self.render()

    def render(self, written: bool = False):
        """The plan as a table. ``written``: the apply went through (the caption says the files
        were written); else it is a plan — the prompt's, a dry run's, a declined one's — and says
        what would be written."""
        # lines: the patchset's diff from pristine, for the files this apply writes (a file already
        # at this revision changes nothing)
        writes = {p: n for p, n in diffstat(self.diff).items()
                  if p in self.files and self.files[p].action in ("write", "delete")}
        t = files_table(f"{self.patchset} r{self.revision} on {self.host} "
                        f"(sglang {self.sglang_version}): {self.kind}", self.files.values(), plan=True,
                        stat=writes)
        if writes:
            added, removed = sum(a for a, _ in writes.values()), sum(r for _, r in writes.values())
            push = self.to_push
            deleted = sum(1 for f in push.values() if f.action == "delete")
            rest = len(self.files) - len(push)
            # every row accounted for: the caption's counts add up to the table's rows
            t.caption = (f"{len(push) - deleted} file(s) {'written' if written else 'would be written'}"
                         + (f", {deleted} deleted" if deleted else "")
                         + (f", {rest} left as they are (action none)" if rest else "")
                         + f"; {'they' if len(push) > 1 else 'it'} differ{'' if len(push) > 1 else 's'} "
                           f"from pristine by +{added:,} −{removed:,} lines (`sglpatch diff "
                           f"{self.patchset_arg or self.patchset} --host {self.host}` prints the whole patchset's diff)")
        notes = list(self.result.notes) if self.result is not None else []
        if notes:   # what `diff` says about the series (e.g. CRLF line ends kept), apply says too
            from rich.console import Group
            from rich.text import Text
            return Group(t, *(Text(f"  note: {n}", style="yellow") for n in notes))
        return t


# DeployResult.status in the text output (--json keeps the names)
_APPLY_STATUS_WORDS = {"applied": "applied", "already_applied": "already applied (nothing to write)",
                       "dry_run": "dry run (nothing written)", "aborted": "aborted (nothing written)",
                       "resumed": "resumed (an interrupted apply finished)"}


@dataclass
class DeployResult:
    """Outcome of :func:`apply_to_host`.

    ``status``: applied | already_applied | dry_run | aborted | resumed. ``recovered`` says what was
    done with an interrupted earlier run. ``round_trips`` and ``seconds`` measure this call.
    """

    host: str
    status: str
    plan: DeployPlan
    deployment_id: str | None = None
    record: dict[str, Any] | None = None
    checks: CheckReport | None = None
    recovered: list[str] = field(default_factory=list)
    round_trips: int = 0
    seconds: float = 0.0
    local_record: str | None = None
    warnings: list[str] = field(default_factory=list)   # e.g. the revision is withdrawn

    @property
    def uncropped(self) -> bool:
        """True for a dry run: its rendering holds the whole diff, whose lines must reach the
        output whole (``AppContext.result`` prints it with soft wrap)."""
        return self.status == "dry_run"

    def to_json(self) -> dict[str, Any]:
        out = {"host": self.host, "status": self.status, "deployment_id": self.deployment_id,
               "plan": self.plan.to_json(), "checks": self.checks.to_json() if self.checks else None,
               "recovered": self.recovered, "round_trips": self.round_trips,
               "seconds": round(self.seconds, 3), "local_record": self.local_record,
               "warnings": self.warnings}
        if self.status == "dry_run":
            out["diff"] = self.plan.diff
        return out

    def __rich__(self):
        from rich.console import Group
        from rich.text import Text

        parts: list[RenderableType] = []
        if self.status == "dry_run" and self.plan.diff:   # the diff first: the plan closes the output,
            parts.append(diff_view(self.plan.diff))       # never buried under thousands of diff lines
            parts.append(Text(f"(the diff above: {len(self.plan.diff.splitlines()):,} lines; `sglpatch diff "
                              f"{self.plan.patchset_arg or self.plan.patchset} --host {self.host}` prints it "
                              f"alone)", style="dim"))
        parts.append(Text(f"{self.host}: {_APPLY_STATUS_WORDS.get(self.status, self.status)}"
                          + (f" (deployment {self.deployment_id})" if self.deployment_id else "")
                          + f" — {self.round_trips} round trip{'' if self.round_trips == 1 else 's'}, "
                            f"{self.seconds:.2f} s", style="bold"))
        parts += [Text(f"  recovered: {r}", style="yellow") for r in self.recovered]
        parts += [Text(f"  warning: {w}", style="yellow") for w in self.warnings]
        parts.append(self.plan.render(written=self.status not in ("dry_run", "aborted")))
        if self.checks is not None:
            parts.append(self.checks.__rich__())
        return Group(*parts)


@dataclass
class FileStatus:
    """One file on a host: ``state`` pristine|patched|drifted|absent, the patchset and revision that
    the live hash belongs to, and the hashes it was judged by (``record``: the RECORD sha256)."""

    path: str
    state: str
    live: str | None
    patchset: str | None = None
    revision: int | None = None
    pristine: str | None = None
    expected: str | None = None
    record: str | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


# the values of StatusReport.overall
OVERALL_STATES = ("pristine", "patched", "older", "newer", "mixed", "drifted", "pending", "damaged", "unknown")


@dataclass
class StatusReport:
    """:func:`host_status`: per-file states, the host's deployment history, pending journal, lock."""

    host: str
    sglang_version: str | None
    files: list[FileStatus]
    deployments: list[dict[str, Any]]
    journal: dict[str, Any] | None
    lock: dict[str, Any] | None
    patchset: str | None = None
    revision: int | None = None
    damaged: list[str] = field(default_factory=list)  # damaged records' paths on the host
    older_revision: int | None = None  # judged against a patchset: the earlier revision installed whole
    bad_backups: dict[str, dict[str, str]] = field(default_factory=dict)  # id → {path: backup} a rollback lacks
    local_backups: dict[str, str] = field(default_factory=dict)  # id → local copies' dir, for bad_backups
    note: str | None = None  # what the verdict rests on, where that is not obvious (no records, no files)
    unchecked: bool = False  # no file could be judged (no records, no patchset for the release): "unknown"
    warnings: list[str] = field(default_factory=list)  # e.g. an active revision its patchset withdrew
    # this machine's records of deployments the host has no record of, still active here: {id, local,
    # site_packages, files, carried} (carried: files still at its bytes; none — its install was replaced)
    lost_records: list[dict[str, Any]] = field(default_factory=list)
    # judged against a patchset: files only its earlier revisions touched (a module a later revision
    # no longer installs); at this revision they are at rest, as the release has them
    retired: list[str] = field(default_factory=list)

    @property
    def active(self) -> list[dict[str, Any]]:
        """The host's active deployments, oldest first: ``{"id", "patchset", "revision"}`` each —
        what a status without ``--patchset`` says the host carries."""
        return [{"id": d.get("id"), "patchset": d.get("patchset"), "revision": d.get("revision")}
                for d in self.deployments if d.get("phase") in ACTIVE]

    @property
    def held_paths(self) -> set[str]:
        """The paths that the host's active deployments wrote (their records' files)."""
        return {p for d in self.deployments if d.get("phase") in ACTIVE for p in d.get("files", {})}

    @property
    def overall(self) -> str:
        """pristine | patched | mixed | drifted | pending (an interrupted deployment) | unknown,
        older (judged against a patchset: one earlier revision of it, whole), newer (judged against
        a patchset: its files at later revisions, by the host's records), or damaged (a
        journal or deployment record on the host cannot be read: apply and rollback refuse until
        it is restored or moved aside)."""
        if self.damaged:
            return "damaged"
        if self.journal:
            return "pending"
        if self.unchecked:
            return "unknown"
        if not self.files:
            return "pristine" if not any(d.get("phase") in ACTIVE for d in self.deployments) else "unknown"
        # Files no active deployment holds (e.g. a module a rolled-back revision created) must be
        # at rest (pristine, or absent as in the release); the held ones decide patched or not.
        active = self.held_paths
        held = [f for f in self.files if f.path in active]
        rest_ok = all(f.state in ("pristine", "absent") for f in self.files if f.path not in active)
        if any(f.state == "drifted" for f in self.files):
            return "drifted"
        if all(f.state in ("pristine", "absent") for f in self.files):
            return "pristine"
        if self.patchset is not None:   # judged against one patchset: every file at its revision
            at_rev = [f.state == "patched" and f.revision in (None, self.revision) for f in self.files]
            if all(ok or (f.path in self.retired and f.state in ("pristine", "absent"))  # gone, or never
                   for f, ok in zip(self.files, at_rev)):                                # there (a fresh host)
                return "patched"
            if self.older_revision is not None:
                return "older"
            revs = {f.revision for f in self.files if f.state == "patched"}  # later revisions, by the
            if (revs and None not in revs and all(f.state in ("patched", "absent") for f in self.files)
                    and all(int(r) >= int(self.revision or 0) for r in revs)                      # host's
                    and max(int(r) for r in revs) > int(self.revision or 0)):                     # records
                return "newer"
            return "mixed"
        if held and rest_ok and all(f.state == "patched" for f in held):
            return "patched"
        return "mixed"

    def to_json(self) -> dict[str, Any]:
        return {"host": self.host, "sglang_version": self.sglang_version, "overall": self.overall,
                "patchset": self.patchset, "revision": self.revision, "active": self.active,
                "files": [f.to_json() for f in self.files],
                "deployments": [record_summary(d) for d in self.deployments],
                "journal": record_summary(self.journal) if self.journal else None, "lock": self.lock,
                "lock_stale": holder_is_stale(self.lock),
                "lock_running": bool(self.lock) and holder_liveness(self.lock)[0] == "running",
                "damaged": list(self.damaged), "older_revision": self.older_revision,
                "bad_backups": dict(self.bad_backups), "local_backups": dict(self.local_backups),
                "note": self.note, "warnings": list(self.warnings), "retired": list(self.retired),
                "lost_records": list(self.lost_records)}

    def __rich__(self):
        from rich.console import Group
        from rich.table import Table
        from rich.text import Text

        overall = self.overall + (f" (r{self.older_revision} of {self.patchset}; r{self.revision} is the newest: "
                                  f"`sglpatch apply {self.patchset}` upgrades)" if self.overall == "older" else "")
        if self.overall == "newer":
            later = sorted({int(f.revision) for f in self.files if f.state == "patched"} - {int(self.revision or 0)})
            overall += (f" (r{'/r'.join(map(str, later))} of {self.patchset} is installed, later than the "
                        f"r{self.revision} asked about; a rollback goes back)")
        elif self.patchset is None and self.overall == "patched" and self.active:
            overall += " (" + active_summary(self.active) + ")"
        parts: list[RenderableType] = [Text(f"{self.host} (sglang {self.sglang_version}): {overall}",
                                            style="bold")]
        if self.note:
            parts.append(Text(f"  {self.note}", style="yellow"))
        for warning in self.warnings:
            parts.append(Text(f"  {warning}", style="bold red"))
        if self.damaged:
            parts.append(Text(f"  damaged deployment record(s): {', '.join(self.damaged)} — apply and rollback "
                              f"refuse until they are fixed; {damaged_hint(self.host)}", style="bold red"))
        for r in self.lost_records:
            made = f" ({r['site_packages']})" if r.get("site_packages") else ""
            if not r.get("carried"):
                parts.append(Text(f"  deployment {r['id']} is active only in this machine's record {r['local']}: the "
                                  f"host has no record of it and none of its {r.get('files')} files carries the "
                                  f"bytes it wrote — the install it patched{made} was replaced (re-created or "
                                  f"reinstalled), so nothing is left to roll back; `sglpatch rollback --host "
                                  f"{self.host}` marks that record superseded", style="bold yellow"))
            else:
                parts.append(Text(f"  deployment {r['id']} is active in this machine's record {r['local']}, but the "
                                  f"host has no record of it and {len(r['carried'])} of its {r.get('files')} files "
                                  f"still carry the bytes it wrote: the host's record was lost — `sglpatch rollback "
                                  f"--host {self.host}` says where to copy it back", style="bold red"))
        held = self.held_paths
        orphans = [f.path for f in self.files if f.state == "patched" and f.path not in held]
        if orphans and not self.journal:
            parts.append(Text(f"  {len(orphans)} file(s) carry a patchset's bytes, but no active deployment record "
                              f"on the host names them (lost or moved?): {', '.join(orphans[:3])}"
                              f"{' …' if len(orphans) > 3 else ''} — `sglpatch rollback --host {self.host}` says "
                              f"where local copies of the records are", style="bold red"))
        for d in self.deployments:
            if (d.get("phase") in ACTIVE and d.get("sglang_version") and self.sglang_version
                    and str(d["sglang_version"]) != str(self.sglang_version)):
                parts.append(Text(f"  deployment {d.get('id')} was made on sglang {d['sglang_version']}; the host "
                                  f"now has {self.sglang_version} (reinstalled under it): rollback refuses and says "
                                  f"what to do", style="bold red"))
        for did, bad in sorted(self.bad_backups.items()):
            parts.append(Text(f"  deployment {did}: {len(bad)} backup(s) missing or damaged on the host "
                              f"({', '.join(sorted(bad.values()))}) — `sglpatch rollback` puts them back first "
                              f"from whatever copy has the recorded sha256 (" +
                              (f"local copies: {self.local_backups[did]}/; " if did in self.local_backups
                               else "no local copy; ") + "else the host's mirror or the release wheel) and "
                              "refuses, restoring nothing, when one is found nowhere", style="bold red"))
        if self.journal:
            parts.append(Text(f"  pending: deployment {self.journal.get('id')} interrupted in phase "
                              f"{self.journal.get('phase')} — run apply again or rollback", style="yellow"))
        if self.lock:
            state, command = holder_liveness(self.lock)
            parts.append(Text(f"  locked by {describe_holder(self.lock)} — " + (
                "that process no longer runs on this machine: the next apply or rollback takes the lock over"
                if state == "gone" else
                f"{describe_running(self.lock, command)}: wait for it to finish, or stop that process; "
                "--break-lock breaks only a lock whose holder no longer runs"
                if state == "running" else
                "if no deployment is running (a crash elsewhere), apply or rollback with --break-lock"),
                style="yellow"))
        t = Table(title="files")
        for col in ("file", "state", "patchset", "rev", "live sha256", "RECORD"):
            t.add_column(col, overflow="fold")
        styles = {"pristine": "green", "patched": "cyan", "drifted": "bold red", "absent": "dim"}
        for f in self.files:
            rec = "-" if f.record is None else ("= live" if f.live == f.record else "≠ live")
            t.add_row(f.path, f"[{styles.get(f.state, '')}]{f.state}[/]", f.patchset or "",
                      "" if f.revision is None else str(f.revision), (f.live or "-")[:16], rec)
        parts.append(t)
        h = Table(title="deployments")
        for col in ("id", "patchset", "rev", "phase", "started", "files"):
            h.add_column(col)
        for d in self.deployments:
            h.add_row(str(d.get("id")), str(d.get("patchset")), str(d.get("revision")), str(d.get("phase")),
                      str(d.get("times", {}).get("started", "")), str(len(d.get("files", {}))))
        parts.append(h)
        return Group(*parts)


@dataclass
class RollbackResult:
    """:func:`rollback_host`: the deployments rolled back (newest first) and every file's final hash."""

    host: str
    rolled_back: list[str]
    files: dict[str, str | None]
    already: list[str] = field(default_factory=list)
    round_trips: int = 0
    seconds: float = 0.0
    backups_put_back: dict[str, dict[str, str]] = field(default_factory=dict)  # id → {path: source}
    drift_kept: dict[str, str] = field(default_factory=dict)  # path → where --force kept its edited bytes
    # the restored modules' bytecode, written again on the host: recompiled [paths], failed {path: why},
    # skipped (why none was: the host's Python writes none)
    bytecode: dict[str, Any] = field(default_factory=dict)
    # deployments active only in this machine's records whose install was replaced (none of their files
    # carries their bytes), now marked superseded there: id → {local (the record), site_packages, files};
    # for `--to` an id marked so before: also at, reason and marked_before
    superseded: dict[str, dict[str, Any]] = field(default_factory=dict)
    # `--to` a superseded deployment: the deployments active on the host (what a rollback would undo)
    active: list[str] = field(default_factory=list)
    # `--to` a deployment rolled back already while later ones touching its files are active: its id
    # and when it was rolled back ({"id", "rolled_back_at"}); those later ones are what was undone
    to_rolled_back: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "seconds": round(self.seconds, 3)}   # as apply's --json gives them

    def __rich__(self):
        from rich.table import Table

        if not self.rolled_back and not self.files:
            from rich.text import Text
            before = {d: r for d, r in self.superseded.items() if r.get("marked_before")}
            if before:
                did, r = next(iter(before.items()))
                lines = [f"{self.host}: nothing to roll back — deployment {did} was superseded: none of its "
                         f"changes is on the host to undo",
                         f"  made on {r.get('site_packages') or 'an install'} ({r.get('files')} files); this "
                         f"machine's record of it, {r.get('local')}, was marked superseded"
                         + (f" at {r['at']}" if r.get("at") else "") + (f": {r['reason']}" if r.get("reason") else "")]
                lines.append(f"  `sglpatch status --host {self.host}` checks the files; "
                             + (f"the deployment(s) active on the host now: {', '.join(self.active)} — "
                                f"`sglpatch rollback --host {self.host}` undoes the latest" if self.active else
                                "no deployment is active on the host"))
                if r.get("backups"):
                    lines.append(f"  its backup copies here, {r['backups']}: no rollback needs them — "
                                 f"`sglpatch prune --host {self.host}` deletes them")
                return Text("\n".join(lines))
            if self.superseded:
                lines = [(f"{self.host}: nothing to roll back — the install that deployment(s) "
                          f"{', '.join(self.superseded)} patched was replaced (re-created or reinstalled): the "
                          f"host has no record of them and none of their files carries the bytes they wrote")]
                for did, r in self.superseded.items():
                    lines.append(f"  {did}: made on {r.get('site_packages') or 'an install'} ({r.get('files')} "
                                 f"files); this machine's record of it, {r.get('local')}, is now marked superseded")
                lines.append(f"  rollback and status no longer take them for deployments on the host; "
                             f"`sglpatch status --host {self.host}` checks the files"
                             + (f"; the deployment(s) active on the host now: {', '.join(self.active)} — "
                                f"`sglpatch rollback --host {self.host}` undoes the latest" if self.active else ""))
                kept = [r["backups"] for r in self.superseded.values() if r.get("backups")]
                if kept:
                    lines.append(f"  their backup copies here ({', '.join(kept)}): no rollback needs them — "
                                 f"`sglpatch prune --host {self.host}` deletes them")
                return Text("\n".join(lines))
            return Text(f"{self.host}: nothing to roll back — no sglpatch deployment is active there"
                        + (f" (deployment {self.already[-1]} was rolled back already)" if self.already else
                           " (none was ever recorded)") + f"; `sglpatch status --host {self.host}` checks the files")
        t = Table(title=f"{self.host}: rolled back {', '.join(self.rolled_back) or 'nothing'}"
                        f" ({self.round_trips} round trip{'' if self.round_trips == 1 else 's'}, "
                        f"{self.seconds:.2f} s)")
        t.add_column("file")
        t.add_column("restored sha256")
        for p, h in sorted(self.files.items()):
            t.add_row(p, h or "(removed)")
        notes = [f"{p}: its edited bytes were kept at {k} (host)" for p, k in sorted(self.drift_kept.items())]
        if self.to_rolled_back:
            named = self.to_rolled_back
            notes.insert(0, f"deployment {named['id']} (named by --to) was rolled back already"
                            + (f" at {named['rolled_back_at']}" if named.get("rolled_back_at") else "")
                            + f"; the deployment(s) made after it that touch its files were rolled back, so that "
                              f"the host is as before it: {', '.join(self.rolled_back)}")
        bc = self.bytecode
        if bc.get("recompiled"):
            notes.append(f"bytecode: {len(bc['recompiled'])} restored module(s) compiled into __pycache__ again "
                         f"(apply had purged it)")
        if bc.get("failed"):
            notes.append("bytecode not written (the host compiles it at first import): "
                         + "; ".join(f"{p}: {why}" for p, why in sorted(bc["failed"].items())))
        if bc.get("skipped"):
            notes.append(f"bytecode not written: {bc['skipped']}")
        if self.backups_put_back:
            notes.append("; ".join(
                f"{did}: {len(got)} lost backup(s) put back on the host first, verified by sha256, from "
                + ", ".join(sorted(set(got.values()))) for did, got in sorted(self.backups_put_back.items())))
        if notes:   # lines of their own after the table (a caption wraps at the table's width, paths too)
            from rich.console import Group
            from rich.text import Text
            return Group(t, *(Text(f"  {n}") for n in notes))
        return t


@dataclass
class PruneResult:
    """:func:`prune_host`: the rolled-back deployments whose backups went (``pruned``: id, bytes,
    dirs, ``drifted`` — the edited copies a forced rollback kept, which go with them), those whose
    backups were kept, whether it was a dry run (nothing deleted) and how many deployment records
    the host has (``recorded``: 0 for a host never deployed). ``orphans``: backup trees on the host
    that no deployment record names (a failed push of an earlier sglpatch left them; every byte of
    them is held elsewhere on the host), deleted whatever ``keep`` says: {id, dir, bytes, files};
    ``orphans_kept``: such trees holding bytes found nowhere else on the host (``alone``), kept."""

    host: str
    pruned: list[dict[str, Any]]
    kept: list[str]
    dry_run: bool = False
    recorded: int | None = None
    # this machine's backup copies of superseded deployments (their install was replaced), deleted
    # whatever --keep says: {id, record, dir, bytes, files}
    superseded: list[dict[str, Any]] = field(default_factory=list)
    orphans: list[dict[str, Any]] = field(default_factory=list)
    orphans_kept: list[dict[str, Any]] = field(default_factory=list)

    @property
    def freed_bytes(self) -> int:
        """Bytes freed on the host."""
        return sum(int(p.get("bytes", 0)) for p in self.pruned + self.orphans)

    @property
    def local_freed_bytes(self) -> int:
        """Bytes of superseded deployments' backup copies freed on this machine."""
        return sum(int(p.get("bytes", 0)) for p in self.superseded)

    @property
    def drifted(self) -> dict[str, list[str]]:
        """{deployment id: the edited copies of its files that go} — only ids that have some."""
        return {str(p["id"]): list(p["drifted"]) for p in self.pruned if p.get("drifted")}

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "freed_bytes": self.freed_bytes, "local_freed_bytes": self.local_freed_bytes,
                "drifted_copies": sum(len(v) for v in self.drifted.values())}

    def __rich__(self):
        from rich.text import Text

        gone = self._superseded_lines() + self._orphan_lines()
        if not self.pruned and not self.orphans:
            why = ("no sglpatch deployment is recorded on this host" if self.recorded == 0 else
                   "no rolled-back deployment beyond the --keep newest has backups left")
            if gone:
                return Text("\n".join([f"{self.host}: nothing to prune on the host — {why}"] + gone))
            return Text(f"{self.host}: nothing to prune — {why}" + (
                f"\n  kept: the backups of {', '.join(self.kept)} (--keep); active deployments' are never pruned"
                if self.kept else ""))
        verb = "would free" if self.dry_run else "freed"
        copies = sum(len(v) for v in self.drifted.values())
        what = ([f"the backups of {len(self.pruned)} rolled-back deployment(s)"] if self.pruned else []) + (
            [f"{len(self.orphans)} backup(s) no deployment record names"] if self.orphans else [])
        head = (f"{self.host}: {verb} {self.freed_bytes / 1e6:.1f} MB — " + " and ".join(what) + (
                    f", with {copies} edited cop{'y' if copies == 1 else 'ies'} of files that `rollback --force` "
                    f"kept (backups/<id>.drifted/ on the host: {'they would go' if self.dry_run else 'gone'})"
                    if copies else ""))
        lines = [head]
        for p in self.pruned:
            lines.append(f"  {p['id']}: {int(p['bytes']) / 1e6:.2f} MB")
            d = p.get("drifted") or []
            if d:
                lines.append(f"    {'would delete' if self.dry_run else 'deleted'} {len(d)} edited cop"
                             f"{'y' if len(d) == 1 else 'ies'} kept by `rollback --force` ({p['id']}.drifted/): "
                             + ", ".join(d))
        if self.kept:
            lines.append(f"  kept: the backups of {', '.join(self.kept)} (--keep); active deployments' are never pruned")
        return Text("\n".join(lines + gone))

    def _orphan_lines(self) -> list[str]:
        """The backups no record names: deleted (would be), or kept with the files found nowhere else."""
        lines = []
        for o in self.orphans:
            lines.append(f"  {o['id']}: {int(o['bytes']) / 1e6:.2f} MB, {len(o['files'])} file(s) — no deployment "
                         f"record names it (a failed push left it; the host holds every byte of it elsewhere): "
                         f"{'would delete' if self.dry_run else 'deleted'}")
        for o in self.orphans_kept:
            alone = o.get("alone") or []
            lines.append(f"  kept: {o['dir']} — no deployment record on the host names it, and {len(alone)} of its "
                         f"file(s) ({', '.join(alone[:3])}{' …' if len(alone) > 3 else ''}) are nowhere else on the "
                         f"host: the originals of a deployment whose record was lost? Copy its record back from the "
                         f"machine that deployed it ($SGLPATCH_HOME/deployments/{self.host}/{o['id']}.json) and "
                         f"roll it back, or delete the directory by hand")
        return lines

    def _superseded_lines(self) -> list[str]:
        """What was (would be) deleted of this machine's copies of superseded deployments."""
        if not self.superseded:
            return []
        verb = "would delete" if self.dry_run else "deleted"
        lines = [f"this machine: {verb} {self.local_freed_bytes / 1e6:.1f} MB — the backup copies of "
                 f"{len(self.superseded)} superseded deployment(s) (their install was replaced: nothing on the "
                 f"host to roll back; their records stay)"]
        lines += [f"  {g['id']}: {int(g['bytes']) / 1e6:.2f} MB, {g['files']} file(s), {g['dir']}"
                  for g in self.superseded]
        return lines


# ---------------------------------------------------------------------------------- rendering

def diff_view(text: str):
    """A unified diff as rich renders it for people (``diff`` and ``apply --dry-run``): every
    line whole, coloured as a diff; print it with soft wrap so no line is cropped."""
    from rich.syntax import Syntax

    return Syntax(text, "diff", theme="ansi_dark", word_wrap=False)


def diffstat(diff: str) -> dict[str, tuple[int, int]]:
    """{path: (lines added, lines removed)} of unified diff text (parsed by unidiff); {} for an
    empty diff or one that does not parse."""
    from unidiff import PatchSet
    from unidiff.errors import UnidiffParseError

    if not diff:
        return {}
    try:
        return {f.path: (f.added, f.removed) for f in PatchSet(diff)}
    except UnidiffParseError:
        return {}


def files_table(title: str, files: Iterable[FilePlan], plan: bool = False,
                stat: dict[str, tuple[int, int]] | None = None):
    """The plan's files as a table: path, state (with the revision found), live sha256, action and,
    with ``stat``, the lines the patchset's diff adds and removes."""
    from rich.table import Table

    t = Table(title=title)
    for col in ("file", "state", "live", "action") + (("lines",) if stat else ()):
        t.add_column(col, overflow="fold", justify="right" if col == "lines" else "left")
    styles = {"pristine": "green", "patched": "cyan", "older": "magenta", "drifted": "bold red"}
    for f in sorted(files, key=lambda f: f.path):
        st = f.state + (f" r{f.found_revision}" if f.found_revision is not None else "")
        row = [f.path, f"[{styles.get(f.state, '')}]{st}[/]", (f.live or "absent")[:12], f.action]
        if stat:
            row.append("+{} −{}".format(*stat[f.path]) if f.path in stat else "")
        t.add_row(*row)
    return t



def active_summary(active: list[dict[str, Any]]) -> str:
    """The active deployments of a host in words, each patchset once: ``ddtree r5`` — or, when
    upgrades stacked deployments of one patchset (r3, then r4 over it, then r5), ``ddtree r5,
    upgraded from r3, r4: each rollback steps back one``; patchsets apart by ``; ``. ``active``:
    :attr:`StatusReport.active` (oldest first, each with ``patchset`` and ``revision``)."""
    by_name: dict[str, list[str]] = {}
    for a in active:
        by_name.setdefault(str(a["patchset"]), []).append(f"r{a['revision']}")
    out = []
    for name, revs in by_name.items():
        out.append(f"{name} {revs[-1]}" + (f", upgraded from {', '.join(revs[:-1])}: each rollback steps back one"
                                            if len(revs) > 1 else ""))
    return "; ".join(out)
