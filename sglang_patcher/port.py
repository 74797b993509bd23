"""Carry a patchset's series from one SGLang release to another (``sglpatch patchset port``).

:func:`port_series` takes the series of the ``from`` target and, patch by patch in series order,
carries each hunk to the ``to`` release's pristine tree:

1. **Strict** — the project's applier (:mod:`.applier`: fuzz 0, unique placement, anchoring) on the
   ``to`` file as the earlier carried hunks left it. Outcomes: ``applied`` (where the header says),
   ``offset`` (elsewhere, by ``offset`` lines), ``already_applied`` (the release carries the change:
   nothing to carry).
2. **Three-way merge** (:mod:`.merge3`) where strict fails: base = the ``from`` release's file as the
   series had it just before this hunk, theirs = that file with the hunk, ours = the ``to`` file so
   far. A clean merge is ``merged`` (the hunk's change, in a context the release changed: review
   it); otherwise ``conflict``, with the conflicting regions of the three sides.

A file the series modifies that the ``to`` release lacks is looked for elsewhere in it: a file new in
that release (absent from the ``from`` release) or one of the same name, whose content is at least
:data:`MOVE_SIMILARITY` like the old file's, is taken as the file **moved** there and its hunks go to
it; otherwise its hunks are ``vanished``, with a hint naming the release files that hold the hunk's
context lines, if any. Whole-file operations (new, deleted, renamed files, mode changes) go strictly
or conflict.

Each ported patch is the diff of the files it touches before and after its carried hunks (3 lines
of context, git style), under the patch's own text with a line saying where it came from. The
result is checked once more: the ported series must apply strictly to the ``to`` tree and give the
same files. ``conflict_files`` holds, per file with a conflicting hunk (at its ``to`` path), the
whole-file three-way merge (base = ``from`` pristine, ours = ``to`` pristine, theirs = ``from``
patched) with diff3 markers, for a person to resolve.

:func:`write_port` writes a result into a patchset directory: the series under ``sglang-<to>/``, the
target (series, ``new_files``) added to ``patchset.yaml`` and pinned by the refresh machinery
(:func:`.patchset_write.add_target`) — only when every hunk carried, or with ``partial``. Nothing here
downloads anything: the trees come as readers (``service_port.port_patchset`` uses the PyPI wheels).
"""

from __future__ import annotations

import io
import json
import posixpath
import re
import shutil
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from difflib import SequenceMatcher
from pathlib import Path
from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text
from unidiff import PatchSet
from unidiff.errors import UnidiffParseError

from .applier import ApplyResult, FileChange, apply_series
from .errors import ApplyError, ConfigError, PatchsetError, SglpatchError, first_few
from .merge3 import Conflict, merge3, split_lines
from .patchset import Patchset
from .patchset_write import add_target

__all__ = ["HunkPort", "FilePort", "PatchPort", "NewFilePort", "PortResult", "port_series", "write_port",
           "write_conflicts", "save_report", "CARRIED", "BLOCKING", "MOVE_SIMILARITY"]

Reader = Callable[[str], "bytes | None"]

CARRIED = ("applied", "offset", "already_applied", "merged")
BLOCKING = ("conflict", "vanished")
MOVE_SIMILARITY = 0.5          # as git's rename detection: at least half the old file's lines
_ENC = ("utf-8", "surrogateescape")


# --------------------------------------------------------------------------------------- results


@dataclass
class HunkPort:
    """How one hunk (or, ``index`` 0, one whole-file operation) of the series went.

    ``patch`` is the series entry, ``path`` the file in the ``from`` release, ``new_path`` where it
    went in the ``to`` release (None: vanished), ``status`` one of :data:`CARRIED` or
    :data:`BLOCKING`. ``line`` is the 1-based line of the ``to`` file (as the earlier carried hunks
    left it) where the hunk starts (its first context line; for a merged hunk, counted back from
    its first changed line), ``offset`` how far that is from where its header puts it (corrected
    for the earlier hunks of the patch). ``detail`` says why strict placement failed (merged,
    conflict) or where the context went (vanished); ``conflicts`` are the merge's conflict regions.
    """

    patch: str
    path: str
    new_path: str | None
    index: int
    header: str
    status: str
    offset: int = 0
    line: int | None = None
    detail: str = ""
    conflicts: list[Conflict] = field(default_factory=list)

    @property
    def name(self) -> str:
        what = f"hunk {self.index} {self.header}" if self.index else self.header
        return f"{self.patch}: {self.path} {what}"

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"patch": self.patch, "path": self.path, "new_path": self.new_path,
                               "index": self.index, "header": self.header, "status": self.status,
                               "offset": self.offset, "line": self.line}
        if self.detail:
            out["detail"] = self.detail
        if self.conflicts:
            out["conflicts"] = [_conflict_json(c) for c in self.conflicts]
        return out


def _text(lines: tuple[bytes, ...] | list[bytes]) -> str:
    return b"".join(lines).decode(*_ENC)


def _conflict_json(c: Conflict) -> dict[str, Any]:
    return {"line": c.ours_start + 1, "ours": _text(c.ours), "base_line": c.base_start + 1,
            "base": _text(c.base), "theirs": _text(c.theirs)}


@dataclass
class FilePort:
    """A file of the series: ``fate`` ``kept`` (same path), ``moved`` (to ``new_path``, content
    ``similarity``), ``vanished`` (not in the ``to`` release) or ``created`` (the series creates it);
    ``note`` says how a move or vanishing was decided."""

    path: str
    new_path: str | None
    fate: str
    similarity: float | None = None
    note: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "new_path": self.new_path, "fate": self.fate,
                "similarity": None if self.similarity is None else round(self.similarity, 3), "note": self.note}


@dataclass
class PatchPort:
    """One patch of the series: ``source`` (the ``from`` series entry), ``dest`` (its ``to`` series
    entry), ``text`` (the ported patch; None when nothing of it is left to carry)."""

    source: str
    dest: str
    text: str | None
    hunks: list[HunkPort] = field(default_factory=list)


@dataclass
class NewFilePort:
    """A ``new_files`` entry of the ``from`` target in the ``to`` release: ``added`` (absent there),
    ``already_there`` (the release has these exact bytes) or ``clash`` (it has other content)."""

    dst: str
    src: str
    status: str


@dataclass
class PortResult:
    """What :func:`port_series` found; :func:`write_port` and the service add ``written``."""

    patchset: str
    revision: int
    from_version: str
    to_version: str
    patches: list[PatchPort] = field(default_factory=list)
    files: dict[str, FilePort] = field(default_factory=dict)
    new_files: list[NewFilePort] = field(default_factory=list)
    conflict_files: dict[str, bytes] = field(default_factory=dict)
    seconds: float = 0.0
    tree_seconds: float = 0.0
    mode: str = "check"                # check | in_place | out
    written: dict[str, Any] = field(default_factory=dict)

    @property
    def hunks(self) -> list[HunkPort]:
        return [h for p in self.patches for h in p.hunks]

    @property
    def blocking(self) -> list[HunkPort]:
        """The hunks that did not carry (conflict, vanished)."""
        return [h for h in self.hunks if h.status in BLOCKING]

    @property
    def clashes(self) -> list[NewFilePort]:
        return [n for n in self.new_files if n.status == "clash"]

    @property
    def complete(self) -> bool:
        """True when every hunk and new file carried."""
        return not self.blocking and not self.clashes

    def counts(self) -> dict[str, int]:
        out = {s: 0 for s in (*CARRIED, *BLOCKING)}
        for h in self.hunks:
            out[h.status] += 1
        return out

    def per_file(self) -> dict[str, dict[str, int]]:
        """``{from path: {status: hunks}}`` in the order the series first touches each file."""
        out: dict[str, dict[str, int]] = {}
        for h in self.hunks:
            row = out.setdefault(h.path, {})
            row[h.status] = row.get(h.status, 0) + 1
        return out

    @property
    def left_out(self) -> int:
        """How many changes did not carry: hunks that conflict or vanished, clashing new files."""
        return len(self.blocking) + len(self.clashes)

    @property
    def partial_written(self) -> Path | None:
        """The patchset directory a PARTIAL target was written into (``--partial``), else None."""
        w = self.written
        return Path(w["patchset_yaml"]).parent if w.get("partial") and w.get("patchset_yaml") else None

    @property
    def left_out_changes(self) -> list[str]:
        """One label per change that did not carry (a blocking hunk with its status, a clashing new
        file): what a ``--partial`` target lacks (its ``left_out`` list in ``patchset.yaml``)."""
        parts = [h.name + f" ({h.status})" for h in self.blocking]
        parts += [f"new file {n.dst} ({n.status}: the release has its own file there)" for n in self.clashes]
        return parts

    def failure(self) -> str:
        """One line naming what did not carry (empty when complete); with a PARTIAL target written,
        it says so first, with where and how many changes it lacks."""
        parts = self.left_out_changes
        if not parts:
            return ""
        where = self.partial_written
        if where is not None:
            return (f"{self.patchset} r{self.revision}: the target {self.to_version} written into "
                    f"{where / 'patchset.yaml'} is PARTIAL — {len(parts)} change(s) of the port "
                    f"{self.from_version} -> {self.to_version} did not carry and are left out, so it is not "
                    f"finished: " + "; ".join(parts))
        return (f"{self.patchset} r{self.revision}: {len(parts)} change(s) of the port {self.from_version} -> "
                f"{self.to_version} did not carry: " + "; ".join(parts))

    def finish_steps(self) -> str:
        """What to do with a PARTIAL target (empty when none was written): docs/patchsets.md,
        "Finishing a port by hand"."""
        where = self.partial_written
        if where is None:
            return ""
        conflicts = self.written.get("conflicts_dir")
        return (f"finish it by hand (docs/patchsets.md, \"Finishing a port by hand\"): make each change left out "
                f"in the series under {where / ('sglang-' + self.to_version)}/"
                + (f" (the conflicted files under {conflicts} show all three sides)" if conflicts else "")
                + f", then `sglpatch patchset refresh {where} --sglang {self.to_version}` to re-pin and "
                  f"`sglpatch diff {where} --sglang {self.to_version}` (exit 0); remove PARTIAL from the "
                  f"target's comment in patchset.yaml")

    def to_json(self) -> dict[str, Any]:
        return {
            "patchset": self.patchset, "revision": self.revision, "from": self.from_version,
            "to": self.to_version, "mode": self.mode, "complete": self.complete,
            "partial": self.partial_written is not None, "left_out": self.left_out,
            "seconds": round(self.seconds, 3), "tree_seconds": round(self.tree_seconds, 3),
            "counts": self.counts(), "per_file": self.per_file(),
            "files": {p: f.to_json() for p, f in self.files.items()},
            "patches": [{"source": p.source, "dest": p.dest if p.text is not None else None,
                         "hunks": len(p.hunks)} for p in self.patches],
            "hunks": [h.to_json() for h in self.hunks],
            "new_files": [{"dst": n.dst, "src": n.src, "status": n.status} for n in self.new_files],
            "conflict_files": sorted(self.conflict_files),
            "written": self.written,
        }

    def __rich__(self) -> Group:
        c = self.counts()
        head = Text.assemble(
            (f"{self.patchset} r{self.revision}: sglang {self.from_version} -> {self.to_version}", "bold"),
            f" in {self.seconds:.1f} s (+{self.tree_seconds:.1f} s for the release trees): "
            f"{c['applied']} as is, {c['offset']} at an offset, {c['merged']} merged, "
            f"{c['already_applied']} already in the release, ",
            (f"{c['conflict']} conflict(s), {c['vanished']} vanished", "bold red" if self.blocking else "green"),
            (f" — PARTIAL target written: {self.left_out} change(s) left out (below)", "bold yellow")
            if self.partial_written is not None else "")
        t = Table(show_header=True, box=None, pad_edge=False)
        t.add_column("file", overflow="fold", ratio=1)
        for col in ("as is", "offset", "merged", "upstream", "conflict", "vanished"):
            t.add_column(col, justify="right", no_wrap=True)
        for path, row in self.per_file().items():
            f = self.files.get(path)
            shown = path
            if f is not None and f.fate == "moved":
                shown = f"{path} -> {f.new_path}"
            t.add_row(shown, *(str(row.get(s, "")) for s in ("applied", "offset", "merged", "already_applied")),
                      Text(str(row.get("conflict", "")), style="red"), Text(str(row.get("vanished", "")), style="red"))
        parts: list[Any] = [head, t]
        for h in self.hunks:
            if h.status == "offset":
                parts.append(Text(f"  offset {h.offset:+d}: {h.name} -> line {h.line}", style="dim"))
            elif h.status == "merged":
                parts.append(Text(f"  merged (review): {h.name} -> {h.new_path} line {h.line}", style="yellow"))
            elif h.status == "already_applied":
                parts.append(Text(f"  already in sglang {self.to_version}: {h.name} (dropped)", style="dim"))
            elif h.status == "vanished":
                parts.append(Text(f"  vanished: {h.name}" + (f" — {h.detail}" if h.detail else ""), style="red"))
            elif h.status == "conflict":
                parts.append(Text(f"  conflict: {h.name}" + (f" — {h.detail}" if h.detail else ""), style="bold red"))
                for conflict in h.conflicts:
                    parts.append(_conflict_view(conflict, self))
        for n in self.new_files:
            if n.status != "added":
                parts.append(Text(f"  new file {n.dst}: {n.status}", style="red" if n.status == "clash" else "dim"))
        for f in self.files.values():
            if f.fate in ("moved", "vanished") and f.note:
                parts.append(Text(f"  {f.path}: {f.note}", style="yellow"))
        parts.append(_written_view(self))
        return Group(*parts)


def _clip(lines: tuple[bytes, ...], most: int = 12) -> str:
    text = [ln.decode(*_ENC).rstrip("\r\n") for ln in lines[:most]]
    if len(lines) > most:
        text.append(f"… {len(lines) - most} more line(s)")
    return "\n".join(f"      {ln}" for ln in text) if text else "      (nothing)"


def _conflict_view(c: Conflict, r: PortResult) -> Text:
    ours = _clip(c.ours) if c.ours else f"      (nothing: sglang {r.to_version} does not have these lines)"
    return Text(f"    sglang {r.to_version} at line {c.ours_start + 1}:\n{ours}\n"
                f"    sglang {r.from_version} (base) at line {c.base_start + 1}:\n{_clip(c.base)}\n"
                f"    {r.patchset} r{r.revision} wants:\n{_clip(c.theirs)}")


def _written_view(r: PortResult) -> Text:
    w = r.written
    lines = []
    if r.partial_written is not None:
        lines.append(f"PARTIAL: wrote the target {r.to_version} into {w['patchset_yaml']} WITHOUT {r.left_out} "
                     f"change(s) that did not carry ({len(r.blocking)} hunk(s) conflicting or vanished, "
                     f"{len(r.clashes)} new file(s) clashing): it does not make the patchset's change on sglang "
                     f"{r.to_version} until finished; series: " + ", ".join(w.get("series", [])))
        lines.append("next: " + r.finish_steps())
    elif w.get("patchset_yaml"):
        lines.append(f"wrote the target {r.to_version} into {w['patchset_yaml']} (pinned); series: "
                     + ", ".join(w.get("series", [])))
    elif w.get("reason"):
        lines.append(f"nothing written into patchset.yaml: {w['reason']}")
    if w.get("conflicts_dir"):
        lines.append(f"conflicted files (three-way merges with markers) under {w['conflicts_dir']}")
    if w.get("report"):
        lines.append(f"report: {w['report']}")
    style = "yellow" if r.blocking or r.clashes else "green"
    return Text("\n".join(lines), style=style)


# ----------------------------------------------------------------------------------------- engine


def _header(src_start: int, src_len: int, dst_start: int, dst_len: int) -> str:
    return f"@@ -{src_start},{src_len} +{dst_start},{dst_len} @@"


def _preamble(text: str) -> str:
    """The text of a patch before its first file header (its description), without trailing blanks."""
    lines = text.splitlines(keepends=True)
    for i, line in enumerate(lines):
        if line.startswith("diff --git ") or (line.startswith("--- ") and i + 1 < len(lines)
                                               and lines[i + 1].startswith("+++ ")):
            return "".join(lines[:i]).rstrip()
    return text.rstrip()


def _strip(name: str | None) -> str | None:
    if name is None or name == "/dev/null":
        return None
    name = name.strip().strip('"')
    return name.split("/", 1)[1] if "/" in name else name


def _info(pf, prefix: str) -> bool:
    return any(line.startswith(prefix) for line in pf.patch_info or ())


def _is_plain_modification(pf) -> bool:
    """A section that only changes lines of an existing file (no create/delete/rename/copy/mode)."""
    src, dst = _strip(pf.source_file), _strip(pf.target_file)
    if src is None or dst is None or src != dst or pf.is_binary_file:
        return False
    if any(_info(pf, p) for p in ("rename from ", "copy from ", "old mode ", "new mode ",
                                  "new file mode ", "deleted file mode ")):
        return False
    return bool(len(pf)) and not all(h.source_start == 0 and h.source_length == 0 for h in pf)


def _section_text(pf) -> str:
    """One file section of a patch, without the patch's description."""
    info = [ln for ln in (pf.patch_info or ()) if ln.startswith(("diff --git ", "old mode ", "new mode ",
                                                                 "new file mode ", "deleted file mode ",
                                                                 "rename ", "copy ", "similarity ", "index "))]
    body = str(pf)
    start = body.find("--- ")
    if start < 0:  # hunkless (empty new file, pure rename, mode change): the git header is all of it
        return "".join(info)
    return "".join(info) + body[start:]


def _one_hunk(path: str, hunk, src_start: int, dst_start: int) -> str:
    """A patch of ``path`` with ``hunk`` alone, its header moved to ``src_start``/``dst_start``."""
    body = str(hunk).split("\n", 1)[1] if "\n" in str(hunk) else ""
    head = _header(src_start, hunk.source_length, dst_start, hunk.target_length)
    return f"--- a/{path}\n+++ b/{path}\n{head}\n{body}"


def _why(exc: ApplyError) -> str:
    """The applier's reason, without the one-hunk patch's name, hunk number and header."""
    m = re.search(r"hunk #\d+ @@ [^@]* @@ (?:\(patch line \d+\) )?(.*)", exc.message, re.S)
    return m.group(1) if m else exc.message


class _Porter:
    def __init__(self, ps: Patchset, from_version: str, to_version: str, read_old: Reader, read_new: Reader,
                 old_paths: Collection[str], new_paths: Collection[str]):
        self.ps, self.frm, self.to = ps, from_version, to_version
        self.read_old, self.read_new = read_old, read_new
        self.old_paths, self.new_paths = set(old_paths), list(new_paths)
        self.old: dict[str, bytes | None] = {}      # from release, as the series has it so far
        self.new: dict[str, bytes | None] = {}      # to release, as the carried hunks have it so far
        self.files: dict[str, FilePort] = {}
        self.moved_sources: dict[str, str] = {}     # to path -> from path, for moves
        self._corpus: dict[str, bytes] | None = None
        self.labels = (f"sglang {to_version}", f"sglang {from_version}", f"{ps.name} r{ps.revision}")

    # --- the two worlds

    def old_get(self, path: str) -> bytes | None:
        if path not in self.old:
            self.old[path] = self.read_old(path)
        return self.old[path]

    def new_get(self, path: str) -> bytes | None:
        if path not in self.new:
            self.new[path] = self.read_new(path)
        return self.new[path]

    # --- where a file went

    def locate(self, path: str) -> FilePort:
        if path in self.files:
            return self.files[path]
        if self.new_get(path) is not None:
            f = FilePort(path, path, "kept")
        elif self.read_old(path) is None:
            f = FilePort(path, path, "created")
        else:
            f = self._find_move(path)
        self.files[path] = f
        return f

    def _find_move(self, path: str) -> FilePort:
        old = self.read_old(path) or b""
        name, suffix = posixpath.basename(path), posixpath.splitext(path)[1]
        mine = {ln.strip() for ln in split_lines(old) if ln.strip()}
        scored = []
        for q in self.new_paths:
            if q == path or not q.endswith(suffix) or q in self.moved_sources:
                continue
            if posixpath.basename(q) != name and q in self.old_paths:
                continue        # a file both releases have is not where this one went
            data = self.read_new(q)
            if data is None:
                continue
            theirs = {ln.strip() for ln in split_lines(data) if ln.strip()}
            union = mine | theirs
            scored.append((len(mine & theirs) / len(union) if union else 0.0, q, data))
        scored.sort(key=lambda x: (-x[0], x[1]))
        best: tuple[float, str] | None = None
        for _, q, data in scored[:5]:
            ratio = SequenceMatcher(None, split_lines(old), split_lines(data), autojunk=False).ratio()
            if best is None or ratio > best[0]:
                best = (ratio, q)
        if best is not None and best[0] >= MOVE_SIMILARITY:
            self.moved_sources[best[1]] = path
            why = [f"new in {self.to}"] if best[1] not in self.old_paths else []
            why += ["of the same name"] if posixpath.basename(best[1]) == name else []
            return FilePort(path, best[1], "moved", best[0],
                            f"not in sglang {self.to}; {best[1]} (a file {' and '.join(why)}) is "
                            f"{best[0]:.0%} like it: its hunks are carried there")
        said = (f"not in sglang {self.to}, and no file there is its moved copy"
                + (f" (closest: {best[1]}, {best[0]:.0%} alike)" if best and best[0] >= 0.3 else ""))
        return FilePort(path, None, "vanished", best[0] if best else None, said)

    def context_hint(self, lines: list[bytes]) -> str:
        """Where in the ``to`` release a vanished hunk's context lines occur (a hint for a person)."""
        keys = sorted({ln.strip() for ln in lines if len(ln.strip()) >= 8 and not ln.strip().startswith(b"#")},
                      key=lambda s: (-len(s), s))[:5]
        if not keys:
            return ""
        if self._corpus is None:
            self._corpus = {}
            for q in self.new_paths:
                if q.endswith(".py"):
                    data = self.read_new(q)
                    if data is not None:
                        self._corpus[q] = data
        hits = []
        for q, data in self._corpus.items():
            n = sum(1 for k in keys if k in data)
            if n * 2 >= len(keys) and n:
                hits.append((n, q))
        hits.sort(key=lambda x: (-x[0], x[1]))
        if not hits:
            return f"none of its context lines occur in sglang {self.to}"
        return (f"its context lines occur in sglang {self.to} in "
                + first_few([f"{q} ({n} of {len(keys)})" for n, q in hits], 3, noun="file(s)"))

    # --- one hunk

    def strict(self, path: str, data: bytes, hunk, src_start: int, dst_start: int, label: str):
        """The applier on one hunk: (new bytes, HunkReport). Raises ApplyError."""
        text = _one_hunk(path, hunk, src_start, dst_start)
        result = apply_series([(label, text)], lambda p: data if p == path else None)
        return result.files[path].new, result.hunks[0]

    def carry_modification(self, patch: str, pf, out: list[HunkPort]) -> None:
        path = _strip(pf.target_file)
        assert path is not None
        where = self.locate(path)
        old_delta = new_delta = 0
        for index, hunk in enumerate(pf, 1):
            header = _header(hunk.source_start, hunk.source_length, hunk.target_start, hunk.target_length)
            base = self.old_get(path)
            if base is None:
                raise PatchsetError(f"{patch}: {path}: the series modifies a file sglang {self.frm} does not have",
                                    hint=f"`sglpatch diff {self.ps.name} --sglang {self.frm}` shows what is wrong")
            try:
                theirs, _ = self.strict(path, base, hunk, hunk.source_start + old_delta,
                                        hunk.target_start + old_delta, patch)
            except ApplyError as exc:
                raise PatchsetError(f"{patch}: {path} hunk {index} does not apply to sglang {self.frm} itself: "
                                    f"{exc.message}",
                                    hint=f"`sglpatch diff {self.ps.name} --sglang {self.frm}` must pass first") from exc
            old_delta += hunk.target_length - hunk.source_length
            self.old[path] = theirs
            if where.new_path is None:
                old_side = [ln.value.encode(*_ENC) for ln in hunk if ln.line_type in " -"]
                out.append(HunkPort(patch, path, None, index, header, "vanished", detail=self.context_hint(old_side)))
                continue
            q = where.new_path
            ours = self.new_get(q) or b""
            expected = (hunk.source_start - 1 if hunk.source_length else hunk.source_start) + new_delta
            try:
                carried, report = self.strict(q, ours, hunk, hunk.source_start + new_delta,
                                              hunk.target_start + new_delta, patch)
            except ApplyError as exc:
                why = _why(exc)
            else:
                self.new[q] = carried
                new_delta += len(split_lines(carried)) - len(split_lines(ours))
                out.append(HunkPort(patch, path, q, index, header, report.status, report.offset_lines, report.line))
                continue
            merged = merge3(split_lines(base), split_lines(ours), split_lines(theirs), labels=self.labels)
            if not merged.clean:
                out.append(HunkPort(patch, path, q, index, header, "conflict",
                                    line=merged.conflicts[0].ours_start + 1,
                                    detail=f"strict: {why}", conflicts=merged.conflicts))
                continue
            result = merged.data
            if result == ours:
                out.append(HunkPort(patch, path, q, index, header, "already_applied",
                                    detail="the merge finds the change in the release already"))
                continue
            a, b = split_lines(ours), split_lines(result)
            first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            lead = next((i for i, ln in enumerate(hunk) if ln.line_type in "-+"), 0)
            start = max(0, first - lead)       # where the hunk's first line would be, as for strict hunks
            self.new[q] = result
            new_delta += len(b) - len(a)
            out.append(HunkPort(patch, path, q, index, header, "merged", start - expected, start + 1,
                                detail=f"strict: {why}"))

    def carry_section(self, patch: str, pf, out: list[HunkPort]) -> set[str]:
        """A whole-file operation (create, delete, rename, copy, mode): strictly, or a conflict."""
        text = _section_text(pf)
        label = patch
        old = apply_series([(label, text)], self.old_get)      # the from release: must apply
        for p, c in old.files.items():
            self.old[p] = c.new
        shown = _strip(pf.target_file) or _strip(pf.source_file) or "?"
        try:
            res = apply_series([(label, text)], self.new_get)
        except ApplyError as exc:
            out.append(HunkPort(patch, shown, None, 0, "whole-file operation", "conflict",
                                detail=exc.message.split(": ", 1)[-1]))
            return set()
        for p, c in res.files.items():
            self.new[p] = c.new
            self.files.setdefault(p, FilePort(p, p, "created" if c.old is None else "kept"))
        for h in res.hunks:
            out.append(HunkPort(patch, h.path, h.path, h.index, h.header, h.status, h.offset_lines, h.line))
        return set(res.files)

    # --- the series

    def run(self) -> PortResult:
        result = PortResult(self.ps.name, self.ps.revision, self.frm, self.to)
        entries = self.ps.target(self.frm).series
        for rel, (label, text) in zip(entries, self.ps.series(self.frm)):
            try:
                sections = list(PatchSet(io.StringIO(text)))
            except UnidiffParseError as exc:
                raise PatchsetError(f"{label}: not a valid unified diff ({exc})") from exc
            before: dict[str, bytes | None] = {}
            order: list[str] = []
            hunks: list[HunkPort] = []
            for pf in sections:
                if _is_plain_modification(pf):
                    where = self.locate(_strip(pf.target_file) or "")
                    touched = {where.new_path} if where.new_path else set()
                    for q in touched:
                        if q not in before:
                            before[q] = self.new_get(q)
                            order.append(q)
                    self.carry_modification(rel, pf, hunks)
                else:
                    snapshot = dict(self.new)
                    for q in self.carry_section(rel, pf, hunks):
                        if q not in before:
                            before[q] = snapshot[q] if q in snapshot else self.read_new(q)
                            order.append(q)
            diffs = "".join(ApplyResult(files={q: FileChange(q, before[q], self.new.get(q))}).diff_text()
                            for q in order if before[q] != self.new.get(q))
            dest = f"sglang-{self.to}/{posixpath.basename(rel)}"
            ported = None
            if diffs:
                ported = (_preamble(text) + "\n\n" + _trailer(self, hunks) + "\n\n" + diffs).lstrip("\n")
            result.patches.append(PatchPort(rel, dest, ported, hunks))
        result.files = dict(self.files)
        for dst, src in sorted(self.ps.target(self.frm).new_files.items()):
            content = (self.ps.root / src).read_bytes()
            live = self.read_new(dst)
            status = "added" if live is None else "already_there" if live == content else "clash"
            result.new_files.append(NewFilePort(dst, src, status))
        self._verify(result)
        self._conflict_files(result)
        return result

    def _verify(self, result: PortResult) -> None:
        """The ported series applies strictly to the to release and gives the files the port built."""
        series = [(p.dest, p.text) for p in result.patches if p.text is not None]
        if not series:
            return
        try:
            check = apply_series(series, self.read_new)
        except SglpatchError as exc:
            raise SglpatchError(f"internal error: the ported series does not apply to sglang {self.to}: "
                                f"{exc.message}", hint="please report this with the patchset") from exc
        bad = [p for p, c in check.files.items() if c.new != self.new.get(p)]
        if bad:
            raise SglpatchError(f"internal error: the ported series gives other bytes than the port for "
                                f"{', '.join(bad)}", hint="please report this with the patchset")

    def _conflict_files(self, result: PortResult) -> None:
        for h in result.hunks:
            if h.status != "conflict" or h.new_path is None or h.new_path in result.conflict_files:
                continue
            src = self.moved_sources.get(h.new_path, h.path)
            base, ours, theirs = self.read_old(src), self.read_new(h.new_path), self.old.get(src)
            if base is None or ours is None or theirs is None:
                continue
            merged = merge3(split_lines(base), split_lines(ours), split_lines(theirs), labels=self.labels)
            result.conflict_files[h.new_path] = merged.data


def _trailer(porter: _Porter, hunks: list[HunkPort]) -> str:
    counts = {s: sum(1 for h in hunks if h.status == s) for s in (*CARRIED, *BLOCKING)}
    said = ", ".join(f"{n} {s.replace('_', ' ')}" for s, n in counts.items() if n)
    return (f"Ported from sglang {porter.frm} to {porter.to} by `sglpatch patchset port` "
            f"({porter.ps.name} r{porter.ps.revision}; hunks: {said}).")


def port_series(ps: Patchset, from_version: str, to_version: str, read_old: Reader, read_new: Reader, *,
                old_paths: Collection[str], new_paths: Collection[str]) -> PortResult:
    """Carry ``ps``'s series for ``from_version`` to ``to_version`` (see the module docstring).

    ``read_old``/``read_new`` serve the two releases' pristine trees (site-packages paths → bytes or
    None); ``old_paths``/``new_paths`` list every file of each (to find moved files). Raises
    :class:`UnsupportedVersionError` when ``ps`` has no target ``from_version``,
    :class:`PatchsetError` when that target does not render against ``read_old`` (stale pins, a hunk
    that does not apply there). Writes nothing; conflicts are in the result, not raised."""
    t0 = time.monotonic()
    ps.render(from_version, read_old)        # the starting point must be the patchset as pinned
    result = _Porter(ps, from_version, to_version, read_old, read_new, old_paths, new_paths).run()
    result.seconds = time.monotonic() - t0
    return result


# ---------------------------------------------------------------------------------------- writing


def write_conflicts(result: PortResult, where: Path) -> Path | None:
    """Write ``result.conflict_files`` under ``where`` (replaced); returns it, or None when none."""
    if where.exists():
        shutil.rmtree(where)
    if not result.conflict_files:
        return None
    for path, data in sorted(result.conflict_files.items()):
        f = where / path
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_bytes(data)
    return where


def write_port(result: PortResult, root: Path, read_new: Reader, *, partial: bool = False) -> dict[str, Any]:
    """Write ``result`` into the patchset directory ``root``: the ported patches under
    ``sglang-<to>/``, the target in ``patchset.yaml`` (series, ``new_files`` but clashing ones)
    pinned from ``read_new``. Only when :attr:`PortResult.complete`, or with ``partial`` (the target's
    key line then says so in a comment, and its ``left_out`` list names what it lacks: apply refuses
    it until that list is gone). Refuses (ConfigError) a series directory that exists and
    is not empty. Returns what it wrote (``patchset_yaml``, ``series``, ``partial``, ``reason``)."""
    to = result.to_version
    if not result.complete and not partial:
        return {"patchset_yaml": None, "partial": False,
                "reason": f"{len(result.blocking) + len(result.clashes)} change(s) did not carry "
                          f"(--partial writes the rest)"}
    series_dir = root / f"sglang-{to}"
    if series_dir.exists() and any(series_dir.iterdir()):
        raise ConfigError(f"{series_dir} exists and is not empty: the port would mix with it",
                          hint="remove it (or port into a scratch copy with --out DIR)")
    patches = [p for p in result.patches if p.text is not None]
    new_files = {n.dst: n.src for n in result.new_files if n.status != "clash"}
    if not patches and not new_files:
        return {"patchset_yaml": None, "partial": partial, "reason": "nothing carried"}
    series_dir.mkdir(parents=True, exist_ok=True)
    written = []
    try:
        for p in patches:
            (root / p.dest).write_text(p.text or "", encoding="utf-8", errors="surrogateescape")
            written.append(p.dest)
        left = len(result.blocking) + len(result.clashes)
        comment = (f"PARTIAL port from {result.from_version} by `sglpatch patchset port --partial`: "
                   f"{left} change(s) left out" if not result.complete else
                   f"ported from {result.from_version} by `sglpatch patchset port`")
        add_target(root, to, written, new_files, read_new, comment=comment,
                   left_out=result.left_out_changes)
    except BaseException:
        for rel in written:
            (root / rel).unlink(missing_ok=True)
        if not any(series_dir.iterdir()):
            series_dir.rmdir()
        raise
    return {"patchset_yaml": str(root / "patchset.yaml"), "series": written, "partial": not result.complete}


def save_report(result: PortResult, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result.to_json(), indent=2, sort_keys=True) + "\n", encoding="utf-8")
