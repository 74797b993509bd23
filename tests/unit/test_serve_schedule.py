"""One budget-schedule grammar (sglang_patcher/serve/schedule.py): what a ``hosts.yaml`` serve
profile accepts as ``serve.ddtree.budget_schedule`` is exactly what the server's own parser (the
ddtree payload's ``ddtree_budget``) accepts, read the same way, and what ``bench --sweep`` writes
reads back as it chose it. Property tests over arbitrary text and over well-formed schedules."""

from __future__ import annotations

import pytest
from hypothesis import example, given, settings, strategies as st
from pydantic import ValidationError

from patchsets.ddtree.modules.ddtree_budget import load_schedule, parse_schedule
from sglang_patcher.serve.profile import DDTreeSettings
from sglang_patcher.serve.schedule import CHAIN, parse_entries, schedule_text


def server_reads(text: str) -> tuple | None:
    """The entries the server's parser makes of ``text`` (its floor and ceiling only clamp steps),
    or None where it refuses the text."""
    try:
        return parse_schedule(text, floor=3, ceiling=64).entries
    except ValueError:
        return None


def profile_reads(text: str) -> str | None:
    """The profile's stored ``budget_schedule`` for ``text``, or None where the profile refuses it."""
    try:
        return DDTreeSettings(budget_schedule=text).budget_schedule
    except ValidationError:
        return None


_pieces = st.sampled_from(["1", "4", "16", "0", "01", "64", "chain", "Chain", "CHAIN", ":", ",", " ", "x",
                           "-", ";", "=", "\t", "tree", "chained", "١"])


@settings(max_examples=400, deadline=None)
@given(text=st.lists(_pieces, max_size=12).map("".join))
@example(text="1:32, 16:Chain")
@example(text="4:8,4:16")          # a batch size twice: the old profile check let it through
@example(text="01:8")              # a leading zero: the old profile check refused it
@example(text="16:chain,1:64")     # out of order
@example(text="1:0")
@example(text="")
@example(text=" , ")
def test_profile_and_server_accept_and_refuse_the_same_text(text):
    want = server_reads(text)
    got = profile_reads(text)
    assert (got is None) == (want is None), (text, got, want)
    if got is not None:
        assert server_reads(got) == want          # the profile keeps what the server will read
        assert got == schedule_text(want)         # in its normal form


_entries = st.dictionaries(st.integers(1, 512), st.one_of(st.integers(1, 1024), st.just(CHAIN)),
                           min_size=1, max_size=8).map(lambda d: sorted(d.items()))


@settings(max_examples=200, deadline=None)
@given(entries=_entries, spaced=st.booleans())
def test_written_schedules_read_back_in_both(entries, spaced):
    """What sglpatch writes (``bench --sweep``) the profile and the server read back as chosen."""
    text = schedule_text(entries)
    assert parse_entries(text) == tuple(entries) == server_reads(text)
    assert load_schedule(text, floor=1, ceiling=2048).entries == tuple(entries)
    assert profile_reads(text.replace(",", ", ") if spaced else text) == text


@pytest.mark.parametrize("text,says", [
    ("1:8,x", "bad DDTREE budget schedule entry 'x': write BATCH:BUDGET or BATCH:chain"),
    ("1:0", "write 'chain' for DFlash's own step"),
    ("4:8,4:16", "distinct"),
    ("0:8", ">= 1"),
    ("", "at least one"),
])
def test_a_refused_profile_schedule_says_what_the_server_would_and_what_to_write(text, says):
    with pytest.raises(ValidationError) as e:
        DDTreeSettings(budget_schedule=text)
    msg = str(e.value)
    assert "BATCH:BUDGET pairs like '1:64,4:16,16:chain'" in msg and repr(text) in msg and says in msg
    with pytest.raises(ValueError, match=says.replace("(", r"\(")):
        parse_entries(text)
