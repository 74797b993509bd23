"""Property tests of the strict applier: random files, random edits, a diff made by difflib.

* lines unique → the diff applies and yields exactly the edited file; a second apply is a no-op.
* lines repeated (look-alike blocks) → the applier either refuses (ApplyError) or yields exactly
  the edited file: it never puts a hunk in the wrong place.
* ApplyResult.diff_text() re-applied to the original gives the same result.
"""

from __future__ import annotations

import difflib

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from sglang_patcher.applier import apply_patch, apply_series
from sglang_patcher.errors import ApplyError

from tests.support.difftext import NO_NL, lines_of  # noqa: E402
P = "sglang/f.py"
SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def udiff(old: bytes, new: bytes, n: int) -> str:
    body = list(difflib.unified_diff(lines_of(old), lines_of(new), n=n))[2:]
    out = [f"--- a/{P}\n", f"+++ b/{P}\n"]
    for line in body:
        out.append(line)
        if not line.endswith("\n"):
            out.append("\n" + NO_NL)
    return "".join(out)


@st.composite
def edited_file(draw, unique: bool):
    eol = draw(st.sampled_from(["\n", "\r\n", "mixed"]))
    if unique:
        n = draw(st.integers(0, 40))
        words = [f"line {i} " + draw(st.text("ab ", max_size=3)) for i in range(n)]
    else:
        vocab = st.sampled_from(["x = 1", "", "pass", "return x", "}"])
        block = draw(st.lists(vocab, min_size=1, max_size=6))
        words = []
        for _ in range(draw(st.integers(1, 5))):   # repeated blocks: look-alike places
            words += block + draw(st.lists(vocab, max_size=2))

    def end(i: int) -> str:
        return ("\r\n" if i % 2 else "\n") if eol == "mixed" else eol

    old = [w + end(i) for i, w in enumerate(words)]
    new: list[str] = []
    fresh = 0
    for i, line in enumerate(old + [None]):
        op = draw(st.sampled_from(["keep"] * 6 + ["del", "rep", "ins"]))
        if op == "ins" or (op == "rep" and line is not None):
            fresh += 1
            new.append((f"new {fresh}" if unique else draw(st.sampled_from(["x = 1", "pass", "new"]))) + end(i))
        if line is not None and op in ("keep", "ins"):
            new.append(line)
    old_b, new_b = "".join(old).encode(), "".join(new).encode()
    if old_b and draw(st.booleans()):
        old_b = old_b.rstrip(b"\r\n")
    if new_b and draw(st.booleans()):
        new_b = new_b.rstrip(b"\r\n")
    return old_b, new_b, draw(st.sampled_from([3, 3, 1, 5]))


@SETTINGS
@given(edited_file(unique=True))
# found by CI: a hunk inserting at both ends of the file re-applied on top of itself
@example((b"line 0 \nline 1 \n", b"new 1\nline 0 \nline 1 \nnew 2\n", 3))
@example((b"line 0 \nline 1 \n", b"new 1\nline 0 \nline 1 \nnew 2", 1))
def test_unique_lines_apply_exactly_and_reapply_is_no_op(case):
    old, new, n = case
    patch = udiff(old, new, n)
    if old == new:
        return
    r = apply_patch(patch, {P: old}.get, source="prop")
    assert r.files[P].new == new
    again = apply_patch(patch, {P: new}.get, source="prop")
    assert again.files[P].new == new
    assert all(h.status == "already_applied" for h in again.hunks)


@SETTINGS
@given(edited_file(unique=False))
def test_look_alike_lines_refused_or_exact_never_wrong(case):
    old, new, n = case
    if old == new:
        return
    try:
        r = apply_patch(udiff(old, new, n), {P: old}.get, source="prop")
    except ApplyError as exc:
        assert "ambiguous" in str(exc) or "no context" in str(exc), str(exc)
        return
    assert r.files[P].new == new


@SETTINGS
@given(edited_file(unique=True))
def test_diff_text_round_trip(case):
    old, new, n = case
    if old == new:
        return
    r = apply_patch(udiff(old, new, n), {P: old}.get, source="prop")
    again = apply_patch(r.diff_text(), {P: old}.get, source="display")
    assert again.files[P].new == new


@st.composite
def three_versions(draw):
    """v0 → v1 → v2 with unique lines (fresh lines never repeat)."""
    n = draw(st.integers(0, 30))
    v = [f"line {i}\n" for i in range(n)]
    versions = [v]
    fresh = 0
    for _ in range(2):
        nxt: list[str] = []
        for line in versions[-1] + [None]:
            op = draw(st.sampled_from(["keep"] * 5 + ["del", "ins"]))
            if op == "ins":
                fresh += 1
                nxt.append(f"new {fresh}\n")
            if line is not None and op != "del":
                nxt.append(line)
        versions.append(nxt)
    return ["".join(x).encode() for x in versions]


@SETTINGS
@given(three_versions())
def test_series_equals_successive_edits(versions):
    v0, v1, v2 = versions
    series = [("0001", udiff(v0, v1, 3)), ("0002", udiff(v1, v2, 3))]
    series = [(s, t) for (s, t), (a, b) in zip(series, [(v0, v1), (v1, v2)]) if a != b]
    if not series:
        return
    r = apply_series(series, {P: v0}.get)
    assert r.files[P].old == v0 and r.files[P].new == v2
