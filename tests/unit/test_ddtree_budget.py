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


# -- auto: the online planner ---------------------------------------------------------------------
from patchsets.ddtree.modules.ddtree_budget import (  # noqa: E402
    AutoBudgetPlanner,
    auto_candidates,
    batch_bucket,
    is_auto,
)


def test_auto_candidates_double_the_verify_width_up_to_the_ceiling():
    assert auto_candidates(15, 256) == (CHAIN, 15, 31, 63, 127, 255, 256)
    assert auto_candidates(3, 16) == (CHAIN, 3, 7, 15, 16)
    assert auto_candidates(3, 3) == (CHAIN, 3)
    with pytest.raises(ValueError, match="floor 9 must be within 1..8"):
        auto_candidates(9, 8)
    assert [batch_bucket(b) for b in (0, 1, 2, 3, 4, 7, 8, 63, 64, 100)] == [1, 1, 2, 2, 4, 4, 8, 32, 64, 64]
    assert is_auto(" Auto ") and not is_auto("1:8") and not is_auto(None)
    with pytest.raises(ValueError, match="not a budget table"):
        load_schedule("auto", floor=3, ceiling=8)


def _run(planner, steps, bs, cost, accept):
    """Drive ``planner`` like the worker: choose, then the step's time and accept length."""
    chosen = []
    for _ in range(steps):
        n = planner.choose(bs)
        chosen.append(n)
        planner.record_time(bs, n, cost(bs, n))
        planner.record_accept(n, accept(n))
    return chosen


# the H200 table of bench/results/2026-12-02-h200-decode-step.md (ms per step; chain = DFLASH's)
H200_MS = {1: {CHAIN: 8.74, 15: 9.00, 31: 9.13, 63: 9.48, 127: 10.20, 255: 12.85},
           4: {CHAIN: 8.98, 15: 9.39, 31: 9.93, 63: 12.41, 127: 19.56, 255: 34.26},
           16: {CHAIN: 18.54, 15: 19.84, 31: 25.15, 63: 37.37, 127: 70.72, 255: 131.36},
           64: {CHAIN: 69.50, 15: 76.34, 31: 100.65, 63: 150.72, 127: 287.50, 255: 534.43}}
# the paper's curve (committed tokens per step): DFlash 7.79, DDTree 7.79 at N 15 to 10.73 at N 512
PAPER_TAU = {CHAIN: 7.79, 15: 7.79, 31: 8.42, 63: 9.00, 127: 9.58, 255: 10.15}


def test_auto_finds_the_best_budget_per_batch_on_the_h200_table():
    p = AutoBudgetPlanner(15, 255, reexplore_every=1000)
    for bs in (1, 4, 16, 64):
        _run(p, 40, bs, lambda b, n: H200_MS[b][n] / 1e3, PAPER_TAU.__getitem__)
    # per batch the budget with the most tokens/s on that table: N 63 alone (ratio 1.065), the
    # chain from 4 on (every tree < 1.0 there)
    assert p.plan() == {1: 63, 4: CHAIN, 16: CHAIN, 64: CHAIN}
    assert p.describe() == "1:63,4:chain,16:chain,64:chain"
    # plan_changes (the worker logs the plan when it moves) counts changes, not decisions
    changes = p.plan_changes
    assert 4 <= changes < 4 * 40
    _run(p, 40, 1, lambda b, n: H200_MS[b][n] / 1e3, PAPER_TAU.__getitem__)
    assert p.plan_changes == changes and p.plan() == {1: 63, 4: CHAIN, 16: CHAIN, 64: CHAIN}
    # past the peak it never measured N 255 at batch 64, where one step costs 7.7x DFlash's
    assert p._seen.get((64, 255), 0) == 0 and p._seen.get((64, 63), 0) == 0


def test_auto_follows_a_workload_whose_acceptance_rises():
    p = AutoBudgetPlanner(15, 255, reexplore_every=8)
    _run(p, 60, 1, lambda b, n: H200_MS[1][n] / 1e3, lambda n: 7.79)           # trees find nothing
    assert p.plan()[1] == CHAIN
    rich = {CHAIN: 4.0, 15: 6.0, 31: 8.0, 63: 9.0, 127: 9.5, 255: 9.6}        # trees find much
    _run(p, 400, 1, lambda b, n: H200_MS[1][n] / 1e3, rich.__getitem__)
    value = {n: rich[n] / H200_MS[1][n] for n in rich}          # N 63 best, N 127 1.9 % behind it
    assert p.plan()[1] != CHAIN and value[p.plan()[1]] >= max(value.values()) / (1 + p.hysteresis)


def test_auto_warm_up_sample_dropped_and_outliers_clipped():
    p = AutoBudgetPlanner(3, 8, alpha=0.25)
    p.record_time(1, CHAIN, 30.0)                  # the first step compiles: dropped
    p.record_time(1, CHAIN, 0.010)
    p.record_time(1, CHAIN, 5.0)                   # a stall: clipped to 4x the estimate
    assert p._time[(1, CHAIN)].value == pytest.approx(0.5 * 0.010 + 0.5 * 0.040)   # mean of 2 samples
    p.record_time(1, 99, 1.0)                      # not a candidate: ignored
    p.record_accept(3, 0.5)                        # below one token: ignored
    assert (1, 99) not in p._seen and 3 not in p._accept
    with pytest.raises(ValueError):
        AutoBudgetPlanner(3, 8, alpha=0)


@settings(max_examples=150, deadline=None)
@given(floor=st.integers(1, 31), extra=st.integers(0, 300), seed=st.integers(0, 2**31 - 1),
       sizes=st.lists(st.integers(1, 300), min_size=1, max_size=60))
def test_auto_never_leaves_chain_or_floor_to_ceiling(floor, extra, seed, sizes):
    import random

    rng = random.Random(seed)
    p = AutoBudgetPlanner(floor, floor + extra, reexplore_every=rng.randint(2, 20))
    for bs in sizes:
        n = p.choose(bs)
        assert n == CHAIN or floor <= n <= floor + extra
        p.record_time(bs, n, rng.uniform(1e-4, 1.0))
        p.record_accept(n, rng.uniform(1.0, 10.0))


# -- revision 12: verify graphs of their own for the narrower widths, within a memory bound -------
from patchsets.ddtree.modules.ddtree_budget import GraphWidthPlan, plan_graph_widths  # noqa: E402


def test_graph_widths_captured_narrowest_first_until_the_bound():
    calls = []

    def capture(n):                       # 0.1 GiB per verify token of width
        calls.append(n)
        return 0.1 * (n + 1)

    plan = plan_graph_widths([31, CHAIN, 3, 7, 7, 15], capture, bound_gib=2.5)
    # 3 (0.4) + 7 (0.8) = 1.2; 15 predicted 1.6 -> 2.8 > 2.5: 15 and 31 left eager, never captured
    assert calls == [3, 7]
    assert plan.captured == ((3, pytest.approx(0.4)), (7, pytest.approx(0.8)))
    assert plan.skipped == (15, 31) and plan.used_gib == pytest.approx(1.2)
    line = plan.describe()
    assert "3 (0.40 GiB), 7 (0.80 GiB)" in line and "[15, 31]" in line and "1.20 of 2.5 GiB" in line


def test_graph_widths_bound_zero_captures_nothing_and_bad_bounds_are_refused():
    def capture(n):
        raise AssertionError("captured under a zero bound")

    assert plan_graph_widths([3, 7], capture, bound_gib=0.0) == GraphWidthPlan((), (3, 7), 0.0)
    assert plan_graph_widths([CHAIN], capture, bound_gib=1.0) == GraphWidthPlan((), (), 1.0)
    for bad in (-1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="memory bound"):
            plan_graph_widths([3], lambda n: 0.0, bound_gib=bad)


def test_graph_widths_a_capture_dearer_than_predicted_stops_the_rest():
    costs = {3: 0.1, 7: 2.0, 15: 0.1}      # 7 costs far more than 3 predicted: kept, counted
    plan = plan_graph_widths([3, 7, 15], costs.__getitem__, bound_gib=1.0)
    assert [n for n, _ in plan.captured] == [3, 7] and plan.skipped == (15,)
    # a negative measurement (memory freed meanwhile) counts as free
    assert plan_graph_widths([3], lambda n: -0.5, bound_gib=1.0).captured == ((3, 0.0),)


@settings(max_examples=200, deadline=None)
@given(budgets=st.lists(st.integers(0, 300), max_size=12),
       per_token=st.floats(0.0, 0.5), bound=st.floats(0.0, 20.0))
def test_graph_widths_stay_within_the_bound_when_cost_follows_width(budgets, per_token, bound):
    """Cost proportional to the verify width (what the prediction assumes): the captured memory
    never passes the bound, except a first capture that alone exceeds it; captured and skipped
    split the distinct tree budgets, captured ones all narrower than skipped ones."""
    plan = plan_graph_widths(budgets, lambda n: per_token * (n + 1), bound_gib=bound)
    tree = sorted({n for n in budgets if n != CHAIN})
    got = [n for n, _ in plan.captured]
    assert got + list(plan.skipped) == tree
    if bound == 0:
        assert not got
    elif len(got) > 1:
        assert plan.used_gib <= bound + 1e-9
    else:
        assert len(got) <= 1


# -- revision 13: auto as the default -------------------------------------------------------------
from patchsets.ddtree.modules.ddtree_budget import (  # noqa: E402
    AUTO,
    FIXED,
    GraphCaptureFailed,
    auto_candidates,
    schedule_source,
)


@pytest.mark.parametrize(("text", "budget", "want"), [
    (None, 16, AUTO), ("", 16, AUTO), ("  ", 3, AUTO),       # unset: auto from the floor (3) up
    (None, 2, None),                                         # below the floor: nothing to choose
    ("fixed", 16, None), (" FIXED ", 2, None),
    ("auto", 16, AUTO), ("Auto", 2, AUTO),                   # asked by name: the worker refuses it
    ("1:8,4:chain", 16, "1:8,4:chain"), ("/x/s.json", 16, "/x/s.json"),
])
def test_an_unset_schedule_means_auto_where_it_can_run(text, budget, want):
    assert schedule_source(text, budget=budget, floor=3) == want


def test_fixed_and_auto_are_not_tables():
    for word in ("fixed", "auto", " Fixed"):
        with pytest.raises(ValueError, match="is not a budget table"):
            load_schedule(word, floor=3, ceiling=16)
    assert FIXED == "fixed"


def test_auto_without_chain_never_chooses_it_and_one_candidate_is_enough():
    """Beside CUDA graphs at budget B - 1 a chain step cannot run (its width is the captured one,
    with the tree mask): the planner is built without it. With the floor alone it has one budget
    to run, re-exploration included (it used to step past the end of its candidates)."""
    assert auto_candidates(3, 16, chain=False) == (3, 7, 15, 16)
    assert auto_candidates(3, 16) == (CHAIN, 3, 7, 15, 16)               # control
    p = AutoBudgetPlanner(3, 3, chain=False, reexplore_every=2)
    for _ in range(50):
        n = p.choose(4)
        assert n == 3
        p.record_time(4, n, 0.01)
        p.record_accept(n, 2.0)
    q = AutoBudgetPlanner(3, 16, chain=False, min_samples=1)
    chosen = set()
    for i in range(300):
        n = q.choose(8)
        chosen.add(n)
        q.record_time(8, n, 0.01 * (1 + (n + 1) / 16))
        q.record_accept(n, 1.0 + 0.5 * math.log2(n + 1))
    assert CHAIN not in chosen and chosen <= {3, 7, 15, 16}


def test_graph_widths_a_failed_capture_leaves_it_and_the_wider_ones_eager():
    calls = []

    def capture(n):
        calls.append(n)
        if n == 7:
            raise GraphCaptureFailed("OutOfMemoryError: CUDA out of memory")
        return 0.01

    plan = plan_graph_widths([3, 7, 15, 31], capture, bound_gib=2.0)
    assert calls == [3, 7]                                   # nothing wider is tried
    assert plan.captured == ((3, 0.01),) and plan.skipped == (15, 31)
    assert plan.failed == ((7, "OutOfMemoryError: CUDA out of memory"),)
    line = plan.describe()
    assert "after a failed capture" in line and "capture failed, verified eagerly: 7 (OutOfMemoryError" in line
    ok = plan_graph_widths([3, 7], lambda n: 0.01, bound_gib=2.0)
    assert ok.failed == () and "failed" not in ok.describe()   # control

    def broken(n):
        raise RuntimeError("not a capture failure")           # anything else still propagates

    with pytest.raises(RuntimeError, match="not a capture failure"):
        plan_graph_widths([3], broken, bound_gib=2.0)
