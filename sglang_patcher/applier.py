"""The strict applier: unified diffs applied with fuzz 0, in memory, all or nothing.

``unidiff`` parses the patch text; this module decides where each hunk goes and builds the new
bytes. Nothing is written anywhere: the result is a set of :class:`FileChange` (old and new bytes of
each touched file) that the deploy transaction pushes, plus a :class:`HunkReport` per hunk.

Rules (the failure classes in ``design/failure-modes.md``, "Applying"):

* **Fuzz 0.** Every context and removed line of a hunk must equal the file's line byte for byte,
  line ending included. There is no whitespace or fuzz tolerance.
* **Unique placement.** A hunk is placed where its old side (context + removed lines) occurs in the
  file. If it occurs at more than one place the hunk is refused (:class:`ApplyError` naming the patch,
  file, hunk header and every place); it is never put on the nearest look-alike block. Placement
  ignores the line numbers of the hunk header, so a hunk that matches uniquely elsewhere is applied
  and reported with ``status="offset"`` and its ``offset_lines``.
* **Anchoring** (as GNU ``patch`` with fuzz 0): a hunk with fewer leading than trailing context lines
  must sit at the start of the file, one with fewer trailing than leading lines at its end, and one
  with context lines but none at either end (it changes its first and its last line) must cover the
  whole file. This is what makes a re-run of an "append at the end" (or "insert at both ends") hunk
  recognisable as already applied.
* **Already applied.** When the old side occurs nowhere but the new side (context + added lines)
  occurs, the hunk is reported ``status="already_applied"`` and changes nothing — it is never
  reverse-applied. Likewise a file the patch creates that already exists with the patch's content,
  a file it deletes that is already gone, a rename already done.
* **All or nothing.** The first failure raises; no partial result is returned.
* **Series.** :func:`apply_series` applies patches in order; each sees the previous ones' output.
  ``FileChange.old`` is always the bytes ``read`` returned (the pristine file) and ``new`` the bytes
  after the whole series.

Patch format handled: plain unified diffs and ``git diff`` output — ``diff --git`` headers,
``new file mode``, ``deleted file mode``, ``old mode``/``new mode``, ``rename from``/``rename to``,
``copy from``/``copy to``, ``index`` lines, empty new and deleted files, and ``\\ No newline at end of
file`` on either side. Paths are taken with ``-p1`` (the first component, ``a/`` and ``b/``, is
stripped) and must stay inside site-packages (no absolute paths, no ``..``). Refused with
:class:`ApplyError`: binary diffs (``Binary files ... differ``, ``GIT binary patch``), symlinks and
submodules, hunks without any context on a non-empty file, quoted paths with escapes.
Malformed diff text raises :class:`PatchsetError`.

Line endings (decided here, tested in ``tests/unit/test_applier.py``):

* Files are bytes; a line is everything up to and including ``\\n``. Hunk lines are compared with
  their endings, so by default a hunk's endings must match the target's exactly.
* A patch file in which **every** line ends in CRLF was converted in transit (an editor, a Windows
  checkout): its CRs are stripped before parsing and it is treated as an LF patch (noted in
  ``ApplyResult.notes``). A patch with mixed endings is taken literally — this is what ``git diff``
  produces for a CRLF file (LF headers, CRLF content lines).
* When a hunk's lines all use one convention and the target file's lines all use the other (LF vs
  CRLF), the hunk is converted to the target's convention before matching, so the patched file keeps
  its own line endings (noted). A target with mixed endings gets exact matching only.
* New files take the bytes the patch gives (LF for a normalised CRLF patch).

Text is handled as bytes; patch text is ``str`` and hunk lines are encoded back with UTF-8 and
``surrogateescape``, so a patch read with ``surrogateescape`` round-trips non-UTF-8 bytes.
"""

from __future__ import annotations

import difflib
import io
import posixpath
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from unidiff import PatchSet
from unidiff.errors import UnidiffParseError

from .errors import ApplyError, PatchsetError

Reader = Callable[[str], "bytes | None"]

_ENC = ("utf-8", "surrogateescape")
_NO_NL = "\\ No newline at end of file"

__all__ = ["FileChange", "HunkReport", "ApplyResult", "apply_patch", "apply_series", "Reader"]


# ---------------------------------------------------------------------------------------------------
# results


@dataclass(frozen=True)
class FileChange:
    """One touched file after a series.

    ``path`` is site-packages-relative posix. ``old`` is the bytes ``read`` returned before the series
    (None: the file did not exist), ``new`` the bytes after it (None: the series deletes it).
    ``old_mode``/``new_mode`` are permission bits (e.g. ``0o644``) when the patch states them (git
    mode headers), else None (keep the file's mode). ``renamed_from`` names the source of a rename
    or copy (that source has its own entry, with ``new=None`` for a rename).
    """

    path: str
    old: bytes | None
    new: bytes | None
    old_mode: int | None = None
    new_mode: int | None = None
    renamed_from: str | None = None

    @property
    def changed(self) -> bool:
        """True when the bytes or the stated mode differ between before and after."""
        if self.old != self.new:
            return True
        return self.new_mode is not None and self.old_mode is not None and self.old_mode != self.new_mode

    @property
    def kind(self) -> str:
        """``added``, ``deleted``, ``modified``, ``mode`` (mode only) or ``unchanged``."""
        if self.old is None and self.new is not None:
            return "added"
        if self.old is not None and self.new is None:
            return "deleted"
        if self.old != self.new:
            return "modified"
        return "mode" if self.changed else "unchanged"


@dataclass(frozen=True)
class HunkReport:
    """How one hunk (or one hunkless file operation) went.

    ``patch`` names the patch file, ``path`` the target file, ``index`` the 1-based hunk number within
    that file's section of the patch (0 for a file-level operation without hunks: empty new file,
    pure rename, mode change, deletion), ``header`` the ``@@ ... @@`` line (or a description of the
    file operation), ``status`` one of ``applied``, ``offset``, ``already_applied``; ``offset_lines``
    is where it went minus where the header said (lines; 0 for ``applied``), ``line`` the 1-based line
    in the file (as it was when this hunk came) where the hunk's old side (or, when already applied,
    its new side) starts; None for file-level operations.
    """

    patch: str
    path: str
    index: int
    header: str
    status: str
    offset_lines: int = 0
    line: int | None = None


@dataclass
class ApplyResult:
    """What a patch series does: ``files`` by path, one report per hunk, and notes (line endings)."""

    files: dict[str, FileChange] = field(default_factory=dict)
    hunks: list[HunkReport] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def changed_files(self) -> dict[str, FileChange]:
        """The entries whose bytes or mode actually change."""
        return {p: c for p, c in self.files.items() if c.changed}

    @property
    def all_already_applied(self) -> bool:
        """True when no hunk needed applying (a re-run of something already in place)."""
        return bool(self.hunks) and all(h.status == "already_applied" for h in self.hunks)

    def diff_text(self) -> str:
        """The unified diff (git style, ``a/`` ``b/`` prefixes, 3 lines of context) of old → new.

        Renames and copies are shown as such; ``\\ No newline at end of file`` is emitted where
        needed. Bytes are decoded as UTF-8 with ``surrogateescape``. Feeding the text back to
        :func:`apply_patch` with the same ``read`` reproduces ``files``' new bytes.
        """
        out: list[str] = []
        renamed_away = {c.renamed_from for c in self.files.values()
                        if c.renamed_from and self.files.get(c.renamed_from)
                        and self.files[c.renamed_from].new is None}
        for path in sorted(self.files):
            change = self.files[path]
            if path in renamed_away or not change.changed and not change.renamed_from:
                continue
            out.append(_file_diff(change, self.files))
        return "".join(out)


# ---------------------------------------------------------------------------------------------------
# public entry points


def apply_patch(patch_text: str, read: Reader, *, source: str) -> ApplyResult:
    """Apply one unified diff strictly (see the module docstring for the rules).

    ``read(path)`` returns a file's bytes by site-packages-relative posix path, or None when absent;
    it is called at most once per path. ``source`` names the patch in messages.
    Raises :class:`ApplyError` when a hunk does not apply (no match, ambiguous, binary, unsafe path)
    and :class:`PatchsetError` when the text is not a valid unified diff. Returns :class:`ApplyResult`.
    """
    return apply_series([(source, patch_text)], read)


def apply_series(patches: Sequence[tuple[str, str]] | Iterable[tuple[str, str]], read: Reader) -> ApplyResult:
    """Apply ``patches`` — ``(source name, patch text)`` pairs — in order; each sees the ones before.

    Same rules, errors and ``read`` contract as :func:`apply_patch`; nothing is returned on failure.
    """
    work = _Work(read)
    for source, text in patches:
        files, notes = _parse(text, source)
        work.notes.extend(notes)
        for pf in files:
            _apply_file(work, pf, source)
    return work.result()


# ---------------------------------------------------------------------------------------------------
# working state


class _Work:
    def __init__(self, read: Reader):
        self._read = read
        self.pristine: dict[str, bytes | None] = {}
        self.cur: dict[str, bytes | None] = {}
        self.old_mode: dict[str, int | None] = {}
        self.new_mode: dict[str, int | None] = {}
        self.renamed_from: dict[str, str] = {}
        self.order: list[str] = []
        self.hunks: list[HunkReport] = []
        self.notes: list[str] = []

    def get(self, path: str) -> bytes | None:
        if path not in self.cur:
            data = self._read(path)
            if data is not None and not isinstance(data, (bytes, bytearray)):
                raise TypeError(f"read({path!r}) returned {type(data).__name__}, not bytes or None")
            data = bytes(data) if data is not None else None
            self.pristine[path] = data
            self.cur[path] = data
            self.order.append(path)
        return self.cur[path]

    def put(self, path: str, data: bytes | None) -> None:
        self.get(path)
        self.cur[path] = data

    def modes(self, path: str, old: int | None, new: int | None) -> None:
        if old is not None and self.old_mode.get(path) is None:
            self.old_mode[path] = old
        if new is not None:
            self.new_mode[path] = new

    def result(self) -> ApplyResult:
        files = {}
        for path in self.order:
            files[path] = FileChange(path, self.pristine[path], self.cur[path],
                                     self.old_mode.get(path), self.new_mode.get(path),
                                     self.renamed_from.get(path))
        return ApplyResult(files=files, hunks=list(self.hunks), notes=list(self.notes))


# ---------------------------------------------------------------------------------------------------
# parsing


def _parse(text: str, source: str) -> tuple[list, list[str]]:
    notes = []
    if "\r\n" in text and text.count("\n") == text.count("\r\n"):
        text = text.replace("\r\n", "\n")
        notes.append(f"{source}: every line of the patch ended in CRLF; read it as an LF patch")
    try:
        ps = PatchSet(io.StringIO(text))
    except UnidiffParseError as exc:
        raise PatchsetError(f"{source}: not a valid unified diff ({exc})",
                            hint="regenerate the patch with `git diff` (or `diff -u`); do not edit hunk lines by hand") from exc
    if not ps:
        raise PatchsetError(f"{source}: contains no file diffs",
                            hint="a patch needs '--- a/PATH' / '+++ b/PATH' headers or 'diff --git' headers")
    last = next((ln for ln in reversed(text.splitlines()) if ln.strip()), "")
    if last.startswith(("--- ", "+++ ", "diff --git ", "@@ ")):  # unidiff drops such a trailing header
        raise PatchsetError(f"{source}: ends in a header with nothing after it ({last[:100]!r}): the patch is "
                            "cut off, and its last file would be silently left out",
                            hint="regenerate the patch with `git diff` (or `diff -u`); do not edit hunk lines by hand")
    return list(ps), notes


def _info_value(pf, prefix: str) -> str | None:
    for line in pf.patch_info or ():
        if line.startswith(prefix):
            return line[len(prefix):].rstrip("\r\n")
    return None


def _clean_name(raw: str, source: str) -> str:
    name = raw.rstrip("\r\n")
    if name.startswith('"') and name.endswith('"'):
        if "\\" in name:
            raise ApplyError(f"{source}: quoted path with escapes is not supported: {name}",
                             hint="keep patched paths ASCII without spaces, or apply this change another way")
        name = name[1:-1]
    return name


def _safe_path(path: str, source: str) -> str:
    norm = posixpath.normpath(path)
    if (not path or path.startswith("/") or norm.startswith("../") or norm == ".." or norm == "."
            or "\\" in path or any(p == ".." for p in path.split("/"))):
        raise ApplyError(f"{source}: unsafe or empty path in patch: {path!r}",
                         hint="patch paths must be relative to site-packages, e.g. a/sglang/srt/...")
    return norm


def _strip_p1(raw: str | None, source: str) -> str | None:
    if raw is None:
        return None
    name = _clean_name(raw, source)
    if name == "/dev/null":
        return None
    if name.startswith("/"):
        raise ApplyError(f"{source}: unsafe absolute path in patch: {name!r}",
                         hint="patch paths must be relative to site-packages, e.g. a/sglang/srt/...")
    if "/" not in name:
        raise ApplyError(f"{source}: path {name!r} has no leading component to strip (-p1)",
                         hint="make the patch with a/ and b/ prefixes (git diff does)")
    return _safe_path(name.split("/", 1)[1], source)


def _mode(raw: str | None, source: str, path: str) -> int | None:
    if raw is None:
        return None
    value = int(raw, 8)
    kind = value & 0o170000
    if kind == 0o120000:
        raise ApplyError(f"{source}: {path}: symbolic links are not supported")
    if kind == 0o160000:
        raise ApplyError(f"{source}: {path}: submodules are not supported")
    if kind not in (0, 0o100000):
        raise ApplyError(f"{source}: {path}: unsupported file mode {raw}")
    return value & 0o7777


@dataclass
class _Hunk:
    index: int
    header: str
    old: list[bytes]
    new: list[bytes]
    lead: int
    trail: int
    source_start: int
    source_length: int
    target_start: int
    target_length: int
    diff_line: int | None
    anchor: str | None        # "start", "end", "both" (the whole file) or None: see _anchor()


def _hunks(pf, source: str, path: str) -> list[_Hunk]:
    out = []
    for i, hunk in enumerate(pf, 1):
        old: list[bytes] = []
        new: list[bytes] = []
        kinds: list[str] = []
        last = None
        for line in hunk:
            t = line.line_type
            if t == "\\":
                if last is None:
                    raise PatchsetError(f"{source}: {path}: hunk #{i}: '{_NO_NL}' before any line")
                if last in " -" and old and old[-1].endswith(b"\n"):
                    old[-1] = old[-1][:-1]
                if last in " +" and new and new[-1].endswith(b"\n"):
                    new[-1] = new[-1][:-1]
                continue
            if t not in (" ", "-", "+"):
                continue
            value = line.value
            if not value.endswith("\n"):   # the patch file itself lacked its final newline
                value += "\n"
            data = value.encode(*_ENC)
            if t in " -":
                old.append(data)
            if t in " +":
                new.append(data)
            kinds.append(t)
            last = t
        changes = [k for k, t in enumerate(kinds) if t != " "]
        if changes:
            lead, trail = changes[0], len(kinds) - 1 - changes[-1]
        else:
            lead = trail = len(kinds)
        header = "@@ -%d,%d +%d,%d @@" % (hunk.source_start, hunk.source_length,
                                         hunk.target_start, hunk.target_length)
        first = hunk[0].diff_line_no if len(hunk) and hunk[0].diff_line_no else None
        out.append(_Hunk(i, header, old, new, lead, trail, hunk.source_start, hunk.source_length,
                         hunk.target_start, hunk.target_length, first - 1 if first else None,
                         _anchor(lead, trail, kinds.count(" "))))
    return out


def _anchor(lead: int, trail: int, context: int) -> str | None:
    """Where a hunk must sit, from its leading / trailing context line counts (GNU ``patch``, fuzz 0).

    Fewer leading than trailing lines: at the start of the file; fewer trailing: at its end. A hunk
    with context lines but none at either end (changes on its first and its last line) came from a
    diff with context ≥ 1 whose hunk touched both ends of the file, so its old side is the whole
    file. Without this, re-applying "insert a line before the first and after the last" found the
    old side again inside the patched file and inserted the lines twice. A hunk without any context
    (``diff -U0``) is not anchored.
    """
    if lead < trail:
        return "start"
    if trail < lead:
        return "end"
    if lead == 0 and context:
        return "both"
    return None


# ---------------------------------------------------------------------------------------------------
# applying one file section


def _split(data: bytes) -> list[bytes]:
    if not data:
        return []
    parts = data.split(b"\n")
    lines = [p + b"\n" for p in parts[:-1]]
    if parts[-1]:
        lines.append(parts[-1])
    return lines


def _eol(lines: Iterable[bytes]) -> str | None:
    ended = crlf = 0
    for line in lines:
        if line.endswith(b"\n"):
            ended += 1
            crlf += line.endswith(b"\r\n")
    if not ended:
        return None
    if crlf == ended:
        return "crlf"
    if crlf == 0:
        return "lf"
    return None


def _convert(lines: list[bytes], to: str) -> list[bytes]:
    if to == "crlf":
        return [l[:-1] + b"\r\n" if l.endswith(b"\n") and not l.endswith(b"\r\n") else l for l in lines]
    return [l[:-2] + b"\n" if l.endswith(b"\r\n") else l for l in lines]


def _apply_file(work: _Work, pf, source: str) -> None:
    if pf.is_binary_file:
        raise ApplyError(f"{source}: {pf.path}: binary diffs are not supported",
                         hint="ship the file whole as one of the patchset's new_files instead")
    rename_from = _info_value(pf, "rename from ")
    rename_to = _info_value(pf, "rename to ")
    copy_from = _info_value(pf, "copy from ")
    copy_to = _info_value(pf, "copy to ")
    src = _strip_p1(pf.source_file, source)
    dst = _strip_p1(pf.target_file, source)
    if rename_from is not None and rename_to is not None:
        src = _safe_path(_clean_name(rename_from, source), source)
        dst = _safe_path(_clean_name(rename_to, source), source)
    if copy_from is not None and copy_to is not None:
        src = _safe_path(_clean_name(copy_from, source), source)
        dst = _safe_path(_clean_name(copy_to, source), source)
    shown = dst or src or "?"
    old_mode = _mode(pf.source_mode, source, shown)
    new_mode = _mode(pf.target_mode, source, shown)
    hunks = _hunks(pf, source, shown)

    if src is None and dst is None:
        raise PatchsetError(f"{source}: a file diff names /dev/null on both sides")
    creates = bool(hunks) and all(h.source_start == 0 and h.source_length == 0 for h in hunks)
    if src is None or (src == dst and creates and work.get(src) is None):   # `diff -N` style creation
        _add(work, source, dst, hunks, new_mode)
    elif dst is None:
        _delete(work, source, src, hunks, old_mode)
    elif copy_from is not None or src != dst:
        _move(work, source, src, dst, hunks, old_mode, new_mode, copy=copy_from is not None)
    else:
        cur = work.get(src)
        if cur is None:
            raise ApplyError(f"{source}: {src}: the patch modifies this file but it does not exist",
                             hint="is this the right SGLang version for the patch?")
        new_bytes, reports = _apply_hunks(cur, hunks, source, src, work)
        work.hunks.extend(reports)
        work.put(src, new_bytes)
        work.modes(src, old_mode, new_mode)
        if not hunks:
            status = "applied" if old_mode != new_mode else "already_applied"
            work.hunks.append(HunkReport(source, src, 0, f"mode {_oct(old_mode)} -> {_oct(new_mode)}", status))


def _oct(mode: int | None) -> str:
    return "?" if mode is None else format(mode, "o")


def _whole(hunks: list[_Hunk], side: str) -> list[bytes]:
    lines: list[bytes] = []
    for h in hunks:
        lines.extend(getattr(h, side))
    return lines


def _add(work: _Work, source: str, dst: str, hunks: list[_Hunk], mode: int | None) -> None:
    for h in hunks:
        if h.old:
            raise ApplyError(f"{source}: {dst}: hunk #{h.index} {h.header} of a new file has old lines")
    content = b"".join(_whole(hunks, "new"))
    cur = work.get(dst)
    header = "new file" + (" (empty)" if not content else "")
    if cur is not None:
        if cur == content:
            work.hunks.append(HunkReport(source, dst, 0, header, "already_applied"))
            work.modes(dst, None, mode)
            return
        raise ApplyError(f"{source}: {dst}: the patch creates this file but it already exists with other content",
                         hint="the target already has its own version of the file; update the patch for this release")
    work.put(dst, content)
    work.modes(dst, None, mode)
    if hunks:
        for h in hunks:
            work.hunks.append(HunkReport(source, dst, h.index, h.header, "applied", 0, 1))
    else:
        work.hunks.append(HunkReport(source, dst, 0, header, "applied"))


def _delete(work: _Work, source: str, src: str, hunks: list[_Hunk], mode: int | None) -> None:
    for h in hunks:
        if h.new:
            raise ApplyError(f"{source}: {src}: hunk #{h.index} {h.header} of a deleted file has new lines")
    cur = work.get(src)
    if cur is None:
        work.hunks.append(HunkReport(source, src, 0, "deleted file", "already_applied"))
        return
    expect = _whole(hunks, "old")
    have = _split(cur)
    style, hstyle = _eol(have), _eol(expect)
    if style and hstyle and style != hstyle:
        expect = _convert(expect, style)
    if have != expect:
        i = next((k for k in range(max(len(have), len(expect)))
                  if k >= len(have) or k >= len(expect) or have[k] != expect[k]), 0)
        raise ApplyError(
            f"{source}: {src}: the patch deletes this file, but its content differs from the patch's "
            f"at line {i + 1}: patch has {_show(expect, i)}, file has {_show(have, i)}",
            hint="the file changed since the patch was made; regenerate the patch")
    work.put(src, None)
    work.modes(src, mode, None)
    work.hunks.append(HunkReport(source, src, 0, "deleted file", "applied"))


def _move(work: _Work, source: str, src: str, dst: str, hunks: list[_Hunk], old_mode, new_mode,
          *, copy: bool) -> None:
    what = "copy" if copy else "rename"
    cur_src = work.get(src)
    cur_dst = work.get(dst)
    header = f"{what} from {src}"
    if cur_src is None or (copy and cur_dst is not None):
        if cur_dst is None:
            raise ApplyError(f"{source}: {what} {src} -> {dst}: {src} does not exist")
        # maybe done already: the destination carries every hunk's new side
        _, reports = _apply_hunks(cur_dst, hunks, source, dst, work, only_check_applied=True)
        work.hunks.extend(reports)
        work.hunks.append(HunkReport(source, dst, 0, header, "already_applied"))
        return
    if cur_dst is not None:
        raise ApplyError(f"{source}: {what} {src} -> {dst}: {dst} already exists",
                         hint="the target release already has that file; update the patch")
    new_bytes, reports = _apply_hunks(cur_src, hunks, source, src, work, report_path=dst)
    work.hunks.extend(reports)
    work.put(dst, new_bytes)
    work.renamed_from[dst] = src
    work.modes(dst, old_mode, new_mode if new_mode is not None else old_mode)
    if not copy:
        work.put(src, None)
        work.modes(src, old_mode, None)
    work.hunks.append(HunkReport(source, dst, 0, header, "applied"))


def _find(lines: list[bytes], needle: list[bytes], anchor: str | None) -> list[int]:
    n, total = len(needle), len(lines)
    if n > total or (anchor == "both" and n != total):
        return []
    if anchor in ("start", "both"):
        candidates: Iterable[int] = (0,)
    elif anchor == "end":
        candidates = (total - n,)
    else:
        first = needle[0]
        candidates = (i for i in range(total - n + 1) if lines[i] == first)
    return [i for i in candidates if lines[i:i + n] == needle]


def _show(lines: list[bytes], i: int) -> str:
    if i >= len(lines):
        return "(end of file)"
    return repr(lines[i].decode(*_ENC))


def _anchor_note(h: _Hunk) -> str:
    where = {"start": "at the start of the file", "end": "at the end of the file",
             "both": "to the whole file"}.get(h.anchor or "")
    if not where:
        return ""
    return f" (it has {h.lead} leading and {h.trail} trailing context lines, so it must apply {where})"


def _no_match(h: _Hunk, old: list[bytes], lines: list[bytes], expected: int, source: str, path: str) -> ApplyError:
    where = f"patch line {h.diff_line}" if h.diff_line else "patch"
    base = max(0, min(expected, len(lines)))
    i = 0
    while i < len(old) and base + i < len(lines) and lines[base + i] == old[i]:
        i += 1
    msg = (f"{source}: {path}: hunk #{h.index} {h.header} ({where}) does not apply (fuzz 0){_anchor_note(h)}: "
           f"at line {base + i + 1} the hunk expects {_show(old, i)} but the file has {_show(lines, base + i)}")
    best, best_score = None, 0
    for pos in range(0, max(0, len(lines) - len(old)) + 1):
        score = sum(1 for k, ln in enumerate(old) if pos + k < len(lines) and lines[pos + k] == ln)
        if score > best_score:
            best, best_score = pos, score
    if best is not None and best != base and best_score > i:
        msg += f"; closest partial match at line {best + 1} ({best_score} of {len(old)} lines equal)"
    return ApplyError(msg, hint="the file is not what the patch was made against; regenerate the patch "
                                "for this SGLang version (no fuzz is applied)")


def _apply_hunks(cur: bytes, hunks: list[_Hunk], source: str, path: str, work: _Work, *,
                 report_path: str | None = None, only_check_applied: bool = False
                 ) -> tuple[bytes, list[HunkReport]]:
    lines = _split(cur)
    reports: list[HunkReport] = []
    delta = 0          # lines added minus removed by the earlier hunks of this section
    floor = 0          # a hunk may not start before the end of the previous one
    style = _eol(lines)
    noted = False
    for h in hunks:
        old, new = h.old, h.new
        hstyle = _eol(old + new)
        if style and hstyle and style != hstyle:
            old, new = _convert(old, style), _convert(new, style)
            if not noted:
                work.notes.append(f"{source}: {path}: hunk lines converted to the file's "
                                  f"{style.upper()} line endings")
                noted = True
        expected = (h.source_start - 1 if h.source_length else h.source_start) + delta
        name = report_path or path
        if not old:
            if not lines and not only_check_applied:
                pos = 0
            elif lines == new:
                reports.append(HunkReport(source, name, h.index, h.header, "already_applied", 0, 1))
                delta += len(new) - len(old)
                continue
            else:
                raise ApplyError(f"{source}: {path}: hunk #{h.index} {h.header} has no context lines, so it "
                                 f"cannot be placed strictly in a non-empty file",
                                 hint="regenerate the patch with context (git diff -U3)")
        else:
            places = [] if only_check_applied else _find(lines, old, h.anchor)
            if len(places) > 1:
                shown = ", ".join(str(p + 1) for p in places)
                raise ApplyError(
                    f"{source}: {path}: hunk #{h.index} {h.header} is ambiguous: its old lines match at "
                    f"lines {shown} of the file; fuzz-0 application needs exactly one place",
                    hint="regenerate the patch with more context (e.g. git diff -U6) so the hunk is unique")
            if not places:
                applied_at = _find(lines, new, h.anchor) if new else ([0] if not lines else [])
                if applied_at:
                    pos = applied_at[0]
                    reports.append(HunkReport(source, name, h.index, h.header, "already_applied",
                                              pos - (h.target_start - 1 if h.target_length else h.target_start),
                                              pos + 1))
                    delta += len(new) - len(old)
                    floor = pos + len(new)
                    continue
                raise _no_match(h, old, lines, expected, source, path)
            pos = places[0]
        if pos < floor:
            raise ApplyError(f"{source}: {path}: hunk #{h.index} {h.header} matches at line {pos + 1}, inside or "
                             f"before the previous hunk (which ends at line {floor}): hunks out of order or overlapping",
                             hint="regenerate the patch; hunks of one file must be in file order")
        lines[pos:pos + len(old)] = new
        offset = pos - expected
        reports.append(HunkReport(source, name, h.index, h.header, "offset" if offset else "applied",
                                  offset, pos + 1))
        delta += len(new) - len(old)
        floor = pos + len(new)
    if only_check_applied:
        bad = [r for r in reports if r.status != "already_applied"]
        if bad:
            raise ApplyError(f"{source}: {path}: the rename/copy looks done but hunk #{bad[0].index} is not in place")
    return b"".join(lines), reports


# ---------------------------------------------------------------------------------------------------
# display diff


def _lines_str(data: bytes | None) -> list[str]:
    return [line.decode(*_ENC) for line in _split(data or b"")]


def _file_diff(change: FileChange, files: dict[str, FileChange]) -> str:
    path = change.path
    src = change.renamed_from or path
    old = change.old if not change.renamed_from else files[src].old
    new = change.new
    head = [f"diff --git a/{src if change.new is not None else path} b/{path}\n"]
    if change.renamed_from:
        copy = files[src].new is not None
        old_mode = change.old_mode or 0o644
        new_mode = change.new_mode or old_mode
        if old_mode != new_mode:
            head += [f"old mode 100{old_mode:o}\n", f"new mode 100{new_mode:o}\n"]
        word = "copy" if copy else "rename"
        head += [f"{word} from {src}\n", f"{word} to {path}\n"]
    elif change.old is None:
        head.append(f"new file mode 100{(change.new_mode or 0o644):o}\n")
    elif change.new is None:
        head.append(f"deleted file mode 100{(change.old_mode or 0o644):o}\n")
    elif change.old_mode is not None and change.new_mode is not None and change.old_mode != change.new_mode:
        head += [f"old mode 100{change.old_mode:o}\n", f"new mode 100{change.new_mode:o}\n"]
    a, b = _lines_str(old), _lines_str(new)
    if a == b:
        return "".join(head)
    body = list(difflib.unified_diff(a, b, n=3))[2:]
    text = []
    for line in body:
        text.append(line)
        if not line.endswith("\n"):
            text.append("\n" + _NO_NL + "\n")
    from_name = "/dev/null" if old is None else f"a/{src}"
    to_name = "/dev/null" if new is None else f"b/{path}"
    return "".join(head) + f"--- {from_name}\n+++ {to_name}\n" + "".join(text)
