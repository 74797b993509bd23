"""The strict applier on crafted patches: one test per rule (see sglang_patcher/applier.py)."""

from __future__ import annotations

import difflib
import shutil
import subprocess
from pathlib import Path

import pytest

from sglang_patcher.applier import ApplyResult, apply_patch, apply_series
from sglang_patcher.errors import ApplyError, PatchsetError

from tests.support.difftext import NO_NL, lines_of  # noqa: E402


# --------------------------------------------------------------------------------------- helpers

def udiff(path: str, old: bytes | None, new: bytes | None, n: int = 3) -> str:
    """difflib's unified diff of one file, a/ b/ prefixes, no-newline markers (independent of ours)."""
    body = list(difflib.unified_diff(lines_of(old or b""), lines_of(new or b""), n=n))[2:]
    out = [f"--- {'/dev/null' if old is None else 'a/' + path}\n",
           f"+++ {'/dev/null' if new is None else 'b/' + path}\n"]
    for line in body:
        out.append(line)
        if not line.endswith("\n"):
            out.append("\n" + NO_NL)
    return "".join(out)


def reader(files: dict[str, bytes]):
    calls: dict[str, int] = {}

    def read(path: str) -> bytes | None:
        calls[path] = calls.get(path, 0) + 1
        return files.get(path)

    read.calls = calls  # type: ignore[attr-defined]
    return read


def numbered(n: int, prefix: str = "line") -> bytes:
    return "".join(f"{prefix} {i}\n" for i in range(1, n + 1)).encode()


def edit(data: bytes, lineno: int, new_line: str) -> bytes:
    lines = data.decode().splitlines(keepends=True)
    lines[lineno - 1] = new_line
    return "".join(lines).encode()


P = "sglang/srt/x.py"


# --------------------------------------------------------------------------------------- basics

def test_clean_apply_reports_each_hunk_and_keeps_pristine_old():
    old = numbered(40)
    new = edit(edit(old, 5, "FIVE\n"), 30, "THIRTY\n")
    r = apply_patch(udiff(P, old, new), reader({P: old}), source="0001.patch")
    assert r.files[P].old == old and r.files[P].new == new
    assert [(h.index, h.status, h.offset_lines, h.line) for h in r.hunks] == [(1, "applied", 0, 2), (2, "applied", 0, 27)]
    assert r.hunks[0].patch == "0001.patch" and r.hunks[0].header == "@@ -2,7 +2,7 @@"
    assert r.files[P].kind == "modified" and r.changed_files().keys() == {P}


def test_read_is_called_once_per_path():
    old = numbered(10)
    read = reader({P: old})
    p1 = udiff(P, old, edit(old, 2, "a\n"))
    p2 = udiff(P, edit(old, 2, "a\n"), edit(edit(old, 2, "a\n"), 8, "b\n"))
    apply_series([("1", p1), ("2", p2)], read)
    assert read.calls == {P: 1}


def test_offset_is_allowed_and_reported():
    old = numbered(40)
    new = edit(old, 20, "TWENTY\n")
    patch = udiff(P, old, new)
    shifted = b"extra 1\nextra 2\nextra 3\nextra 4\n" + old
    r = apply_patch(patch, reader({P: shifted}), source="p")
    (h,) = r.hunks
    assert (h.status, h.offset_lines, h.line) == ("offset", 4, 21)
    assert r.files[P].new == b"extra 1\nextra 2\nextra 3\nextra 4\n" + new


def test_negative_offset():
    old = numbered(40)
    new = edit(old, 20, "TWENTY\n")
    r = apply_patch(udiff(P, old, new), reader({P: b"".join(old.splitlines(True)[3:])}), source="p")
    assert r.hunks[0].status == "offset" and r.hunks[0].offset_lines == -3


def test_ambiguous_context_is_refused_naming_both_places():
    block = b"def f():\n    x = 1\n    y = 2\n    return x\n\n"
    old = b"# head\n" + block + b"# middle\n" * 3 + block + b"# tail\n"
    hunk = ("--- a/{p}\n+++ b/{p}\n@@ -2,5 +2,5 @@\n def f():\n     x = 1\n-    y = 2\n+    y = 3\n     return x\n \n"
            .format(p=P))
    with pytest.raises(ApplyError) as exc:
        apply_patch(hunk, reader({P: old}), source="0002-look-alike.patch")
    msg = str(exc.value)
    assert "0002-look-alike.patch" in msg and P in msg and "@@ -2,5 +2,5 @@" in msg
    assert "ambiguous" in msg and "lines 2, 10" in msg


def test_fuzz_is_refused_and_first_mismatch_is_named():
    old = numbered(20)
    patch = udiff(P, old, edit(old, 10, "TEN\n"))
    drifted = edit(old, 8, "line  8\n")   # one context line differs by a space
    with pytest.raises(ApplyError) as exc:
        apply_patch(patch, reader({P: drifted}), source="p.patch")
    msg = str(exc.value)
    assert "p.patch" in msg and P in msg and "@@ -7,7 +7,7 @@" in msg and "fuzz 0" in msg
    assert "at line 8" in msg and "'line 8\\n'" in msg and "'line  8\\n'" in msg


def test_no_match_anywhere():
    old = numbered(20)
    patch = udiff(P, old, edit(old, 10, "TEN\n"))
    with pytest.raises(ApplyError, match="does not apply"):
        apply_patch(patch, reader({P: numbered(20, "other")}), source="p")


def test_modifying_a_missing_file_fails():
    old = numbered(5)
    with pytest.raises(ApplyError, match="does not exist"):
        apply_patch(udiff(P, old, edit(old, 1, "x\n")), reader({}), source="p")


# --------------------------------------------------------------------------------------- already applied

def test_second_apply_is_a_clean_no_op_never_a_toggle():
    old = numbered(40)
    new = edit(edit(old, 5, "FIVE\n"), 30, "THIRTY\n")
    patch = udiff(P, old, new)
    first = apply_patch(patch, reader({P: old}), source="p")
    second = apply_patch(patch, reader({P: first.files[P].new}), source="p")
    assert second.files[P].new == new and not second.files[P].changed
    assert [h.status for h in second.hunks] == ["already_applied", "already_applied"]
    assert second.all_already_applied and second.changed_files() == {}


def test_upstream_merged_one_hunk_is_reported_not_reversed():
    old = numbered(40)
    new = edit(edit(old, 5, "FIVE\n"), 30, "THIRTY\n")
    upstream = edit(old, 5, "FIVE\n")   # release already carries the first change
    r = apply_patch(udiff(P, old, new), reader({P: upstream}), source="p")
    assert [h.status for h in r.hunks] == ["already_applied", "applied"]
    assert r.files[P].new == new


def test_append_at_end_rerun_is_already_applied_not_appended_twice():
    old = numbered(10)
    new = old + b"appended\n"
    patch = udiff(P, old, new)
    once = apply_patch(patch, reader({P: old}), source="p").files[P].new
    twice = apply_patch(patch, reader({P: once}), source="p")
    assert twice.files[P].new == new and twice.hunks[0].status == "already_applied"


def test_insert_at_start_must_anchor_at_start():
    old = numbered(10)
    new = b"header\n" + old
    patch = udiff(P, old, new)          # 0 leading, 3 trailing context lines
    assert apply_patch(patch, reader({P: old}), source="p").files[P].new == new
    # the same three lines elsewhere in the file are not the start of the file
    moved = b"other\n" + old
    with pytest.raises(ApplyError, match="start of the file"):
        apply_patch(patch, reader({P: moved}), source="p")


def test_insert_at_both_ends_covers_the_whole_file_and_reruns_as_already_applied():
    old = b"a\nb\n"
    new = b"top\na\nb\nbottom\n"
    patch = udiff(P, old, new)          # context in the middle, none at either end
    once = apply_patch(patch, reader({P: old}), source="p").files[P].new
    assert once == new
    twice = apply_patch(patch, reader({P: once}), source="p")
    assert twice.files[P].new == new and twice.hunks[0].status == "already_applied"
    # the old side inside a longer file is not the whole file: refused, never inserted twice
    with pytest.raises(ApplyError, match="whole file"):
        apply_patch(patch, reader({P: b"x\n" + old + b"y\n"}), source="p")


def test_zero_context_replacement_is_not_anchored():
    old = numbered(10)
    new = edit(old, 5, "five\n")
    patch = udiff(P, old, new, n=0)     # -U0: no context at all, placed by its removed line
    r = apply_patch(patch, reader({P: b"extra\n" + old}), source="p")
    assert r.files[P].new == b"extra\n" + new and r.hunks[0].status == "offset"


# --------------------------------------------------------------------------------------- series / all-or-nothing

def test_series_each_patch_sees_the_previous_output():
    v0 = numbered(30)
    v1 = edit(v0, 10, "TEN\n")
    v2 = edit(v1, 10, "TEN again\n")   # only applies on top of v1
    s1, s2 = ("0001.patch", udiff(P, v0, v1)), ("0002.patch", udiff(P, v1, v2))
    r = apply_series([s1, s2], reader({P: v0}))
    assert r.files[P].old == v0 and r.files[P].new == v2
    assert [h.patch for h in r.hunks] == ["0001.patch", "0002.patch"]
    with pytest.raises(ApplyError, match="0002.patch"):
        apply_series([s2, s1], reader({P: v0}))


def test_all_or_nothing_when_a_later_file_fails():
    a, b = numbered(10), numbered(10, "b")
    patch = udiff("sglang/a.py", a, edit(a, 3, "A\n")) + udiff("sglang/b.py", b, edit(b, 3, "B\n"))
    with pytest.raises(ApplyError, match="sglang/b.py"):
        apply_patch(patch, reader({"sglang/a.py": a, "sglang/b.py": numbered(10, "x")}), source="p")


def test_hunks_out_of_order_are_refused():
    old = numbered(40)
    new = edit(edit(old, 5, "FIVE\n"), 30, "THIRTY\n")
    text = udiff(P, old, new)
    head, h1, h2 = text.split("@@ -")
    swapped = head + "@@ -" + h2 + "@@ -" + h1
    with pytest.raises(ApplyError, match="out of order"):
        apply_patch(swapped, reader({P: old}), source="p")


def test_context_free_hunk_on_non_empty_file_is_refused():
    old = numbered(10)
    patch = udiff(P, old, edit(old, 5, "FIVE\n"), n=0).replace("-line 5\n", "")
    patch = patch.replace("@@ -5 +5 @@", "@@ -5,0 +6 @@")
    with pytest.raises(ApplyError, match="no context"):
        apply_patch(patch, reader({P: old}), source="p")


def test_zero_context_hunk_with_removed_lines_places_by_removed_lines():
    old = numbered(10)
    new = edit(old, 5, "FIVE\n")
    r = apply_patch(udiff(P, old, new, n=0), reader({P: old}), source="p")
    assert r.files[P].new == new


# --------------------------------------------------------------------------------------- files

def test_new_file_from_dev_null_and_rerun():
    body = b"print('hi')\n"
    patch = udiff("sglang/new.py", None, body)
    r = apply_patch(patch, reader({}), source="p")
    c = r.files["sglang/new.py"]
    assert (c.old, c.new, c.kind) == (None, body, "added")
    again = apply_patch(patch, reader({"sglang/new.py": body}), source="p")
    assert again.hunks[0].status == "already_applied"
    with pytest.raises(ApplyError, match="already exists"):
        apply_patch(patch, reader({"sglang/new.py": b"other\n"}), source="p")


def test_empty_new_file_git_header_only():
    patch = "diff --git a/sglang/e.py b/sglang/e.py\nnew file mode 100644\nindex 0000000..e69de29\n"
    r = apply_patch(patch, reader({}), source="p")
    c = r.files["sglang/e.py"]
    assert (c.old, c.new, c.new_mode) == (None, b"", 0o644)
    assert r.hunks[0].header == "new file (empty)"


def test_deleted_file_must_match_whole_content():
    old = numbered(5)
    patch = udiff(P, old, None)
    r = apply_patch(patch, reader({P: old}), source="p")
    assert r.files[P].new is None and r.files[P].kind == "deleted"
    assert apply_patch(patch, reader({}), source="p").hunks[0].status == "already_applied"
    with pytest.raises(ApplyError, match="deletes this file"):
        apply_patch(patch, reader({P: old + b"more\n"}), source="p")


def test_mode_change_from_git_headers():
    patch = f"diff --git a/{P} b/{P}\nold mode 100644\nnew mode 100755\n"
    r = apply_patch(patch, reader({P: b"x\n"}), source="p")
    c = r.files[P]
    assert (c.old_mode, c.new_mode, c.kind, c.new) == (0o644, 0o755, "mode", b"x\n")


def test_rename_with_change_and_rerun():
    old = numbered(8)
    patch = (f"diff --git a/sglang/old.py b/sglang/new.py\nsimilarity index 90%\nrename from sglang/old.py\n"
             f"rename to sglang/new.py\n" + udiff("x", old, edit(old, 4, "FOUR\n"))
             .replace("a/x", "a/sglang/old.py").replace("b/x", "b/sglang/new.py"))
    r = apply_patch(patch, reader({"sglang/old.py": old}), source="p")
    assert r.files["sglang/old.py"].new is None
    assert r.files["sglang/new.py"].new == edit(old, 4, "FOUR\n")
    assert r.files["sglang/new.py"].renamed_from == "sglang/old.py"
    again = apply_patch(patch, reader({"sglang/new.py": edit(old, 4, "FOUR\n")}), source="p")
    assert {h.status for h in again.hunks} == {"already_applied"}
    with pytest.raises(ApplyError, match="already exists"):
        apply_patch(patch, reader({"sglang/old.py": old, "sglang/new.py": b"x\n"}), source="p")


def test_binary_diffs_are_refused():
    text = "diff --git a/sglang/a.bin b/sglang/a.bin\nindex 1..2 100644\nBinary files a/sglang/a.bin and b/sglang/a.bin differ\n"
    with pytest.raises(ApplyError, match="binary"):
        apply_patch(text, reader({}), source="p")
    git_bin = ("diff --git a/sglang/a.bin b/sglang/a.bin\nnew file mode 100644\nindex 0000000..5b2b4e1\n"
               "GIT binary patch\nliteral 3\nKcmZ?wWB>pF01f~E\n\nliteral 0\nHcmV?d00001\n\n")
    with pytest.raises(ApplyError, match="binary"):
        apply_patch(git_bin, reader({}), source="p")


def test_symlink_is_refused():
    text = "diff --git a/sglang/l b/sglang/l\nnew file mode 120000\n--- /dev/null\n+++ b/sglang/l\n@@ -0,0 +1 @@\n+target\n\\ No newline at end of file\n"
    with pytest.raises(ApplyError, match="symbolic link"):
        apply_patch(text, reader({}), source="p")


@pytest.mark.parametrize("bad", ["../etc/passwd", "/etc/passwd", "sglang/../../x"])
def test_unsafe_paths_are_refused(bad):
    text = f"--- a/{bad}\n+++ b/{bad}\n@@ -1 +1 @@\n-a\n+b\n"
    if bad.startswith("/"):
        text = f"--- {bad}\n+++ {bad}\n@@ -1 +1 @@\n-a\n+b\n"
    with pytest.raises(ApplyError, match="unsafe|leading component"):
        apply_patch(text, reader({}), source="p")


@pytest.mark.parametrize("text", ["", "just some words\n", "--- a/x\n+++ b/x\n@@ -1,3 +1,3 @@\n a\n-b\n"])
def test_malformed_or_empty_patch_is_a_patchset_error(text):
    with pytest.raises(PatchsetError, match="bad.patch"):
        apply_patch(text, reader({}), source="bad.patch")


@pytest.mark.parametrize("tail", ["--- a/sglang/y.py\n", "--- a/sglang/y.py\n+++ b/sglang/y.py\n",
                                  "diff --git a/sglang/y.py b/sglang/y.py\n"])
def test_a_patch_cut_off_after_a_file_header_is_refused(tail):
    """unidiff parses the files before a trailing header and drops the header: a patch cut off
    there would apply with its last file silently missing (and `patchset refresh` would pin that)."""
    whole = udiff(P, b"a\nb\nc\n", b"a\nB\nc\n")
    with pytest.raises(PatchsetError, match="cut.patch: ends in a header with nothing after it"):
        apply_patch(whole + tail, reader({P: b"a\nb\nc\n"}), source="cut.patch")
    assert apply_patch(whole, reader({P: b"a\nb\nc\n"}), source="whole.patch").files[P].new == b"a\nB\nc\n"


# --------------------------------------------------------------------------------------- no newline at EOF

def test_no_newline_on_old_side():
    old, new = b"a\nb\nc", b"a\nb\nc\n"
    patch = udiff(P, old, new)
    assert NO_NL in patch
    assert apply_patch(patch, reader({P: old}), source="p").files[P].new == new
    # the old side says 'c' without newline: a file with 'c\n' is not what the patch was made for
    assert apply_patch(patch, reader({P: new}), source="p").hunks[0].status == "already_applied"


def test_no_newline_on_new_side():
    old, new = b"a\nb\nc\n", b"a\nb\nc"
    r = apply_patch(udiff(P, old, new), reader({P: old}), source="p")
    assert r.files[P].new == new


def test_no_newline_on_both_sides():
    old, new = b"a\nb\nc\nd", b"a\nB\nc\nd"
    patch = udiff(P, old, new)
    assert patch.count(NO_NL) == 1        # after a context line: both sides
    assert apply_patch(patch, reader({P: old}), source="p").files[P].new == new
    with pytest.raises(ApplyError):
        apply_patch(patch, reader({P: old + b"\n"}), source="p")


def test_patch_file_without_final_newline():
    text = f"--- a/{P}\n+++ b/{P}\n@@ -1,2 +1,2 @@\n a\n-b\n+c"
    assert apply_patch(text, reader({P: b"a\nb\n"}), source="p").files[P].new == b"a\nc\n"


# --------------------------------------------------------------------------------------- line endings

def crlf(data: bytes) -> bytes:
    return data.replace(b"\n", b"\r\n")


def test_crlf_transported_patch_on_lf_target_is_normalised():
    old = numbered(12)
    new = edit(old, 6, "SIX\n")
    patch = udiff(P, old, new).replace("\n", "\r\n")
    r = apply_patch(patch, reader({P: old}), source="p")
    assert r.files[P].new == new
    assert any("CRLF" in n for n in r.notes)


def test_lf_patch_on_crlf_target_keeps_crlf():
    old = numbered(12)
    new = edit(old, 6, "SIX\n")
    r = apply_patch(udiff(P, old, new), reader({P: crlf(old)}), source="p")
    assert r.files[P].new == crlf(new)
    assert any("CRLF line endings" in n for n in r.notes)


def test_git_style_patch_of_a_crlf_file_applies_to_crlf_target_exactly():
    old, new = crlf(numbered(12)), crlf(edit(numbered(12), 6, "SIX\n"))
    patch = udiff(P, old, new)          # LF headers, CRLF content lines: taken literally
    r = apply_patch(patch, reader({P: old}), source="p")
    assert r.files[P].new == new and not r.notes


def test_crlf_transported_patch_on_crlf_target():
    old = numbered(12)
    new = edit(old, 6, "SIX\n")
    patch = udiff(P, old, new).replace("\n", "\r\n")
    assert apply_patch(patch, reader({P: crlf(old)}), source="p").files[P].new == crlf(new)


def test_crlf_content_patch_on_lf_target_is_normalised():
    old, new = numbered(12), edit(numbered(12), 6, "SIX\n")
    patch = udiff(P, crlf(old), crlf(new))
    assert apply_patch(patch, reader({P: old}), source="p").files[P].new == new


def test_mixed_ending_target_needs_exact_match():
    old = numbered(12)
    mixed = b"".join(l.replace(b"\n", b"\r\n") if i % 2 else l for i, l in enumerate(old.splitlines(True)))
    with pytest.raises(ApplyError):
        apply_patch(udiff(P, old, edit(old, 6, "SIX\n")), reader({P: mixed}), source="p")
    exact = udiff(P, mixed, mixed.replace(b"line 6", b"SIX"))
    assert b"SIX" in apply_patch(exact, reader({P: mixed}), source="p").files[P].new


# --------------------------------------------------------------------------------------- diff_text

def test_diff_text_round_trips():
    files = {"sglang/a.py": numbered(20), "sglang/gone.py": b"bye\n", "sglang/nonl.py": b"x"}
    patch = (udiff("sglang/a.py", files["sglang/a.py"], edit(files["sglang/a.py"], 9, "NINE\n"))
             + udiff("sglang/gone.py", b"bye\n", None) + udiff("sglang/nonl.py", b"x", b"y")
             + udiff("sglang/new.py", None, b"new\n"))
    r = apply_patch(patch, reader(files), source="p")
    text = r.diff_text()
    assert "+NINE" in text and "/dev/null" in text and NO_NL in text
    again = apply_patch(text, reader(files), source="display")
    assert {p: c.new for p, c in again.files.items()} == {p: c.new for p, c in r.files.items()}


def test_empty_result_diff_text():
    assert ApplyResult().diff_text() == ""


# --------------------------------------------------------------------------------------- real git output

@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_git_diff_output_round_trip(tmp_path: Path):
    """A real `git diff -M` with a new empty file, a deletion, a rename+edit, a mode change, no-newline,
    a CRLF file and a plain edit applies to the old tree and yields the new tree byte for byte."""
    repo = tmp_path / "r"
    git = ["git", "-C", str(repo), "-c", "user.email=t@t", "-c", "user.name=t", "-c", "core.autocrlf=false"]
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    old = {"sglang/x.py": numbered(30), "sglang/gone.py": b"keep\n", "sglang/mv.py": numbered(6, "mv"),
           "sglang/nonl.py": b"no nl", "sglang/m.sh": b"#!/bin/sh\n", "sglang/dos.py": crlf(numbered(9))}
    for p, data in old.items():
        (repo / p).parent.mkdir(parents=True, exist_ok=True)
        (repo / p).write_bytes(data)
    subprocess.run(git + ["add", "."], check=True)
    subprocess.run(git + ["commit", "-qm", "init"], check=True)
    (repo / "sglang/x.py").write_bytes(edit(edit(old["sglang/x.py"], 3, "3\n"), 25, "25\n") + b"end\n")
    (repo / "sglang/gone.py").unlink()
    (repo / "sglang/mv.py").rename(repo / "sglang/moved.py")
    (repo / "sglang/moved.py").write_bytes(numbered(6, "mv") + b"more\n")
    (repo / "sglang/nonl.py").write_bytes(b"no nl\nnow")
    (repo / "sglang/m.sh").chmod(0o755)
    (repo / "sglang/empty.py").write_bytes(b"")
    (repo / "sglang/dos.py").write_bytes(crlf(edit(numbered(9), 5, "five\n")))
    subprocess.run(git + ["add", "-A"], check=True)
    patch = subprocess.run(git + ["diff", "--cached", "-M"], check=True, capture_output=True).stdout
    r = apply_patch(patch.decode("utf-8", "surrogateescape"), reader(old), source="git.patch")
    for path, change in r.files.items():
        disk = repo / path
        assert change.new == (disk.read_bytes() if disk.exists() else None), path
    assert r.files["sglang/m.sh"].new_mode == 0o755
    assert r.files["sglang/moved.py"].renamed_from == "sglang/mv.py"
    # `git format-patch` output (mail header, diffstat, signature) gives the same result
    subprocess.run(git + ["commit", "-qm", "change"], check=True)
    mail = subprocess.run(git + ["format-patch", "-1", "--stdout", "-M"], check=True, capture_output=True).stdout
    r2 = apply_patch(mail.decode("utf-8", "surrogateescape"), reader(old), source="0001-change.patch")
    assert {p: c.new for p, c in r2.files.items()} == {p: c.new for p, c in r.files.items()}
    # and git itself accepts our display diff
    display = r.diff_text()
    subprocess.run(git + ["reset", "-q", "--hard", "HEAD~1"], check=True)
    chk = subprocess.run(git + ["apply", "--check", "-"], input=display.encode("utf-8", "surrogateescape"),
                         capture_output=True)
    assert chk.returncode == 0, chk.stderr.decode()


# --------------------------------------------------------------------------------------- more shapes

def test_same_file_twice_in_one_patch_applies_in_sequence():
    v0 = numbered(30)
    v1 = edit(v0, 5, "FIVE\n")
    v2 = edit(v1, 25, "TWENTY-FIVE\n")
    r = apply_patch(udiff(P, v0, v1) + udiff(P, v1, v2), reader({P: v0}), source="p")
    assert r.files[P].new == v2 and len(r.hunks) == 2


def test_series_creates_then_modifies_then_deletes_a_file():
    f = "sglang/srt/new_mod.py"
    a, b = numbered(8), edit(numbered(8), 4, "FOUR\n")
    series = [("1", udiff(f, None, a)), ("2", udiff(f, a, b)), ("3", udiff(f, b, None))]
    r = apply_series(series[:2], reader({}))
    assert r.files[f].old is None and r.files[f].new == b
    r = apply_series(series, reader({}))
    assert r.files[f].old is None and r.files[f].new is None and not r.files[f].changed


def test_copy_keeps_the_source():
    old = numbered(6)
    patch = ("diff --git a/sglang/a.py b/sglang/b.py\nsimilarity index 90%\ncopy from sglang/a.py\ncopy to sglang/b.py\n"
             "--- a/sglang/a.py\n+++ b/sglang/b.py\n@@ -4,3 +4,3 @@\n line 4\n line 5\n-line 6\n+SIX\n")
    r = apply_patch(patch, reader({"sglang/a.py": old}), source="p")
    assert "sglang/a.py" not in r.changed_files()
    assert r.files["sglang/b.py"].new == edit(old, 6, "SIX\n") and r.files["sglang/b.py"].renamed_from == "sglang/a.py"


def test_diff_N_style_creation_without_dev_null():
    patch = f"--- a/{P}\n+++ b/{P}\n@@ -0,0 +1,2 @@\n+a\n+b\n"
    assert apply_patch(patch, reader({}), source="p").files[P].new == b"a\nb\n"


def test_already_applied_reports_where_it_found_the_new_side():
    old = numbered(40)
    new = edit(old, 20, "TWENTY\n")
    shifted = b"x\ny\n" + new
    r = apply_patch(udiff(P, old, new), reader({P: shifted}), source="p")
    (h,) = r.hunks
    assert (h.status, h.offset_lines, h.line) == ("already_applied", 2, 19)


def test_crlf_target_without_final_newline():
    old = b"a\r\nb\r\nc"
    new = b"a\r\nB\r\nc"
    assert apply_patch(udiff(P, old, new), reader({P: old}), source="p").files[P].new == new
    lf_patch = udiff(P, b"a\nb\nc", b"a\nB\nc")
    assert apply_patch(lf_patch, reader({P: old}), source="p").files[P].new == new


def test_messages_name_the_diff_line_of_the_hunk():
    old = numbered(20)
    patch = udiff(P, old, edit(old, 10, "TEN\n"))
    with pytest.raises(ApplyError, match="patch line 3"):
        apply_patch(patch, reader({P: numbered(20, "zz")}), source="p")


def test_hunk_lines_that_look_like_file_headers():
    old = b"a\n-- sql comment\n++ counter\nb\n"
    new = b"a\n++ counter\nb\n--- separator\n"
    patch = udiff(P, old, new)
    assert "\n--- sql comment\n" in patch and "\n+--- separator\n" in patch
    assert apply_patch(patch, reader({P: old}), source="p").files[P].new == new
