"""DDTREE at temperature > 0 in the live engine: it runs, and what it returns is well-formed.

The sampled phase of the greedy matrix (``tests/live/matrix.py``: DFLASH and DDTREE budget 8 on the
trained fixture, five concurrent requests at temperature 1, top-p 0.95). Lossless sampling itself
is proven statistically on the tensor level (``tests/unit/test_ddtree_lossless.py``).
"""

from __future__ import annotations

import pytest

from tests.live import matrix


@pytest.mark.parametrize("arm", ["ddtree-b4-n8", "dflash-b4"])
def test_sampled_generation_is_well_formed(greedy_runs, live_models, arm: str) -> None:
    run = greedy_runs["trained"][arm]
    assert run.ok, run.error
    gens = run.phases["sampled"]
    vocab = int(live_models["trained"].info["tokenizer"]["vocab"])   # real ids; the config pads above
    n = matrix.NEW_TOKENS["trained"]
    for g in gens:
        assert len(g.output_ids) == n, g
        assert all(0 <= t < vocab for t in g.output_ids), g.output_ids
        assert g.meta.get("spec_verify_ct", 0) >= 1 and g.text, g.meta
    # temperature 1 over five prompts: not one fixed greedy answer each
    greedy = {g.prompt: g.output_ids for g in run.phases["batch"]}
    assert any(g.output_ids != greedy[g.prompt] for g in gens), "sampling returned the greedy tokens"
