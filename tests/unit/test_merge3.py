"""merge3: the three-way line merge of ``patchset port`` (and its agreement with ``git merge-file``)."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from sglang_patcher.merge3 import merge3, split_lines


def lines(*items: str) -> list[bytes]:
    return [f"{x}\n".encode() for x in items]


BASE = lines(*(f"line {i}" for i in range(1, 21)))


def with_(base: list[bytes], **changes: str) -> list[bytes]:
    """``base`` with line N (1-based, key ``lN``) replaced; an empty value deletes it."""
    out = list(base)
    for key, value in sorted(changes.items(), key=lambda kv: -int(kv[0][1:])):
        n = int(key[1:]) - 1
        out[n:n + 1] = [] if value == "" else [f"{x}\n".encode() for x in value.split("|")]
    return out


def test_split_lines_keeps_endings_and_a_missing_final_newline():
    assert split_lines(b"a\r\nb\rc\nd") == [b"a\r\n", b"b\rc\n", b"d"]
    assert split_lines(b"") == [] and split_lines(b"x\n") == [b"x\n"]


def test_changes_of_both_sides_apart_merge_cleanly():
    ours, theirs = with_(BASE, l3="ours 3"), with_(BASE, l10="theirs 10|theirs 10b")
    m = merge3(BASE, ours, theirs)
    assert m.clean
    assert m.lines == with_(BASE, l3="ours 3", l10="theirs 10|theirs 10b")


def test_one_unchanged_line_between_the_changes_is_enough():
    m = merge3(BASE, with_(BASE, l5="ours 5"), with_(BASE, l7="theirs 7"))
    assert m.clean and m.lines == with_(BASE, l5="ours 5", l7="theirs 7")


def test_touching_changes_conflict():
    # theirs inserts right after line 5, which ours edits: no shared line anchors the insertion
    theirs = with_(BASE, l5="line 5|inserted")
    m = merge3(BASE, with_(BASE, l5="ours 5"), theirs)
    assert not m.clean
    (c,) = m.conflicts
    assert c.ours == (b"ours 5\n",) and c.base == (b"line 5\n",) and c.theirs == (b"line 5\n", b"inserted\n")
    assert c.ours_start == c.base_start == 4


def test_same_change_on_both_sides_is_taken_once():
    both = with_(BASE, l8="same")
    m = merge3(BASE, both, both)
    assert m.clean and m.lines == both


def test_conflict_markers_diff3_style_and_positions():
    m = merge3(BASE, with_(BASE, l10="ours"), with_(BASE, l10="theirs"), labels=("new", "old", "patch"))
    assert not m.clean
    c = m.conflicts[0]
    text = m.data.decode()
    assert "<<<<<<< new\nours\n||||||| old\nline 10\n=======\ntheirs\n>>>>>>> patch\n" in text
    assert m.lines[c.out_start] == b"<<<<<<< new\n"
    assert text.startswith("line 1\n") and text.endswith("line 20\n")


def test_deleted_on_one_side_changed_on_the_other_conflicts():
    m = merge3(BASE, with_(BASE, l12=""), with_(BASE, l12="theirs 12"))
    assert len(m.conflicts) == 1 and m.conflicts[0].ours == ()


def test_last_line_without_newline_gets_one_before_a_marker():
    base = [b"a\n", b"b"]
    m = merge3(base, [b"a\n", b"ours"], [b"a\n", b"theirs"])
    assert b"ours\n||||||| base\nb\n=======\ntheirs\n>>>>>>> theirs\n" in m.data


def test_repeated_lines_do_not_lose_the_alignment():
    """autojunk is off: in a long file blank lines and ')' are frequent, and must still match."""
    block = lines("def f():", "    return (", "        1", "    )", "")
    base = block * 60
    ours = list(base)
    ours[2] = b"        2\n"                       # first function changed by the release
    theirs = list(base)
    theirs[-3] = b"        3\n"                    # last function changed by the patch
    m = merge3(base, ours, theirs)
    assert m.clean
    assert m.lines[2] == b"        2\n" and m.lines[-3] == b"        3\n" and len(m.lines) == len(base)


CASES = [
    ("apart", with_(BASE, l3="ours 3"), with_(BASE, l10="theirs 10")),
    ("one line apart", with_(BASE, l5="o5"), with_(BASE, l7="t7")),
    ("touching", with_(BASE, l5="o5"), with_(BASE, l6="t6")),
    ("overlap", with_(BASE, l5="o5|o5b", l6=""), with_(BASE, l6="t6")),
    ("delete vs edit", with_(BASE, l12=""), with_(BASE, l12="t12")),
    ("same", with_(BASE, l8="x"), with_(BASE, l8="x")),
    ("insert at end", BASE + lines("ours end"), with_(BASE, l2="t2")),
    ("both insert at end", BASE + lines("ours end"), BASE + lines("theirs end")),
]


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
@pytest.mark.parametrize("name,ours,theirs", CASES, ids=[c[0] for c in CASES])
def test_agrees_with_git_merge_file(tmp_path, name, ours, theirs):
    for fname, content in (("base", BASE), ("ours", ours), ("theirs", theirs)):
        (tmp_path / fname).write_bytes(b"".join(content))
    proc = subprocess.run(["git", "merge-file", "-p", "--diff3", "-L", "ours", "-L", "base", "-L", "theirs",
                           "ours", "base", "theirs"], cwd=tmp_path, capture_output=True)
    m = merge3(BASE, ours, theirs)
    assert proc.returncode == len(m.conflicts), name
    assert proc.stdout == m.data, name
