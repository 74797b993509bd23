"""``sglpatch diff``: the unified diff a patchset makes against a host's install or a pristine
PyPI wheel, with what apply would find there."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text

from . import deploy, mirror
from .deploy.pristine import ABSENT
from .errors import DriftError, SglpatchError
from .inventory import Host
from .patchset import Patchset, load_patchset, withdrawn_warning
from .progress import SILENT, Meter
from .service import Log, quiet, session

__all__ = ["DiffReport", "diff_patchset"]


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
    withdrawn: str | None = None  # "NAME rN is withdrawn: why" (patchset.yaml), None: it is not

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
            "left_out": list(self.patchset.target(self.version).left_out),
            "host_plan": self.host_plan,
            "warnings": [self.withdrawn] if self.withdrawn else [],
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
        if self.withdrawn:
            parts.append(Text(f"  warning: {self.withdrawn}", style="bold red"))
        for h in offsets:
            parts.append(Text(f"  {h.status}: {h.path} hunk {h.index} ({h.patch})"
                              + (f", offset {h.offset_lines:+d} lines" if h.offset_lines else ""),
                              style="yellow"))
        for note in self.result.notes:
            parts.append(Text(f"  note: {note}", style="yellow"))
        left = self.patchset.target(self.version).left_out
        if left:
            parts.append(Text(f"  PARTIAL port: this target lacks {len(left)} change(s) that did not carry "
                              f"(apply refuses it until they are made and targets.{self.version}.left_out "
                              f"is deleted): " + "; ".join(left), style="bold red"))
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
                  home: Path | None = None, log: Log = quiet, meter: Meter = SILENT) -> DiffReport:
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
        return DiffReport(ps, version, f"wheel sglang=={version}", ps.render(version, tree.read),
                          withdrawn=withdrawn_warning(ps))
    with session(host) as (transport, info):
        version = str(info.sglang_version)
        ps.target(version)
        snap = mirror.snapshot(transport, host, info, home=home, meter=meter)
        # apply's own plan (one more round trip; writes nothing): its rendering is the diff, its
        # hashes say what apply would find there
        plan = deploy.plan_apply(transport, host, info, ps, pristine=snap.mirror, home=home)
        sources = list(plan.pristine_sources.values())
        via = " / ".join(sorted(set(sources) - {ABSENT})) or "nowhere"
        new = sources.count(ABSENT)
        return DiffReport(ps, version, f"host {host.name} (pristine bytes from the {via}; {new} file(s) "
                          "the release does not have)" if new else f"host {host.name} (pristine bytes from the {via})",
                          plan.result,
                          drifted=plan.drifted, host_plan=plan.kind, withdrawn=withdrawn_warning(ps))
