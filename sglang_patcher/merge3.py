"""Three-way merge of line lists (diff3), for ``sglpatch patchset port``.

``merge3(base, ours, theirs)`` takes each side's changes against ``base`` and combines them: a region
that only one side changed takes that side, a region both sides changed the same way takes it once,
and a region both changed differently is a :class:`Conflict`. In a port, ``base`` is the old
release's file, ``ours`` the new release's and ``theirs`` the old release's file with the patch.

How it works: each side is aligned with ``base`` (:class:`difflib.SequenceMatcher`, ``autojunk``
off: with it on, lines that occur often in a file over 200 lines — blank lines, ``)`` — are never
matched and the alignment falls apart). A base line matched on *both* sides is a sync point; the
stretch between two sync points is one chunk, resolved as a whole. Changes of the two sides that
touch — a line one side edits next to a line the other side inserts or edits, with no unchanged
line between them — therefore land in one chunk and conflict, as in ``git merge-file``: a merge
that puts two edits side by side without a line of shared context to anchor them is a guess.

Why here and not ``git merge-file``: sglpatch needs no git anywhere (it is pip-installed on
maintainer and CI machines), the port reports each conflict as structured line ranges of the three
sides rather than parsing markers back out, and the lines are the strict applier's bytes (CRLF and a
missing final newline are kept as they are). ``tests/unit/test_merge3.py`` and the ddtree port test
compare the outcome with ``git merge-file`` where git is installed.

Nothing is written anywhere; the result holds the merged lines (with conflict markers when there
are conflicts) and the conflicts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from difflib import SequenceMatcher

__all__ = ["Conflict", "MergeResult", "merge3", "split_lines"]

Lines = Sequence[bytes]


def split_lines(data: bytes) -> list[bytes]:
    """``data`` as lines, each ending at and keeping its ``\\n`` (the applier's lines: a lone ``\\r``
    does not end a line); the last one lacks it when the file does."""
    parts = data.split(b"\n")
    out = [p + b"\n" for p in parts[:-1]]
    if parts[-1]:
        out.append(parts[-1])
    return out


@dataclass(frozen=True)
class Conflict:
    """A region both sides changed differently. ``*_start`` are 0-based line indices into each input
    (``base``, ``ours``, ``theirs``) and ``out_start`` into the merged output, where its
    ``<<<<<<<`` marker line is."""

    base_start: int
    base: tuple[bytes, ...]
    ours_start: int
    ours: tuple[bytes, ...]
    theirs_start: int
    theirs: tuple[bytes, ...]
    out_start: int


@dataclass
class MergeResult:
    """``lines``: the merge (conflict markers, diff3 style, at each conflict); ``conflicts`` in order."""

    lines: list[bytes] = field(default_factory=list)
    conflicts: list[Conflict] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        return not self.conflicts

    @property
    def data(self) -> bytes:
        return b"".join(self.lines)


def _aligned(base: Lines, other: Lines) -> dict[int, int]:
    """Base line index -> index of the same line in ``other``, for the lines the alignment matches."""
    matcher = SequenceMatcher(None, base, other, autojunk=False)
    out: dict[int, int] = {}
    for i, j, n in matcher.get_matching_blocks():
        for k in range(n):
            out[i + k] = j + k
    return out


def _ended(lines: Sequence[bytes]) -> list[bytes]:
    """``lines`` with a newline added to a last line that lacks one (a marker must start a line)."""
    out = list(lines)
    if out and not out[-1].endswith(b"\n"):
        out[-1] += b"\n"
    return out


def merge3(base: Lines, ours: Lines, theirs: Lines, *,
           labels: tuple[str, str, str] = ("ours", "base", "theirs")) -> MergeResult:
    """Merge ``theirs``' changes (against ``base``) into ``ours``. ``labels`` name ours, base and
    theirs on the conflict markers. See the module docstring for the rules."""
    base, ours, theirs = list(base), list(ours), list(theirs)
    to_ours, to_theirs = _aligned(base, ours), _aligned(base, theirs)
    result = MergeResult()
    out = result.lines
    i = j = k = 0
    syncs = [b for b in range(len(base)) if b in to_ours and b in to_theirs]
    for s in [*syncs, len(base)]:
        if s < len(base):
            oj, tk = to_ours[s], to_theirs[s]
        else:
            oj, tk = len(ours), len(theirs)
        b_chunk, o_chunk, t_chunk = base[i:s], ours[j:oj], theirs[k:tk]
        if o_chunk == b_chunk or o_chunk == t_chunk:
            out.extend(t_chunk)
        elif t_chunk == b_chunk:
            out.extend(o_chunk)
        else:
            result.conflicts.append(Conflict(i, tuple(b_chunk), j, tuple(o_chunk), k, tuple(t_chunk), len(out)))
            out.append(f"<<<<<<< {labels[0]}\n".encode())
            out.extend(_ended(o_chunk))
            out.append(f"||||||| {labels[1]}\n".encode())
            out.extend(_ended(b_chunk))
            out.append(b"=======\n")
            out.extend(_ended(t_chunk))
            out.append(f">>>>>>> {labels[2]}\n".encode())
        if s < len(base):
            out.append(base[s])
            i, j, k = s + 1, oj + 1, tk + 1
    return result
