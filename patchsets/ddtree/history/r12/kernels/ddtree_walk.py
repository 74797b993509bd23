"""DDTree's greedy walk (Triton, CUDA): the accepted path through a verified tree, one program
per request with the whole tree in registers — the CUDA version of ``ddtree_accept.greedy_accept``
(its torch path is the twin the CPU uses): 10-14x faster (25-32 us on the H200, bench/RESULTS.md).

Importing this module needs Triton; ``sglang/srt/speculative/ddtree_accept.py`` imports it lazily,
only for CUDA tensors (or when asked to). The kernel also runs under ``TRITON_INTERPRET=1`` on CPU
tensors (tests/unit/test_ddtree_kernels.py). Depends on torch and Triton alone: it takes the tree's
tensors and returns the walk's, which ``ddtree_accept`` wraps as an ``Acceptance``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = ["greedy_walk_triton"]


@triton.jit
def _greedy_walk_kernel(
    tokens_ptr,  # [bs, N1] int64
    parents_ptr,  # [bs, N1] int64
    valid_ptr,  # [bs, N1] int8
    target_ptr,  # [bs, N1] int64
    acc_idx_ptr,  # [bs, L+1] int64 out
    acc_len_ptr,  # [bs] int64 out
    bonus_ptr,  # [bs] int64 out
    N1: tl.constexpr,
    L: tl.constexpr,
    BLOCK: tl.constexpr,
):
    b = tl.program_id(0)
    base = b.to(tl.int64) * N1
    j = tl.arange(0, BLOCK)
    inb = j < N1
    tok = tl.load(tokens_ptr + base + j, mask=inb, other=-1)
    par = tl.load(parents_ptr + base + j, mask=inb, other=-2)
    val = (tl.load(valid_ptr + base + j, mask=inb, other=0) != 0) & inb
    cur = tl.zeros([], dtype=tl.int64)
    alive = tl.full([], 1, tl.int1)
    n_acc = tl.zeros([], dtype=tl.int64)
    tl.store(acc_idx_ptr + b * (L + 1), cur)
    for step in range(L):
        t = tl.load(target_ptr + base + cur)
        match = val & (par == cur) & (tok == t)
        nxt = tl.min(tl.where(match, j, BLOCK), axis=0).to(tl.int64)
        alive = alive & (nxt < BLOCK)
        cur = tl.where(alive, nxt, cur)
        n_acc += alive.to(tl.int64)
        tl.store(acc_idx_ptr + b * (L + 1) + step + 1, tl.where(alive, cur, -1))
    tl.store(acc_len_ptr + b, n_acc)
    tl.store(bonus_ptr + b, tl.load(target_ptr + base + cur))


def greedy_walk_triton(tokens: torch.Tensor, parents: torch.Tensor, valid: torch.Tensor, max_depth: int,
                       target_tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Triton twin of ``greedy_accept`` (one program per request, whole tree in registers).

    tokens / parents [bs, N1] int64, valid [bs, N1] bool and max_depth L: the tree's (a ``DDTree``'s
    fields); target_tokens [bs, N1]: the target's pick after each node. Returns accept_index
    [bs, L + 1], accept_length [bs] and bonus_token [bs] int64, ``Acceptance``'s fields in order.
    """
    bs, N1 = tokens.shape
    L = max_depth
    dev = tokens.device
    acc_idx = torch.empty((bs, L + 1), dtype=torch.int64, device=dev)
    acc_len = torch.empty((bs,), dtype=torch.int64, device=dev)
    bonus = torch.empty((bs,), dtype=torch.int64, device=dev)
    if bs > 0:
        BLOCK = max(16, triton.next_power_of_2(N1))
        _greedy_walk_kernel[(bs,)](
            tokens.contiguous(), parents.contiguous(),
            valid.contiguous().view(torch.int8),
            target_tokens.to(torch.int64).contiguous(),
            acc_idx, acc_len, bonus, N1, L=L, BLOCK=BLOCK,
            num_warps=4 if BLOCK <= 512 else 8,
        )
    return acc_idx, acc_len, bonus
