"""Whether a host can serve a DDTREE budget schedule (sglang_patcher/serve/schedule_support.py):
said as one configuration error naming the host and its inventory file, before any server starts."""

from __future__ import annotations

import re

import pytest

from sglang_patcher.errors import ConfigError
from sglang_patcher.inventory import Host
from sglang_patcher.serve.schedule_support import refuse_unservable_schedule

R3 = {"budget_schedule"}
R4 = R3 | {"budget_schedule_chain"}
R7 = R4 | {"budget_auto"}
R9 = R7 | {"budget_schedule_graphs"}


def host(args=("--disable-cuda-graph",), budget=16) -> Host:
    return Host(name="gpu", hostname="gpu.invalid", python="/usr/bin/python3",
                serve={"model": "/m", "draft_model": "/d", "args": list(args), "ddtree": {"budget": budget}})


def test_nothing_to_check_without_a_schedule():
    h = host(args=())
    refuse_unservable_schedule(h, h.serve, None, features=set(), carried="no sglpatch deployment")


@pytest.mark.parametrize(("schedule", "features", "needs"), [
    ("auto", R4, "auto budget planner (ddtree revision 7 on)"),
    ("1:16,8:chain", R3, "chain entries in a budget schedule (ddtree revision 4 on)"),
    ("1:16,8:4", set(), "budget schedule (ddtree revision 3 on)"),
])
def test_a_revision_without_the_feature_is_named(schedule, features, needs):
    h = host()
    with pytest.raises(ConfigError, match=re.escape(f"host gpu carries ddtree r2, which has no {needs}")) as e:
        refuse_unservable_schedule(h, h.serve, schedule, features=features, carried="ddtree r2")
    assert "apply a newer ddtree revision" in e.value.hint and "host gpu" in e.value.hint
    refuse_unservable_schedule(h, h.serve, schedule, features=R7, carried="ddtree r7")
    refuse_unservable_schedule(h, h.serve, schedule, features=None)       # revision not known yet


@pytest.mark.parametrize("schedule", ["auto", "1:16,8:chain", "1:16,8:4", "1:32,8:16"])
def test_several_widths_need_the_profile_without_cuda_graphs_before_revision_9(schedule):
    h = host(args=("--mem-fraction-static", "0.8"), budget=64)
    with pytest.raises(ConfigError, match="verifies at several widths, which ddtree r7 runs only with") as e:
        refuse_unservable_schedule(h, h.serve, schedule, features=R7, carried="ddtree r7")
    assert "--disable-cuda-graph to serve.args of host gpu" in e.value.hint
    assert "apply ddtree revision 9 or later" in e.value.hint
    # revision 9: the captured width replays, the others verify eagerly beside the graphs
    refuse_unservable_schedule(h, h.serve, schedule, features=R9, carried="ddtree r9")


def test_one_width_after_clamping_keeps_cuda_graphs():
    """Every tree budget is clamped to the server's budget: 1:32,8:16 at budget 16 is one width."""
    h = host(args=(), budget=16)
    refuse_unservable_schedule(h, h.serve, "1:32,8:16", features=R7, carried="ddtree r7")
    refuse_unservable_schedule(h, h.serve, "1:16", features=R7, carried="ddtree r7")
    with pytest.raises(ConfigError):
        refuse_unservable_schedule(h, h.serve, "1:32,8:16", features=R7, carried="ddtree r7", budget=64)


@pytest.mark.parametrize(("schedule", "said"), [
    ("1:8,4:8", "budget 8's width, not the server budget 16's"),
    ("1:chain", "DFlash's width, not the server budget 16's"),
])
def test_one_width_other_than_the_budget_needs_the_profile_without_cuda_graphs(schedule, said):
    """The graphs are captured at the server budget's width (the worker refuses any other):
    a table of one width below it is refused like several widths."""
    h = host(args=(), budget=16)
    with pytest.raises(ConfigError, match=re.escape(said)) as e:
        refuse_unservable_schedule(h, h.serve, schedule, features=R7, carried="ddtree r7")
    assert "--disable-cuda-graph to serve.args of host gpu" in e.value.hint
    refuse_unservable_schedule(h, h.serve, schedule, features=R9, carried="ddtree r9")
    h = host(budget=16)          # --disable-cuda-graph: any width
    refuse_unservable_schedule(h, h.serve, schedule, features=R7, carried="ddtree r7")


def test_the_refusal_is_the_same_sentence_the_sweep_reports():
    from sglang_patcher.serve.schedule_support import schedule_refusal

    h = host(args=(), budget=16)
    assert schedule_refusal(h, h.serve, "1:16", features=R7, carried="ddtree r7") is None
    r = schedule_refusal(h, h.serve, "auto", features=R4, carried="ddtree r4")
    assert r.reason.startswith("host gpu carries ddtree r4, which has no auto budget planner")
    assert "apply a newer ddtree revision first" in r.hint


def test_a_fixed_schedule_is_served_by_every_revision_and_left_out_before_13():
    """`budget_schedule: fixed` (every step at the budget) is ddtree revision 13's word: an unset
    schedule means auto there. Revisions before it do not know the word but serve a fixed budget
    when the schedule is unset, so sglpatch leaves it out for them instead of refusing."""
    from sglang_patcher.serve.schedule_support import served_profile

    h = Host(name="gpu", hostname="gpu.invalid", python="/usr/bin/python3",
             serve={"model": "/m", "draft_model": "/d", "ddtree": {"budget": 16, "budget_schedule": "Fixed"}})
    assert h.serve.ddtree.budget_schedule == "fixed"
    for features in (set(), R3, R9, R9 | {"budget_auto_default"}):
        refuse_unservable_schedule(h, h.serve, "fixed", features=features, carried="ddtree rN")
    assert served_profile(h.serve, R9).ddtree.flags() == ["--speculative-ddtree-budget", "16"]
    new = served_profile(h.serve, R9 | {"budget_auto_default"})
    assert new is h.serve and new.ddtree.flags()[-2:] == ["--speculative-ddtree-budget-schedule", "fixed"]
    auto = host()
    assert served_profile(auto.serve, R9) is auto.serve          # control: only `fixed` is changed
