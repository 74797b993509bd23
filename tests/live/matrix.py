"""The engine configurations of the live greedy tests (and of the negative controls' baselines).

Each fixture's arms run in one driver process: the target alone, DFLASH (the control) and DDTREE
at several budgets and top-k values, on the same phases (a few single requests, then a batch of
concurrent requests of different prompt lengths).
"""

from __future__ import annotations

from dataclasses import dataclass

from tests.support import live_sglang as ls
from tests.support.live_sglang import ModelFixture


@dataclass(frozen=True)
class Arm:
    """One engine configuration: ``algorithm`` None is the target alone."""

    name: str
    algorithm: str | None = None
    block: int = 4
    extra: tuple[tuple[str, object], ...] = ()
    sampled: bool = False          # also a batched phase at temperature > 0 ("sampled")
    ragged: bool = False           # also a batched phase of different lengths ("ragged"): the
                                   # running batch shrinks as requests finish


FIXED = (("speculative_ddtree_budget_schedule", "fixed"),)   # every step at the budget (unset: auto)

# block-4 draft of the trained fixture: budgets B - 1 and larger than the block, the non-overlap
# scheduler, a budget schedule, auto, chain steps; the block-8 draft: a budget of 3B with top-k
# below it. (Budget 1, a tree narrower than DFlash's block, is left to the unit and GPU tests of the
# tree and the walk: an engine here costs ~70 s of the CI's 2 cores.)
TRAINED_ARMS = (
    Arm("target", ragged=True),
    Arm("dflash-b4", "DFLASH", 4, sampled=True),
    Arm("ddtree-b4-n8", "DDTREE", 4, (("speculative_ddtree_budget", 8),) + FIXED, sampled=True),
    # B - 1 nodes (DFlash's verify width) under the non-overlap scheduler: one engine for both
    Arm("ddtree-b4-n3-nooverlap", "DDTREE", 4, (("speculative_ddtree_budget", 3),
                                                ("disable_overlap_schedule", True)) + FIXED),
    # budget by batch: 16 nodes alone, DFlash's own step (chain) at 2-3 requests, 8 nodes from 4.
    # The ragged phase's batch shrinks 5 -> 1, so its requests go tree -> chain -> tree.
    Arm("ddtree-b4-sched", "DDTREE", 4, (("speculative_ddtree_budget", 16),
                                         ("speculative_ddtree_budget_schedule", "1:16,2:chain,4:8")), ragged=True),
    # auto, the default from revision 13 (no schedule given): the worker's online planner picks
    # chain, 3, 7, 15 or 16 nodes per step as it measures; its exploration changes the width step
    # by step, and the ragged phase's batch shrinks 5 -> 1 (log level info: the test reads the
    # worker's "first step at batch ..." lines)
    Arm("ddtree-b4-auto", "DDTREE", 4, (("speculative_ddtree_budget", 16),
                                        ("log_level", "info")), ragged=True),
    # chain steps only: DFlash's own step inside the DDTREE worker (accept lengths equal DFLASH's)
    Arm("ddtree-b4-chain", "DDTREE", 4, (("speculative_ddtree_budget", 8),
                                         ("speculative_ddtree_budget_schedule", "1:chain"))),
    Arm("ddtree-b8-n24-k4", "DDTREE", 8, (("speculative_ddtree_budget", 24),
                                          ("speculative_ddtree_topk", 4)) + FIXED),
)
# random weights: output depends on attention and the KV cache; the draft is almost never right
# (DFLASH's chain is the trained fixture's control; here a tree of B - 1 nodes stands for it).
RANDOM_ARMS = (
    Arm("target"),
    Arm("ddtree-b4-n3", "DDTREE", 4, (("speculative_ddtree_budget", 3),) + FIXED),
    Arm("ddtree-b4-n32", "DDTREE", 4, (("speculative_ddtree_budget", 32),) + FIXED),
)
ARMS = {"trained": TRAINED_ARMS, "random": RANDOM_ARMS}
NEW_TOKENS = {"trained": 16, "random": 16}
SAMPLING = {"temperature": 1.0, "top_p": 0.95, "ignore_eos": True}


# 5 running requests, then 4 after 3 tokens, 3 after 5, 2 after 8, 1 after 11 (alone for 5 tokens)
RAGGED_LENGTHS = (16, 5, 11, 3, 8)


def phases(fx: ModelFixture, new_tokens: int, sampled: bool = False,
           ragged: bool = False) -> tuple[ls.Phase, ...]:
    """"single": the first two prompts one at a time; "batch": five prompts at once; with
    ``sampled``, "sampled": the five again at temperature 1 (top-p 0.95); with ``ragged``,
    "ragged": the five at once asking RAGGED_LENGTHS new tokens, so the batch shrinks 5 -> 1."""
    greedy = {"temperature": 0.0, "max_new_tokens": new_tokens, "ignore_eos": True}
    prompts = fx.prompts
    out = (ls.Phase("single", prompts[:2], greedy),
           ls.Phase("batch", prompts[:5], greedy, batch=True))
    if sampled:
        out += (ls.Phase("sampled", prompts[:5], dict(SAMPLING, max_new_tokens=new_tokens), batch=True),)
    if ragged:
        out += (ls.Phase("ragged", prompts[:5], [dict(greedy, max_new_tokens=n) for n in RAGGED_LENGTHS],
                         batch=True),)
    return out


def engine_spec(fx: ModelFixture, arm: Arm) -> ls.EngineSpec:
    if arm.algorithm is None:
        # The reference: the target alone through SGLang's torch-native attention, an attention
        # implementation independent of the triton kernels the speculative arms verify with (and
        # ~100x faster under the Triton interpreter). The fixtures' prompts keep every greedy token
        # >= 1e-2 in logit ahead of the next best, so float32 differences between backends cannot
        # flip a token (tiny_models.py checks the margins).
        kwargs = ls.cpu_engine_kwargs(fx.target, attention_backend="torch_native")
    else:
        kwargs = ls.speculative_kwargs(fx.target, fx.drafts[arm.block], arm.algorithm, **dict(arm.extra))
    return ls.EngineSpec(arm.name, kwargs, phases(fx, NEW_TOKENS[fx.name], arm.sampled, arm.ragged))
