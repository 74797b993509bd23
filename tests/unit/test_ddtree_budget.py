"""DDTree's budget by batch (patchsets/ddtree/modules/ddtree_budget.py): the schedule, its file,
the verify-cost model and the planner. Property tests: a chosen budget is never below the floor
(B - 1) nor above the server's maximum."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings, strategies as st

from patchsets.ddtree.modules.ddtree_budget import (
    CHAIN,
    BudgetSchedule,
    VerifyCostModel,
    best_budget_per_batch,
    load_schedule,
    parse_schedule,
    plan_budget,
)


def test_schedule_steps_by_batch_size_and_clamps():
    s = parse_schedule("1:128, 4:32,16:15,64:15", floor=15, ceiling=64)
    assert s.text() == "1:128,4:32,16:15,64:15"
    assert [s.budget_for(b) for b in (1, 2, 3, 4, 15, 16, 63, 64, 1000)] == [64, 64, 64, 32, 32, 15, 15, 15, 15]
    assert s.budgets() == [15, 32, 64]
    low = parse_schedule("4:3", floor=7, ceiling=100)          # below the floor: the floor
    assert low.budget_for(1) == 7 and low.budget_for(8) == 7


@pytest.mark.parametrize("text,msg", [("", "at least one"), ("1:8,x", "BATCH:BUDGET"), ("1:0", "write 'chain'"), ("1:-2", "BATCH:chain"), ("1:chained", "BATCH:chain"),
                                      ("0:8", ">= 1"), ("4:8,4:16", "distinct"), ("1=8", "BATCH:BUDGET")])
def test_bad_schedules_are_refused_naming_the_problem(text, msg):
    with pytest.raises(ValueError, match=msg):
        parse_schedule(text, floor=3, ceiling=64)


def test_floor_above_ceiling_is_refused():
    with pytest.raises(ValueError, match="floor 16 must be within 1..8"):
        parse_schedule("1:8", floor=16, ceiling=8)


def test_schedule_file(tmp_path):
    f = tmp_path / "ddtree-budget.json"
    f.write_text(json.dumps({"schedule": {"16": 15, "1": 128, "4": 32}, "measured": "2026-12-02"}))
    s = load_schedule(str(f), floor=15, ceiling=256)
    assert s.entries == ((1, 128), (4, 32), (16, 15))
    assert load_schedule("1:8", floor=3, ceiling=8).entries == ((1, 8),)
    for bad, msg in (({"schedule": [1, 2]}, "expected"), ({"schedule": {"a": 1}}, "whole numbers"),
                     ({"schedule": {"1": 0}}, "write 'chain'"), ({"schedule": {"1": "tree"}}, "whole number or 'chain'"),
                     ({"schedule": {"1": True}}, "whole number or 'chain'")):
        f.write_text(json.dumps(bad))
        with pytest.raises(ValueError, match=msg) as e:
            load_schedule(str(f), floor=3, ceiling=8)
        assert str(f) in str(e.value)
    f.write_text("{")
    with pytest.raises(ValueError, match="not a JSON"):
        load_schedule(str(f), floor=3, ceiling=8)
    with pytest.raises(OSError):
        load_schedule(str(tmp_path / "missing.json"), floor=3, ceiling=8)


def test_chain_entries_are_dflash_steps_never_clamped():
    s = parse_schedule("1:64, 4:32, 16:Chain", floor=15, ceiling=64)
    assert s.entries == ((1, 64), (4, 32), (16, CHAIN)) and s.text() == "1:64,4:32,16:chain"
    assert [s.budget_for(b) for b in (1, 3, 4, 15, 16, 500)] == [64, 64, 32, 32, CHAIN, CHAIN]
    assert s.has_chain and s.budgets() == [CHAIN, 32, 64]
    assert parse_schedule(s.text(), floor=15, ceiling=64) == s
    assert not parse_schedule("1:8", floor=3, ceiling=8).has_chain


def test_schedule_file_with_chain(tmp_path):
    f = tmp_path / "ddtree-budget.json"
    f.write_text(json.dumps({"schedule": {"1": 32, "8": "chain"}}))
    assert load_schedule(str(f), floor=3, ceiling=32).entries == ((1, 32), (8, CHAIN))


@settings(max_examples=200, deadline=None)
@given(entries=st.dictionaries(st.integers(1, 512), st.one_of(st.integers(1, 1024), st.just(CHAIN)),
                               min_size=1, max_size=8),
       floor=st.integers(1, 31), extra=st.integers(0, 600), bs=st.integers(0, 2048))
def test_budget_is_always_within_floor_and_ceiling(entries, floor, extra, bs):
    """A step's budget is a tree within [floor, ceiling], or a chain step where the schedule says
    so; whichever it is, budgets() lists it, and the text form reads back to the same schedule."""
    ceiling = floor + extra
    s = BudgetSchedule(tuple(sorted(entries.items())), floor, ceiling)
    n = s.budget_for(bs)
    assert (n == CHAIN or floor <= n <= ceiling) and n in s.budgets()
    i = max([k for k in entries if k <= max(1, bs)] or [min(entries)])
    assert (n == CHAIN) == (entries[i] == CHAIN)
    assert parse_schedule(s.text(), floor=floor, ceiling=ceiling) == s


# The H200 verify cost of the budget issue (relative to 16 tokens; 6.5 ms at batch 1, 40 ms at 64)
H200_REL = {1: {16: 1.0, 33: 1.14, 65: 1.16, 129: 1.30, 257: 1.71, 513: 2.94},
            4: {16: 1.0, 33: 1.19, 65: 1.60, 129: 2.73, 257: 4.92, 513: 9.69},
            16: {16: 1.0, 33: 1.75, 65: 2.78, 129: 5.57, 257: 10.7, 513: 21.3},
            64: {16: 1.0, 33: 1.95, 65: 3.34, 129: 6.53, 257: 12.8}}
BASE_MS = {1: 6.5, 4: 10.0, 16: 20.0, 64: 40.0}
COST = VerifyCostModel({(b, w): BASE_MS[b] * r / 1000 for b, row in H200_REL.items() for w, r in row.items()},
                       {1: 0.0012, 4: 0.002, 16: 0.004, 64: 0.01})


def paper_like_accept(n: int) -> float:
    """Expected accepted drafts of the best n-node tree: the chain's 6.79 at n = 15 (DFlash, tau
    7.79), rising with log n to 9.73 at n = 512 (DDTree's best, tau 10.73); Qwen3-8B MATH-500."""
    if n <= 15:
        return 6.79 * n / 15
    return 6.79 + (9.73 - 6.79) * math.log2(n / 15) / math.log2(512 / 15)


def test_cost_model_interpolates_between_measured_points():
    assert COST.verify_s(1, 16) == pytest.approx(0.0065)
    assert COST.verify_s(16, 129) == pytest.approx(0.020 * 5.57)
    mid = COST.verify_s(1, 24)
    assert COST.verify_s(1, 16) < mid < COST.verify_s(1, 33)
    assert COST.verify_s(4, 16) < COST.verify_s(8, 16) < COST.verify_s(16, 16)
    assert COST.step_s(1, 16) == pytest.approx(0.0065 + 0.0012)
    with pytest.raises(ValueError):
        VerifyCostModel({}, {})


def test_planner_widens_the_tree_at_batch_1_and_keeps_the_floor_under_load():
    cands = [15, 32, 64, 128, 256, 512]
    n1, rate1 = plan_budget(1, paper_like_accept, COST, cands)
    n15, rate15 = plan_budget(1, paper_like_accept, COST, [15])
    assert n1 > 15 and rate1 > rate15
    for bs in (16, 64):
        assert plan_budget(bs, paper_like_accept, COST, cands)[0] == 15
    sched = best_budget_per_batch([1, 4, 16, 64], paper_like_accept, COST, cands, floor=15, ceiling=256)
    assert sched.entries[0][0] == 1 and sched.budget_for(64) == 15
    assert all(15 <= n <= 256 for n in sched.budgets())
    with pytest.raises(ValueError):
        plan_budget(1, paper_like_accept, COST, [])


def test_planner_chooses_dflash_steps_where_the_tree_costs_more_than_it_gains():
    """With DFlash's own step measured (1-9 % below the floor tree's, about as on the H200 at
    batch 1-64), the plan picks chain steps under load, a tree at batch 1, and never a tree that
    projects below the chain."""
    chain = {b: f * COST.step_s(b, 16) for b, f in {1: 0.99, 4: 0.95, 16: 0.93, 64: 0.91}.items()}
    cost = VerifyCostModel(COST.table, COST.draft_s, chain)

    def acc(n: int) -> float:
        return 6.79 if n == CHAIN else paper_like_accept(max(n, 15))

    cands = [CHAIN, 15, 32, 64, 128, 256]
    assert plan_budget(64, acc, cost, cands)[0] == CHAIN
    assert plan_budget(1, acc, cost, cands)[0] > 15
    sched = best_budget_per_batch([1, 4, 16, 64], acc, cost, cands, floor=15, ceiling=256)
    assert sched.budget_for(64) == CHAIN and sched.budget_for(1) > 15
    for bs in (1, 4, 16, 64):
        n = sched.budget_for(bs)
        assert plan_budget(bs, acc, cost, [n])[1] >= plan_budget(bs, acc, cost, [CHAIN])[1]
    # equal cost and acceptance: the chain wins the tie
    same = VerifyCostModel(COST.table, COST.draft_s, {b: COST.step_s(b, 16) for b in BASE_MS})
    assert plan_budget(4, lambda n: 6.79, same, [15, CHAIN])[0] == CHAIN
    with pytest.raises(ValueError, match="no measured chain"):
        plan_budget(1, acc, COST, [CHAIN])
