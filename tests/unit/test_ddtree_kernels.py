"""The Triton kernels equal their torch twins, run in Triton's CPU interpreter.

Skipped where Triton is not installed (CI's CPU torch has none); tests/gpu runs them compiled.
"""

from __future__ import annotations

import os

import pytest
import torch

pytest.importorskip("triton")
if os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("needs TRITON_INTERPRET=1 to run Triton kernels on CPU tensors", allow_module_level=True)

from patchsets.ddtree.modules import ddtree_kernels as K  # noqa: E402
from patchsets.ddtree.modules.ddtree_accept import greedy_accept  # noqa: E402
from patchsets.ddtree.modules.ddtree_tree import (  # noqa: E402
    build_custom_mask,
    build_ddtree,
    build_tree_arrays,
)


@pytest.mark.parametrize("seed", range(4))
def test_triton_kernels_equal_torch(seed):
    g = torch.Generator().manual_seed(seed)
    bs, L, V = 3, 1 + seed * 2, 16
    N = [5, 33, 64, 130][seed]
    x = torch.randn(bs, L, V, generator=g) * 2
    t = build_ddtree(x, torch.arange(bs), N, max(1, N // 4),
                     request_budget=torch.tensor([N, N // 2, 1]), use_triton=False)
    for u, v in zip(build_tree_arrays(t.parents, t.valid, L), K.tree_arrays_triton(t.parents, t.valid, L)):
        assert torch.equal(u, v)
    pl = torch.tensor([3, 0, 5])
    m1 = build_custom_mask(t, pl, use_triton=False)
    m2 = torch.zeros_like(m1)
    K.custom_mask_triton(t.tree_mask, pl, m2)
    assert torch.equal(m1, m2)
    follow = torch.gather(t.tokens, 1, t.retrieve_next_token.clamp(min=0))
    tgt = torch.where(torch.rand(bs, N + 1, generator=g) < 0.7, follow, torch.randint(0, V, (bs, N + 1), generator=g))
    a, b = greedy_accept(t, tgt, use_triton=False), K.greedy_walk_triton(t, tgt)
    assert torch.equal(a.accept_index, b.accept_index)
    assert torch.equal(a.accept_length, b.accept_length)
    assert torch.equal(a.bonus_token, b.bonus_token)
