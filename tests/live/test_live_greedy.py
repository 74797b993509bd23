"""DDTREE inside a live SGLang 0.5.23 engine gives the target's own greedy tokens.

For each tiny model fixture, one driver process runs the target alone, DFLASH (the control) and
DDTREE at several budgets and top-k values — single requests and a batch of concurrent requests of
different prompt lengths — on a venv that ``sglpatch apply ddtree`` patched. Every speculative run
must produce exactly the token ids of the target alone. SGLang's reported accept lengths are
collected for the session summary (``tests/live/conftest.py``), not asserted per prompt.
"""

from __future__ import annotations

import pytest

from tests.live.matrix import ARMS, NEW_TOKENS
from tests.support import live_sglang as ls


CASES = [(fx, arm.name) for fx, arms in ARMS.items() for arm in arms if arm.algorithm]


@pytest.mark.parametrize("fixture_name,arm", CASES, ids=[f"{f}-{a}" for f, a in CASES])
def test_speculative_tokens_equal_target_alone(greedy_runs, fixture_name: str, arm: str) -> None:
    by_arm = greedy_runs[fixture_name]
    base, run = by_arm["target"], by_arm[arm]
    assert base.ok, f"the target alone did not run: {base.error}\n{base.traceback}"
    assert run.ok, f"{arm} did not run: {run.error}\n{run.traceback}"
    problems = ls.token_mismatches(base, run, "single") + ls.token_mismatches(base, run, "batch")
    assert not problems, "\n".join(problems)
    # every request produced the full length and SGLang counted speculative steps
    for gens in (run.phases["single"], run.phases["batch"]):
        for g in gens:
            assert len(g.output_ids) == NEW_TOKENS[fixture_name], g
            assert g.meta.get("spec_verify_ct", 0) >= 1, g.meta


def test_budget_schedule_follows_the_shrinking_batch(greedy_runs) -> None:
    """Budget by batch (16 nodes alone, DFlash's own chain step at 2-3 requests, 8 nodes from 4):
    five requests of different lengths at once, so the running batch shrinks 5 -> 1 and each
    request's steps go tree -> chain -> tree; every token equals the target's."""
    base, run = greedy_runs["trained"]["target"], greedy_runs["trained"]["ddtree-b4-sched"]
    assert run.ok, f"{run.error}\n{run.log[-3000:]}"
    problems = ls.token_mismatches(base, run, "ragged")
    assert not problems, "\n".join(problems)
    got = [len(g.output_ids) for g in run.phases["ragged"]]
    from tests.live.matrix import RAGGED_LENGTHS
    assert got == list(RAGGED_LENGTHS), got


def test_auto_budget_changes_width_with_the_batch_and_keeps_the_tokens(greedy_runs) -> None:
    """``auto``, the default from revision 13 (the engine is started without
    ``--speculative-ddtree-budget-schedule``): the worker's planner chooses each step's
    budget (chain, 3, 7, 15 or 16 nodes) from its own step times and accept lengths. Single
    requests, five at once and the ragged five (the batch shrinks 5 -> 1) must give the target's
    tokens, while the worker's log shows it ran steps of several widths at several batch sizes,
    each tree width on the target backend built for it."""
    import re

    base, run = greedy_runs["trained"]["target"], greedy_runs["trained"]["ddtree-b4-auto"]
    assert run.ok, f"{run.error}\n{run.log[-3000:]}"
    problems = [p for ph in ("single", "batch", "ragged") for p in ls.token_mismatches(base, run, ph)]
    assert not problems, "\n".join(problems)
    tried = set(re.findall(r"DDTREE auto budget: first step at batch (\d+)-\d+ with "
                           r"(DFlash's chain|a tree of \d+ nodes)", run.log))
    widths = {w for _, w in tried}
    buckets = {b for b, _ in tried}
    assert "DFlash's chain" in widths and len(widths) >= 3, sorted(tried)
    assert {"1", "4"} <= buckets, sorted(tried)
    assert "budget_schedule=auto over chain,3,7,15,16 (unset: the default)" in run.log, run.log[-3000:]
    # revision 12: each narrower tree width verified on a target backend of its own, built for its
    # width through SGLang's scoped spec-config override (no CUDA graphs here: backends only)
    assert ("target verify states of their own for budgets [3: 4 tokens/request, eager, "
            "7: 8 tokens/request, eager, 15: 16 tokens/request, eager]") in run.log, run.log[-3000:]


def test_chain_steps_are_dflash_steps(greedy_runs) -> None:
    """A schedule of chain steps only ("1:chain") runs DFlash's own decode step inside the DDTREE
    worker: every request's accept length equals DFLASH's (same draft block, same causal verify),
    where a tree of the same server budget accepts more (the next test)."""
    r = greedy_runs["trained"]
    chain, dflash = r["ddtree-b4-chain"], r["dflash-b4"]
    assert chain.ok, f"{chain.error}\n{chain.log[-3000:]}"
    for ph in ("single", "batch"):
        got, want = chain.accept_lengths(ph), dflash.accept_lengths(ph)
        assert got and all(v is not None for v in got), got
        assert got == pytest.approx(want), (ph, got, want)


def test_trained_regime_trees_accept_more_than_the_chain(greedy_runs) -> None:
    """The trained fixture exists so that trees have something to find: at the same block,
    DDTREE with a budget above B - 1 commits more tokens per verify than DFLASH's chain."""
    r = greedy_runs["trained"]

    def mean_accept(name: str) -> float:
        vals = [v for ph in ("single", "batch") for v in r[name].accept_lengths(ph) if v]
        return sum(vals) / len(vals)

    chain, tree = mean_accept("dflash-b4"), mean_accept("ddtree-b4-n8")
    assert chain > 1.2, f"the trained fixture's draft should often be right (DFLASH accept {chain:.2f})"
    assert tree > chain, f"DDTREE budget 8 accept {tree:.2f} <= DFLASH {chain:.2f}"


def test_random_regime_draft_is_almost_never_right(greedy_runs) -> None:
    """The random fixture's draft is almost never right: a tree of B - 1 nodes (DFlash's verify
    width) commits about one token per verify, the bonus token."""
    vals = [v for ph in ("single", "batch") for v in greedy_runs["random"]["ddtree-b4-n3"].accept_lengths(ph) if v]
    assert vals and max(vals) < 1.5, vals
