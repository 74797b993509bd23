"""What the patchsets offer: ``sglpatch patchset list`` (every patchset on the search path: its
revision, the SGLang releases it supports, its earlier and withdrawn revisions) and ``sglpatch
patchset show NAME`` (per revision: releases and whether it is withdrawn, and why; per release of
the revision shown: the series, the files it modifies, adds and deletes; the checks it brings).
Reads ``patchset.yaml`` files only: no host, no download.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text

from .errors import SglpatchError
from .patchset import Patchset, available_patchsets, load_patchset

__all__ = ["PatchsetListing", "PatchsetDetails", "RevisionInfo", "list_patchsets", "show_patchset"]


@dataclass
class RevisionInfo:
    """One revision of a patchset: the releases it supports (None: only its hashes are kept, no
    frozen copy), and why it is withdrawn (None: it is not)."""

    revision: int
    releases: list[str] | None
    withdrawn: str | None = None
    current: bool = False

    @property
    def status(self) -> str:
        return "current" if self.current else "withdrawn" if self.withdrawn else "earlier"

    def to_json(self) -> dict[str, Any]:
        return {"revision": self.revision, "releases": self.releases, "status": self.status,
                "withdrawn": self.withdrawn}


def _revisions(ps: Patchset) -> list[RevisionInfo]:
    """Every revision the patchset knows, newest first, judged by the newest revision's
    ``withdrawn`` map."""
    newest = ps.at_revision(ps.revision)
    revs = set(newest.history_revisions()) | set(newest.spec.history) | set(newest.spec.withdrawn)
    out = [RevisionInfo(newest.revision, newest.versions, current=True)]
    for r in sorted(revs - {newest.revision}, reverse=True):
        try:
            releases: list[str] | None = newest.at_revision(r).versions
        except SglpatchError:
            releases = sorted(v for v in newest.spec.history.get(r, {})) or None
        out.append(RevisionInfo(r, releases, withdrawn=newest.spec.withdrawn.get(r)))
    return out


def _summary(text: str) -> str:
    first = " ".join(text.split()).split(". ")[0]
    return first if len(first) <= 60 else first[:59] + "…"


@dataclass
class PatchsetListing:
    """Every patchset found on the search path (the ones that do not load: their error)."""

    patchsets: list[tuple[Patchset, list[RevisionInfo]]]
    broken: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"patchsets": [{"name": ps.name, "revision": ps.revision, "releases": ps.versions,
                               "description": ps.description, "root": str(ps.root),
                               "revisions": [r.to_json() for r in revs]}
                              for ps, revs in self.patchsets],
                "broken": self.broken}

    def __rich__(self) -> Group:
        t = Table(title="patchsets", title_justify="left")
        for col in ("patchset", "revision", "SGLang releases", "earlier revisions", "what it is"):
            t.add_column(col)
        for ps, revs in self.patchsets:
            earlier = Text()
            for item, withdrawn in _earlier_items(revs[1:]):
                if earlier:
                    earlier.append(", ")
                earlier.append(item, style="yellow" if withdrawn else "")
            t.add_row(ps.name, str(ps.revision), ", ".join(ps.versions), earlier or "-", _summary(ps.description))
        parts: list[Any] = [t]
        for name, err in sorted(self.broken.items()):
            parts.append(Text(f"{name}: does not load: {err}", style="red"))
        parts.append(Text("`sglpatch patchset show NAME` lists a patchset's files and checks per release",
                          style="dim"))
        return Group(*parts)


def _earlier_items(revs: list[RevisionInfo]) -> list[tuple[str, bool]]:
    """The earlier revisions as shown (newest first): a run of consecutive revisions that are not
    withdrawn as one range ("r7–r3"), a withdrawn one alone ("r2 (withdrawn)"); with whether it
    is withdrawn."""
    out: list[tuple[str, bool]] = []
    run: list[int] = []

    def flush() -> None:
        if run:
            out.append((f"r{run[0]}" if len(run) == 1 else f"r{run[0]}–r{run[-1]}", False))
            run.clear()

    for r in revs:
        if r.withdrawn:
            flush()
            out.append((f"r{r.revision} (withdrawn)", True))
        elif run and run[-1] != r.revision + 1:
            flush()
            run.append(r.revision)
        else:
            run.append(r.revision)
    flush()
    return out


@dataclass
class PatchsetDetails:
    """One patchset (at the revision asked for): its revisions, and per release of that revision
    the series and the files it modifies, adds and deletes, and its checks."""

    patchset: Patchset
    revisions: list[RevisionInfo]

    def files(self, version: str) -> dict[str, list[str]]:
        t = self.patchset.target(version)
        touched = self.patchset.touched_paths(version)
        added = sorted(p for p in touched if t.pristine.get(p) is None)
        deleted = sorted(p for p in touched if p in t.expected and t.expected[p] is None)
        modified = sorted(p for p in touched if p not in added and p not in deleted)
        return {"modified": modified, "added": added, "deleted": deleted}

    def checks(self) -> dict[str, str]:
        ps = self.patchset
        out = {"L0": "py_compile of every written .py file on the host (always)"}
        if ps.spec.checks.l1:
            out["L1"] = f"{ps.spec.checks.l1} run by the host's interpreter (imports and validation)"
        out["L2-L3"] = "`sglpatch check --host H`: a real server (needs the host's serve profile)"
        return out

    def to_json(self) -> dict[str, Any]:
        ps = self.patchset
        me = next((r for r in self.revisions if r.revision == ps.revision), None)
        return {"name": ps.name, "revision": ps.revision, "description": ps.description, "root": str(ps.root),
                "withdrawn": me.withdrawn if me else None,
                "revisions": [r.to_json() for r in self.revisions],
                "targets": {v: {"series": list(ps.target(v).series), **self.files(v),
                                "left_out": list(ps.target(v).left_out)} for v in ps.versions},
                "checks": self.checks()}

    def __rich__(self) -> Group:
        ps = self.patchset
        head = Text.assemble((f"{ps.name} revision {ps.revision}", "bold"), f"  ({ps.root})")
        parts: list[Any] = [head]
        if ps.description:
            parts.append(Text(" ".join(ps.description.split()), style="dim"))
        revs = Table(title="revisions", title_justify="left")
        for col in ("revision", "SGLang releases", "status"):
            revs.add_column(col)
        for r in self.revisions:
            status = Text(r.status, style="green" if r.current else "yellow" if r.withdrawn else "")
            if r.withdrawn:
                status.append(f": {' '.join(r.withdrawn.split())}")
            mark = " (shown)" if r.revision == ps.revision and not r.current else ""
            revs.add_row(f"r{r.revision}{mark}", ", ".join(r.releases) if r.releases else "(hashes only)", status)
        parts.append(revs)
        for v in ps.versions:
            f = self.files(v)
            t = Table(title=f"sglang {v}: {len(ps.target(v).series)} patch(es), "
                            f"{sum(len(x) for x in f.values())} file(s)", title_justify="left")
            t.add_column("file")
            t.add_column("change")
            for kind in ("modified", "added", "deleted"):
                for p in f[kind]:
                    t.add_row(p, Text(kind, style={"added": "green", "deleted": "red"}.get(kind, "")))
            parts.append(t)
            parts.append(Text("series: " + ", ".join(Path(s).name for s in ps.target(v).series), style="dim"))
            left = ps.target(v).left_out
            if left:     # a `patchset port --partial` target: apply refuses it until this is done
                parts.append(Text(f"PARTIAL port: sglang {v} lacks {len(left)} change(s) (apply refuses it "
                                  f"until they are made and targets.{v}.left_out deleted): "
                                  + "; ".join(left), style="bold red"))
        checks = Table(title="checks", title_justify="left", show_header=False)
        checks.add_column("level", style="bold")
        checks.add_column("")
        for level, what in self.checks().items():
            checks.add_row(level, what)
        parts.append(checks)
        return Group(*parts)


def list_patchsets(search: list[Path] | None = None) -> PatchsetListing:
    """Every patchset on the search path (``./patchsets``, then the installed ones)."""
    out: list[tuple[Patchset, list[RevisionInfo]]] = []
    broken: dict[str, str] = {}
    for name, where in sorted(available_patchsets(search).items()):
        try:
            ps = load_patchset(where)
            out.append((ps, _revisions(ps)))
        except SglpatchError as exc:
            broken[name] = exc.message
    return PatchsetListing(out, broken)


def show_patchset(name: str) -> PatchsetDetails:
    """``name`` (NAME, NAME@REVISION or a patchset directory): its revisions (judged by the newest
    one's ``withdrawn``), and the files and checks of the revision asked for. Raises
    PatchsetError / ConfigError as :func:`~sglang_patcher.patchset.load_patchset` does."""
    ps = load_patchset(name)
    newest = ps
    if "@" in str(name):
        try:
            newest = load_patchset(str(name).rsplit("@", 1)[0])
        except SglpatchError:
            newest = ps
    return PatchsetDetails(ps, _revisions(newest))
