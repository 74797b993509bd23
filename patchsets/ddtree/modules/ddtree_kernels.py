"""Triton kernels for DDTree (CUDA); each has a torch twin that the CPU uses.

| kernel                    | torch twin                               | what it replaces               |
|---------------------------|------------------------------------------|--------------------------------|
| ``tree_arrays_triton``    | ``ddtree_tree.build_tree_arrays``        | ~3L + 10 small launches -> 1   |
| ``custom_mask_triton``    | torch path of ``build_custom_mask``      | index tensor of bs*N1*N1 int64 |
| ``greedy_walk_triton``    | torch path of ``ddtree_accept.greedy_accept`` | ~6L launches -> 1          |

Which path wins was measured on an H200 (bench/RESULTS.md); the callers pick Triton on CUDA by
default (``use_triton=None``). Importing this module needs Triton; the other DDTree modules
import it lazily and only for CUDA tensors. The kernels also run under ``TRITON_INTERPRET=1`` on
CPU tensors (that is how the unit tests check them where Triton is installed).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .ddtree_accept import Acceptance
from .ddtree_tree import DDTree

__all__ = ["tree_arrays_triton", "custom_mask_triton", "greedy_walk_triton"]


@triton.jit
def _tree_links_kernel(
    parents_ptr,  # [bs, N1] int64
    valid_ptr,  # [bs, N1] bool (as int8)
    ri_ptr,  # [bs, N1] int64 out
    rnt_ptr,  # [bs, N1] int64 out
    rns_ptr,  # [bs, N1] int64 out
    N1: tl.constexpr,
    BLOCK: tl.constexpr,
):
    b = tl.program_id(0)
    base = b.to(tl.int64) * N1
    # pass 1: retrieve_index, next sibling, and -1 into next_token
    for start in range(0, N1, BLOCK):
        j = start + tl.arange(0, BLOCK)
        inb = j < N1
        par = tl.load(parents_ptr + base + j, mask=inb, other=-1)
        val = tl.load(valid_ptr + base + j, mask=inb, other=0) != 0
        in2 = (j + 1) < N1
        par2 = tl.load(parents_ptr + base + j + 1, mask=in2, other=-2)
        val2 = tl.load(valid_ptr + base + j + 1, mask=in2, other=0) != 0
        same = val & val2 & (par2 == par) & (j > 0)
        tl.store(ri_ptr + base + j, base + j, mask=inb)
        tl.store(rns_ptr + base + j, tl.where(same, j + 1, -1).to(tl.int64), mask=inb)
        tl.store(rnt_ptr + base + j, tl.full([BLOCK], -1, tl.int64), mask=inb)
    tl.debug_barrier()
    # pass 2: first child of each parent (unique writer per parent)
    for start in range(0, N1, BLOCK):
        j = start + tl.arange(0, BLOCK)
        inb = j < N1
        par = tl.load(parents_ptr + base + j, mask=inb, other=-1)
        val = tl.load(valid_ptr + base + j, mask=inb, other=0) != 0
        inp = (j >= 1) & inb
        parp = tl.load(parents_ptr + base + j - 1, mask=inp, other=-3)
        first = val & (par >= 0) & (parp != par) & inb
        tl.store(rnt_ptr + base + tl.where(first, par, 0), j.to(tl.int64), mask=first)


@triton.jit
def _tree_mask_kernel(
    parents_ptr,  # [bs, N1] int64
    valid_ptr,  # [bs, N1] int8
    mask_ptr,  # [bs, N1, N1] bool (as int8) out
    N1: tl.constexpr,
    MAX_DEPTH: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    b = tl.program_id(0)
    rb = tl.program_id(1)
    base = b.to(tl.int64) * N1
    rows = rb * BLOCK_R + tl.arange(0, BLOCK_R)
    rin = rows < N1
    rval = tl.load(valid_ptr + base + rows, mask=rin, other=0) != 0
    for cstart in range(0, N1, BLOCK_C):
        cols = cstart + tl.arange(0, BLOCK_C)
        cin = cols < N1
        tile = (cols[None, :] == rows[:, None]) & rin[:, None]  # self (padding rows too)
        cur = rows.to(tl.int64)
        alive = rval & rin
        for _ in range(MAX_DEPTH):
            nxt = tl.load(parents_ptr + base + cur, mask=alive, other=-1)
            alive = alive & (nxt >= 0)
            cur = tl.where(alive, nxt, cur)
            tile = tile | ((cols[None, :] == cur[:, None]) & alive[:, None])
        ptrs = mask_ptr + (base + rows[:, None]) * N1 + cols[None, :]
        tl.store(ptrs, tile.to(tl.int8), mask=rin[:, None] & cin[None, :])


def tree_arrays_triton(parents: torch.Tensor, valid: torch.Tensor, max_depth: int):
    """Triton twin of ``ddtree_tree.build_tree_arrays`` (same arguments, same outputs)."""
    bs, N1 = parents.shape
    dev = parents.device
    parents = parents.contiguous()
    v8 = valid.contiguous().view(torch.int8)
    ri = torch.empty((bs, N1), dtype=torch.int64, device=dev)
    rnt = torch.empty_like(ri)
    rns = torch.empty_like(ri)
    mask = torch.empty((bs, N1, N1), dtype=torch.bool, device=dev)
    if bs == 0:
        return ri, rnt, rns, mask
    _tree_links_kernel[(bs,)](parents, v8, ri, rnt, rns, N1, BLOCK=256, num_warps=4)
    BLOCK_R = 16
    BLOCK_C = 128
    _tree_mask_kernel[(bs, triton.cdiv(N1, BLOCK_R))](
        parents, v8, mask.view(torch.int8), N1, MAX_DEPTH=max_depth,
        BLOCK_R=BLOCK_R, BLOCK_C=BLOCK_C, num_warps=4,
    )
    return ri, rnt, rns, mask


@triton.jit
def _custom_mask_kernel(
    tree_mask_ptr,  # [bs, N1, N1] int8
    prefix_ptr,  # [bs] int64
    start_ptr,  # [bs] int64 (mask_indptr[b])
    out_ptr,  # flat int8, prefix columns already True
    N1: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    b = tl.program_id(0)
    rb = tl.program_id(1)
    pl = tl.load(prefix_ptr + b)
    start = tl.load(start_ptr + b)
    rows = rb * BLOCK_R + tl.arange(0, BLOCK_R)
    rin = rows < N1
    row_base = start + rows.to(tl.int64) * (pl + N1) + pl
    for cstart in range(0, N1, BLOCK_C):
        cols = cstart + tl.arange(0, BLOCK_C)
        m = rin[:, None] & (cols < N1)[None, :]
        tv = tl.load(tree_mask_ptr + (b.to(tl.int64) * N1 + rows[:, None]) * N1 + cols[None, :], mask=m, other=0)
        tl.store(out_ptr + row_base[:, None] + cols[None, :], tv, mask=m)


def custom_mask_triton(tree_mask: torch.Tensor, prefix_lens: torch.Tensor, out: torch.Tensor) -> None:
    """Write SGLang's FULL_MASK custom_mask into ``out`` (flat bool); see ``build_custom_mask``.

    tree_mask: [bs, N1, N1] bool; prefix_lens: [bs] int64 (same device); out: 1-D bool, large
    enough. Fills ``out`` with True (the prefix columns), then one kernel copies each request's
    tree block into its rows. No host sync.
    """
    bs, N1, _ = tree_mask.shape
    if bs == 0:
        return
    pl = prefix_lens.to(torch.int64).contiguous()
    sizes = N1 * (pl + N1)
    start = torch.cumsum(sizes, 0) - sizes
    out.fill_(True)
    BLOCK_R, BLOCK_C = 8, 256
    _custom_mask_kernel[(bs, triton.cdiv(N1, BLOCK_R))](
        tree_mask.contiguous().view(torch.int8), pl, start, out.view(torch.int8), N1,
        BLOCK_R=BLOCK_R, BLOCK_C=BLOCK_C, num_warps=4,
    )


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


def greedy_walk_triton(tree: DDTree, target_tokens: torch.Tensor) -> Acceptance:
    """Triton twin of ``greedy_accept`` (one program per request, whole tree in registers)."""
    bs, N1 = tree.tokens.shape
    L = tree.max_depth
    dev = tree.tokens.device
    acc_idx = torch.empty((bs, L + 1), dtype=torch.int64, device=dev)
    acc_len = torch.empty((bs,), dtype=torch.int64, device=dev)
    bonus = torch.empty((bs,), dtype=torch.int64, device=dev)
    if bs > 0:
        BLOCK = triton.next_power_of_2(N1)
        _greedy_walk_kernel[(bs,)](
            tree.tokens.contiguous(), tree.parents.contiguous(),
            tree.valid.contiguous().view(torch.int8),
            target_tokens.to(torch.int64).contiguous(),
            acc_idx, acc_len, bonus, N1, L=L, BLOCK=BLOCK,
            num_warps=4 if BLOCK <= 512 else 8,
        )
    return Acceptance(acc_idx, acc_len, bonus)
