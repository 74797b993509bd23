"""Triton kernels for DDTree (CUDA); each has a torch twin that the CPU uses.

| kernel                     | torch twin                                | H200 result (bench/RESULTS.md)      |
|----------------------------|-------------------------------------------|-------------------------------------|
| ``topk_radix_triton``      | ``torch.topk`` + lse + tie fix (bf16/fp16) | an option, slower than bound at     |
|                            | (3 passes over (row, program) grids, P    | every size: 46-54 us at bs 1, 1.54- |
|                            | programs per row looping over chunks)     | 1.62 ms at bs 64                    |
| ``topk_bound_triton``      | same; sub-block maxima bound the K-th     | default prep for bf16: 28-34 us at  |
|                            | value, only candidates sorted (one        | bs 1 (K <= 512), 49.5 at K 1024,    |
|                            | looping program redoes overflowing rows)  | 590-789 us at bs 64                 |
| ``lse_triton``             | ``torch.logsumexp(x.float())``            | "row" prep (one program per row)    |
| ``tie_fix_triton``         | full-vocabulary int32 ``where`` + topk    | "row" prep                          |
| ``prep_chunked_triton``    | (both of the above, (row, chunk) grid)    | "chunked": 2.3x "row" at bs 1       |
| ``beam_triton``            | ``ddtree_tree._beam_search`` (~10 ops/depth) | 24 us (N 16) .. 3.5 ms (N 1024)  |
| ``beam_select_triton``     | same; selection instead of sorts          | 209 us (N 256) .. 678 us (N 1024)   |
| ``beam_prune_triton``      | same; only candidates that can still be   | default: 18-56 us flat; peaked bs 1 |
|                            | in the global top-N (the heap's early     | N 512 / 1024: 94 / 250 us with the  |
|                            | stop), survivors merged, not re-sorted;   | survivors generated per parent (118 |
|                            | survivors generated per parent; more than | / 297 scanning the table in 32 bits,|
|                            | N of them: exact head bound, then a       | 125 / 348 in 64 bits); bench inputs |
|                            | selection among <= 2 NP generated lanes   | bs 1 N 512: 117.7 us (138.2 before) |
| ``label_count_triton``     | selection + labelling in ``build_ddtree_from_topk``, positions from per-parent counts, one program per (request, depth); ``links=True`` also writes the retrieve arrays | 9-26 us (was 13-47 with a per-depth loop); with links + ``tree_mask_triton`` 15.6 us against 16.1 for labels + ``tree_arrays_triton`` (bs 1 N 512) |
| ``tree_arrays_triton``     | ``ddtree_tree.build_tree_arrays``         | 10-68 us (was up to 1.2 ms)         |
| ``custom_mask_triton``     | torch path of ``build_custom_mask``       | 1.4-3.6x faster                     |
| ``greedy_walk_triton``     | torch path of ``ddtree_accept.greedy_accept`` | 10-14x faster (25-32 us)        |

The whole Triton tree path beats the torch path at every measured size up to N = 1024
(``ddtree_tree.prefer_triton``; ``prefer_prep`` / ``prefer_beam`` pick the variants). Importing this module needs Triton; the other DDTree
modules import it lazily and only for CUDA tensors (or when asked to). The kernels also run under
``TRITON_INTERPRET=1`` on CPU tensors, which is how tests/unit/test_ddtree_kernels.py checks them.
All loops have compile-time bounds (L, V, N1, T) so that the interpreter can run them.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .ddtree_accept import Acceptance
from .ddtree_tree import DDTree

__all__ = [
    "tree_arrays_triton",
    "tree_mask_triton",
    "custom_mask_triton",
    "greedy_walk_triton",
    "lse_triton",
    "tie_fix_triton",
    "prep_chunked_triton",
    "beam_triton",
    "beam_select_triton",
    "beam_prune_triton",
    "label_count_triton",
    "topk_radix_triton",
    "topk_bound_triton",
]


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
    """Rows [rb * BLOCK_R, ...) of request b: zero them, then set self and each ancestor (a
    scatter of <= MAX_DEPTH + 1 ones per row) — O(N1 * (N1 + depth)) per request, not
    O(N1 * N1 * depth)."""
    b = tl.program_id(0)
    rb = tl.program_id(1)
    base = b.to(tl.int64) * N1
    rows = rb * BLOCK_R + tl.arange(0, BLOCK_R)
    rin = rows < N1
    rval = tl.load(valid_ptr + base + rows, mask=rin, other=0) != 0
    row_ptr = mask_ptr + (base + rows.to(tl.int64)) * N1
    for cstart in range(0, N1, BLOCK_C):
        cols = cstart + tl.arange(0, BLOCK_C)
        tl.store(row_ptr[:, None] + cols[None, :], tl.zeros([BLOCK_R, BLOCK_C], tl.int8),
                 mask=rin[:, None] & (cols < N1)[None, :])
    tl.debug_barrier()
    one = tl.full([BLOCK_R], 1, tl.int8)
    tl.store(row_ptr + rows, one, mask=rin)  # self (padding rows too)
    cur = rows.to(tl.int64)
    alive = rval & rin
    for _ in range(MAX_DEPTH):
        nxt = tl.load(parents_ptr + base + cur, mask=alive, other=-1)
        alive = alive & (nxt >= 0)
        cur = tl.where(alive, nxt, cur)
        tl.store(row_ptr + cur, one, mask=alive)


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
    _tree_mask_into(parents, v8, mask, max_depth)
    return ri, rnt, rns, mask


def tree_mask_triton(parents: torch.Tensor, valid: torch.Tensor, max_depth: int) -> torch.Tensor:
    """The ancestor-or-self tree mask alone ([bs, N1, N1] bool; ``tree_arrays_triton``'s fourth
    output) from parents [bs, N1] int64 and valid [bs, N1] bool: one launch, for a builder whose
    labels already gave the retrieve arrays (``label_count_triton(..., links=True)``)."""
    bs, N1 = parents.shape
    mask = torch.empty((bs, N1, N1), dtype=torch.bool, device=parents.device)
    if bs:
        _tree_mask_into(parents.contiguous(), valid.contiguous().view(torch.int8), mask, max_depth)
    return mask


def _tree_mask_into(parents, v8, mask, max_depth: int) -> None:
    bs, N1 = parents.shape
    BLOCK_R = 32
    BLOCK_C = 256
    _tree_mask_kernel[(bs, triton.cdiv(N1, BLOCK_R))](
        parents, v8, mask.view(torch.int8), N1, MAX_DEPTH=max_depth,
        BLOCK_R=BLOCK_R, BLOCK_C=BLOCK_C, num_warps=4,
    )


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
        BLOCK = max(16, triton.next_power_of_2(N1))
        _greedy_walk_kernel[(bs,)](
            tree.tokens.contiguous(), tree.parents.contiguous(),
            tree.valid.contiguous().view(torch.int8),
            target_tokens.to(torch.int64).contiguous(),
            acc_idx, acc_len, bonus, N1, L=L, BLOCK=BLOCK,
            num_warps=4 if BLOCK <= 512 else 8,
        )
    return Acceptance(acc_idx, acc_len, bonus)


# ----------------------------------------------------------------------------------------------
# Tree construction kernels: log-sum-exp, exact top-K tie fix, fused beam, fused labelling.
# ----------------------------------------------------------------------------------------------

_SUB_BITS = tl.constexpr(30)
_MAXKEY = tl.constexpr(9223372036854775807)


@triton.jit
def _desc_key(s, v, sub):
    """Triton twin of ``ddtree_tree.desc_key`` (same bits)."""
    f = tl.where(s == 0.0, 0.0, s)
    bits = f.to(tl.int32, bitcast=True).to(tl.int64) & 4294967295
    asc = tl.where(bits >= 2147483648, 4294967295 - bits, bits + 2147483648)
    primary = (4294967295 - asc) + tl.where(v, 0, 4294967296)
    return (primary << 30) | sub.to(tl.int64)


@triton.jit
def _clean_lp(x):
    """Log-probs as the beams use them: NaN -> -inf (a row of NaN or all -inf logits has NaN
    lp: it drafts nothing) and > 0 -> 0, so a child never outranks its parent. The torch twin is
    ``ddtree_tree.clean_lp``."""
    return tl.where(x <= 0.0, x, tl.where(x > 0.0, 0.0, float("-inf")))


@triton.jit
def _lse_kernel(x_ptr, out_ptr, V: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    m = tl.full([BLOCK], float("-inf"), tl.float32)
    s = tl.zeros([BLOCK], tl.float32)
    for start in range(0, V, BLOCK):
        o = start + offs
        x = tl.load(x_ptr + row * V + o, mask=o < V, other=float("-inf")).to(tl.float32)
        m_new = tl.maximum(m, x)
        scale = tl.where(m_new == float("-inf"), 0.0, tl.exp(m - m_new))
        add = tl.where(x == float("-inf"), 0.0, tl.exp(x - m_new))
        s = s * scale + add
        m = m_new
    mx = tl.max(m, axis=0)
    tot = tl.sum(tl.where(m == float("-inf"), 0.0, s * tl.exp(m - mx)), axis=0)
    tl.store(out_ptr + row, mx + tl.log(tot))


def lse_triton(x: torch.Tensor) -> torch.Tensor:
    """log-sum-exp over the last dim in float32, one program per row. x: [R, V] -> [R] float32."""
    R, V = x.shape
    out = torch.empty(R, dtype=torch.float32, device=x.device)
    if R:
        _lse_kernel[(R,)](x.contiguous(), out, V=V, BLOCK=2048, num_warps=8)
    return out


@triton.jit
def _tie_fix_kernel(x_ptr, thr_ptr, ngt_ptr, ids_ptr, K, V: tl.constexpr, BLOCK: tl.constexpr):
    """ids[row, ngt + r] = id of the r-th element (in id order) equal to thr, for r < K - ngt."""
    row = tl.program_id(0).to(tl.int64)
    t = tl.load(thr_ptr + row)
    ngt = tl.load(ngt_ptr + row)
    need = K - ngt
    offs = tl.arange(0, BLOCK)
    run = tl.zeros([], tl.int64)
    for start in range(0, V, BLOCK):
        o = start + offs
        xv = tl.load(x_ptr + row * V + o, mask=o < V, other=0)
        eq = (xv == t) & (o < V)
        r = run + tl.cumsum(eq.to(tl.int64), axis=0) - 1
        sel = eq & (r < need)
        tl.store(ids_ptr + row * K + ngt + r, o.to(tl.int64), mask=sel)
        run += tl.sum(eq.to(tl.int64), axis=0)


def tie_fix_triton(x: torch.Tensor, vals: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Make top-K ids follow the tie rule at the boundary value (smallest ids among ties).

    x: [R, V] logits; vals/ids: [R, K] from ``torch.topk`` (sorted desc). Returns new ids
    [R, K] int64 whose tied-boundary slots hold the smallest tied ids (order inside equal-value
    runs is fixed afterwards by the caller).
    """
    R, V = x.shape
    K = vals.shape[1]
    thr = vals[:, K - 1].contiguous()
    ngt = (vals > thr[:, None]).sum(-1)
    out = ids.clone()
    if R:
        _tie_fix_kernel[(R,)](x.contiguous(), thr, ngt, out, K, V=V, BLOCK=2048, num_warps=8)
    return out


@triton.jit
def _beam_depth0(lp_b, score_ptr, valid_ptr, parent_ptr, rank_ptr, out_b, N, K, NP: tl.constexpr):
    """Depth 0 of every beam kernel: the first min(N, K) ranks of lp row 0, in rank order, written
    as beam entries (score, valid, parent -1, rank). Returns (score [NP] f32, valid [NP] bool)."""
    offs_n = tl.arange(0, NP)
    nm = offs_n < N
    v0 = offs_n < tl.minimum(N, K)
    s0 = _clean_lp(tl.load(lp_b + offs_n, mask=v0, other=float("-inf")))
    tl.store(score_ptr + out_b + offs_n, s0, mask=nm)
    tl.store(valid_ptr + out_b + offs_n, v0.to(tl.int8), mask=nm)
    tl.store(parent_ptr + out_b + offs_n, tl.full([NP], -1, tl.int64), mask=nm)
    tl.store(rank_ptr + out_b + offs_n, tl.minimum(offs_n, K - 1).to(tl.int64), mask=nm)
    tl.debug_barrier()  # depth 1 reads these rows back across lanes
    return s0, v0


@triton.jit
def _beam_kernel(
    lp_ptr,  # [bs, L, K] f32
    ci_ptr,  # [C] int64
    ck_ptr,  # [C] int64
    score_ptr,  # [bs, L, N] f32 out
    valid_ptr,  # [bs, L, N] int8 out
    parent_ptr,  # [bs, L, N] int64 out
    rank_ptr,  # [bs, L, N] int64 out
    gtop_ptr,  # [bs, N] int64 out: the N smallest global keys, ascending
    scratch_ptr,  # [bs, CP] int64
    scratch2_ptr,  # [bs, 2 * NP] int64
    K,
    N,
    C,
    L: tl.constexpr,
    NP: tl.constexpr,
    CP: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    offs_n = tl.arange(0, NP)
    nm = offs_n < N
    lp_b = lp_ptr + b * L * K
    out_b = b * L * N
    s0, v0 = _beam_depth0(lp_b, score_ptr, valid_ptr, parent_ptr, rank_ptr, out_b, N, K, NP)
    T = tl.where(nm, _desc_key(s0, v0, offs_n), _MAXKEY)
    tl.debug_barrier()
    offs_c = tl.arange(0, CP)
    cm = offs_c < C
    ci = tl.load(ci_ptr + offs_c, mask=cm, other=0)
    ck = tl.load(ck_ptr + offs_c, mask=cm, other=0)
    offs_2 = tl.arange(0, 2 * NP)
    for d in range(1, L):
        prev = out_b + (d - 1) * N
        ps = tl.load(score_ptr + prev + ci, mask=cm, other=float("-inf"))
        pv = tl.load(valid_ptr + prev + ci, mask=cm, other=0) != 0
        lpv = _clean_lp(tl.load(lp_b + d * K + ck, mask=cm, other=float("-inf")))
        s = ps + lpv
        key = tl.where(cm, _desc_key(s, pv & cm, offs_c), _MAXKEY)
        sk = tl.sort(key)
        tl.store(scratch_ptr + b * CP + offs_c, sk)
        tl.debug_barrier()
        top = tl.load(scratch_ptr + b * CP + offs_n, mask=nm, other=0)
        c = tl.where(nm, top & 1073741823, 0)
        pi = tl.load(ci_ptr + c)
        pk = tl.load(ck_ptr + c)
        sc = tl.load(score_ptr + prev + pi) + _clean_lp(tl.load(lp_b + d * K + pk))
        vc = (tl.load(valid_ptr + prev + pi) != 0) & nm
        cur = out_b + d * N
        tl.store(score_ptr + cur + offs_n, sc, mask=nm)
        tl.store(valid_ptr + cur + offs_n, vc.to(tl.int8), mask=nm)
        tl.store(parent_ptr + cur + offs_n, pi, mask=nm)
        tl.store(rank_ptr + cur + offs_n, pk, mask=nm)
        gd = tl.where(nm, _desc_key(sc, vc, d * N + offs_n), _MAXKEY)
        both = tl.reshape(tl.join(T, gd), [2 * NP])
        sb = tl.sort(both)
        tl.store(scratch2_ptr + b * 2 * NP + offs_2, sb)
        tl.debug_barrier()
        T = tl.load(scratch2_ptr + b * 2 * NP + offs_n)
        tl.debug_barrier()
    tl.store(gtop_ptr + b * N + offs_n, T, mask=nm)


def beam_triton(lp: torch.Tensor, budget: int, ci: torch.Tensor, ck: torch.Tensor):
    """Fused per-depth beam + running global top-N, one program per request.

    lp: [bs, L, K] float32; ci/ck: the static candidate table (``candidate_pairs``).
    Returns score [bs, L, N] f32, valid [bs, L, N] bool, parent/rank [bs, L, N] int64 (same as
    ``ddtree_tree._beam_search``) and gtop [bs, N] int64, the N smallest global keys ascending.
    """
    bs, L, K = lp.shape
    N = int(budget)
    C = ci.numel()
    dev = lp.device
    NP = max(16, triton.next_power_of_2(N))
    CP = max(NP, triton.next_power_of_2(C))
    score = torch.empty((bs, L, N), dtype=torch.float32, device=dev)
    valid = torch.empty((bs, L, N), dtype=torch.bool, device=dev)
    parent = torch.empty((bs, L, N), dtype=torch.int64, device=dev)
    rank = torch.empty((bs, L, N), dtype=torch.int64, device=dev)
    gtop = torch.empty((bs, N), dtype=torch.int64, device=dev)
    scratch = torch.empty((bs, CP), dtype=torch.int64, device=dev)
    scratch2 = torch.empty((bs, 2 * NP), dtype=torch.int64, device=dev)
    if bs:
        nw = 4 if CP <= 1024 else (8 if CP <= 4096 else 16)
        _beam_kernel[(bs,)](
            lp.contiguous(), ci, ck, score, valid.view(torch.int8), parent, rank, gtop,
            scratch, scratch2, K, N, C, L=L, NP=NP, CP=CP, num_warps=nw,
        )
    return score, valid, parent, rank, gtop


# ----------------------------------------------------------------------------------------------
# Chunk-parallel prep (log-sum-exp + tie fix over (row, chunk) programs). Not yet measured on the
# GPU: opt in with draft_topk(..., prep="chunked"); bench/tree_build.py times both.
# ----------------------------------------------------------------------------------------------


@triton.jit
def _chunk_lse_partials(x):
    """Log-sum-exp partials of one chunk (16/32-bit floats, -inf where masked): its float32
    maximum and the sum of exp(x - max) (0 for an all -inf chunk). Every chunked prep uses this
    one formula, so their lse values are bit-identical."""
    xf = x.to(tl.float32)
    cm = tl.max(xf, axis=0)
    e = tl.where(xf > float("-inf"), tl.exp(xf - cm), 0.0)
    cs = tl.where(cm > float("-inf"), tl.sum(e, axis=0), 0.0)
    return cm, cs


@triton.jit
def _lse_from_partials(pm_ptr, ps_ptr, row, NCH, NCHP: tl.constexpr):
    """The row's log-sum-exp (f32 scalar) from its NCH per-chunk partials ([R, NCH] f32)."""
    o = tl.arange(0, NCHP)
    om = o < NCH
    pm = tl.load(pm_ptr + row * NCH + o, mask=om, other=float("-inf"))
    ps = tl.load(ps_ptr + row * NCH + o, mask=om, other=0.0)
    M = tl.max(pm, axis=0)
    tot = tl.sum(tl.where(pm > float("-inf"), ps * tl.exp(pm - M), 0.0), axis=0)
    return M + tl.log(tot)


@triton.jit
def _packed_count4(c1, c2, c3, c4):
    """Four lane counts (bool tensors, each count < 2**16) in ONE int64 reduction, 16 bits apart."""
    return tl.sum(c1.to(tl.int64) + (c2.to(tl.int64) << 16) + (c3.to(tl.int64) << 32)
                  + (c4.to(tl.int64) << 48), axis=0)


@triton.jit
def _fields_at_least(c, n):
    """How many of the four 16-bit counts packed in c (``_packed_count4``) are >= n (int64)."""
    return ((((c & 65535) >= n).to(tl.int64) + (((c >> 16) & 65535) >= n).to(tl.int64))
            + ((((c >> 32) & 65535) >= n).to(tl.int64) + (((c >> 48) & 65535) >= n).to(tl.int64)))


@triton.jit
def _write_topk(x_ptr, lse_ptr, lp_ptr, ids_ptr, row, top, K, V: tl.constexpr, KP: tl.constexpr):
    """Write a row's top K from its first KP packed keys ``top`` (ascending; id in the low 32
    bits): ids [R, K] int64 and lp = min(x - lse, 0) [R, K] f32."""
    kk = tl.arange(0, KP)
    km = kk < K
    ids = tl.where(km, top & 4294967295, 0)
    xv = tl.load(x_ptr + row * V + ids, mask=km, other=0.0).to(tl.float32)
    lse = tl.load(lse_ptr + row)
    tl.store(lp_ptr + row * K + kk, tl.minimum(xv - lse, 0.0), mask=km)
    tl.store(ids_ptr + row * K + kk, ids, mask=km)


@triton.jit
def _prep_partial_kernel(x_ptr, thr_ptr, pm_ptr, ps_ptr, pc_ptr, NCH, V: tl.constexpr, CH: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    ch = tl.program_id(1)
    offs = ch * CH + tl.arange(0, CH)
    m = offs < V
    x = tl.load(x_ptr + row * V + offs, mask=m, other=float("-inf"))
    cm, cs = _chunk_lse_partials(x)
    t = tl.load(thr_ptr + row)
    ceq = tl.sum(((x == t) & m).to(tl.int64), axis=0)
    tl.store(pm_ptr + row * NCH + ch, cm)
    tl.store(ps_ptr + row * NCH + ch, cs)
    tl.store(pc_ptr + row * NCH + ch, ceq)


@triton.jit
def _prep_combine_kernel(pm_ptr, ps_ptr, pc_ptr, lse_ptr, pstart_ptr, NCH, NCHP: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    tl.store(lse_ptr + row, _lse_from_partials(pm_ptr, ps_ptr, row, NCH, NCHP))
    o = tl.arange(0, NCHP)
    om = o < NCH
    pc = tl.load(pc_ptr + row * NCH + o, mask=om, other=0)
    tl.store(pstart_ptr + row * NCH + o, tl.cumsum(pc, axis=0) - pc, mask=om)


@triton.jit
def _tie_write_kernel(x_ptr, thr_ptr, ngt_ptr, pstart_ptr, pc_ptr, ids_ptr, K, NCH,
                      V: tl.constexpr, CH: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    ch = tl.program_id(1)
    ngt = tl.load(ngt_ptr + row)
    need = K - ngt
    start = tl.load(pstart_ptr + row * NCH + ch)
    cnt = tl.load(pc_ptr + row * NCH + ch)
    work = (cnt > 0) & (start < need)  # chunks with no needed tie load nothing
    offs = ch * CH + tl.arange(0, CH)
    # explicit broadcast: Triton 3.9's interpreter rejects a (vector & scalar) load mask
    m = (offs < V) & (tl.full([CH], 1, tl.int1) & work)
    x = tl.load(x_ptr + row * V + offs, mask=m, other=0)
    t = tl.load(thr_ptr + row)
    eq = (x == t) & m
    r = start + tl.cumsum(eq.to(tl.int64), axis=0) - 1
    sel = eq & (r < need)
    tl.store(ids_ptr + row * K + ngt + r, offs.to(tl.int64), mask=sel)


def prep_chunked_triton(x: torch.Tensor, vals: torch.Tensor, ids: torch.Tensor, exact_ties: bool,
                        chunk: int = 4096):
    """lse [R] float32 and tie-fixed ids [R, K] in 3 launches over (row, chunk) programs.

    x: [R, V] logits; vals/ids: [R, K] from ``torch.topk`` (sorted desc). Same results as
    ``lse_triton`` (up to float32 rounding) and ``tie_fix_triton`` (exactly).
    """
    R, V = x.shape
    K = vals.shape[1]
    dev = x.device
    NCH = triton.cdiv(V, chunk)
    x = x.contiguous()
    thr = vals[:, K - 1].contiguous()
    pm = torch.empty((R, NCH), dtype=torch.float32, device=dev)
    ps = torch.empty_like(pm)
    pc = torch.empty((R, NCH), dtype=torch.int64, device=dev)
    pstart = torch.empty_like(pc)
    lse = torch.empty((R,), dtype=torch.float32, device=dev)
    out = ids.clone()
    if R == 0:
        return lse, out
    _prep_partial_kernel[(R, NCH)](x, thr, pm, ps, pc, NCH, V=V, CH=chunk, num_warps=8)
    _prep_combine_kernel[(R,)](pm, ps, pc, lse, pstart, NCH,
                               NCHP=max(16, triton.next_power_of_2(NCH)), num_warps=1)
    if exact_ties:
        ngt = (vals > thr[:, None]).sum(-1)
        _tie_write_kernel[(R, NCH)](x, thr, ngt, pstart, pc, out, K, NCH, V=V, CH=chunk, num_warps=8)
    return lse, out


# ----------------------------------------------------------------------------------------------
# Selection instead of sorting (build_ddtree(..., beam="select")). Per depth the beam is
# the N smallest of ~N H(N) packed keys; instead of a full tl.sort of all of them, a 5-ary search
# on the keys' 33-bit primary (score bits + invalid flag) finds the primary P of the N-th smallest
# key, ties at P go to the smallest sub (= lane index, a cumsum), the N survivors are compacted
# and only they are sorted. The global order (running merge sort per depth before) is one such
# selection over all L * N beam keys at the end. Labels: the selected nodes of one depth form a
# down-set of the (parent order, rank) grid, so a node's position inside its depth is
# (#selected nodes with a smaller parent order) + its rank: counts, no sort.
# ----------------------------------------------------------------------------------------------


@triton.jit
def _select_smallest(key, hi0, N, scr_ptr, NP: tl.constexpr, ROUNDS: tl.constexpr):
    """The N smallest of ``key`` ([X] int64, distinct, low 30 bits = sub ascending with the lane
    index; unused lanes _MAXKEY; X < 2**16), sorted ascending in an [NP] tensor (lanes >= N:
    _MAXKEY).

    hi0: a primary (key >> 30) that at least N keys do not exceed. scr_ptr: NP int64 scratch.
    Five-way search for the primary P of the N-th smallest key: per round the counts below four
    thresholds are packed 16 bits apart into one int64 and summed in ONE reduction. Exact: the
    invariant is count(prim <= lo - 1) < N <= count(prim <= hi); 15 rounds cover 2**34, and the
    search stops as soon as lo == hi (a fixed point of the round).
    """
    prim = key >> 30
    lo = tl.min(prim, axis=0)
    hi = hi0
    rnd = tl.zeros([], tl.int32)
    while (rnd < ROUNDS) & (lo < hi):  # lo == hi is a fixed point: stop there
        step = (hi - lo) // 5 + 1
        cnt = _packed_count4(prim <= lo + step - 1, prim <= lo + 2 * step - 1,
                             prim <= lo + 3 * step - 1, prim <= lo + 4 * step - 1)
        j = 4 - _fields_at_least(cnt, N)  # thresholds whose count is still below N
        nlo = lo + j * step
        hi = tl.minimum(nlo + step - 1, hi)
        lo = nlo
        rnd += 1
    lt = prim < lo
    n_lt = tl.sum(lt.to(tl.int32), axis=0)
    eq = prim == lo
    eqr = tl.cumsum(eq.to(tl.int32), axis=0)
    sel = lt | (eq & (eqr <= N - n_lt))
    pos = tl.cumsum(sel.to(tl.int32), axis=0) - 1
    tl.store(scr_ptr + tl.where(sel, pos, 0), key, mask=sel)
    tl.debug_barrier()
    offs = tl.arange(0, NP)
    top = tl.load(scr_ptr + offs, mask=offs < N, other=_MAXKEY)
    tl.debug_barrier()
    return tl.sort(top)


@triton.jit
def _beam_select_kernel(
    lp_ptr,  # [bs, L, K] f32
    ci_ptr,  # [C] int64
    ck_ptr,  # [C] int64
    score_ptr,  # [bs, L, N] f32 out
    valid_ptr,  # [bs, L, N] int8 out
    parent_ptr,  # [bs, L, N] int64 out
    rank_ptr,  # [bs, L, N] int64 out
    gtop_ptr,  # [bs, N] int64 out: the N smallest global keys, ascending
    gkey_ptr,  # [bs, L * N] int64 scratch: every beam entry's global key
    scr_ptr,  # [bs, NP] int64 scratch
    K,
    N,
    C,
    L: tl.constexpr,
    NP: tl.constexpr,
    CP: tl.constexpr,
    GP: tl.constexpr,
    ROUNDS: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    offs_n = tl.arange(0, NP)
    nm = offs_n < N
    lp_b = lp_ptr + b * L * K
    out_b = b * L * N
    scr = scr_ptr + b * NP
    s0, v0 = _beam_depth0(lp_b, score_ptr, valid_ptr, parent_ptr, rank_ptr, out_b, N, K, NP)
    tl.store(gkey_ptr + out_b + offs_n, _desc_key(s0, v0, offs_n), mask=nm)
    tl.debug_barrier()
    offs_c = tl.arange(0, CP)
    cm = offs_c < C
    ci = tl.load(ci_ptr + offs_c, mask=cm, other=0)
    ck = tl.load(ck_ptr + offs_c, mask=cm, other=0)
    head = cm & (ck == 0)  # the N rank-0 children: at least N keys <= their max
    for d in range(1, L):
        prev = out_b + (d - 1) * N
        ps = tl.load(score_ptr + prev + ci, mask=cm, other=float("-inf"))
        pv = tl.load(valid_ptr + prev + ci, mask=cm, other=0) != 0
        lpv = _clean_lp(tl.load(lp_b + d * K + ck, mask=cm, other=float("-inf")))
        s = ps + lpv
        key = tl.where(cm, _desc_key(s, pv & cm, offs_c), _MAXKEY)
        hi0 = tl.max(tl.where(head, key >> 30, 0), axis=0)
        top = _select_smallest(key, hi0, N, scr, NP, ROUNDS)
        c = tl.where(nm, top & 1073741823, 0)
        pi = tl.load(ci_ptr + c)
        pk = tl.load(ck_ptr + c)
        sc = tl.load(score_ptr + prev + pi) + _clean_lp(tl.load(lp_b + d * K + pk))
        vc = (tl.load(valid_ptr + prev + pi) != 0) & nm
        cur = out_b + d * N
        tl.store(score_ptr + cur + offs_n, sc, mask=nm)
        tl.store(valid_ptr + cur + offs_n, vc.to(tl.int8), mask=nm)
        tl.store(parent_ptr + cur + offs_n, pi, mask=nm)
        tl.store(rank_ptr + cur + offs_n, pk, mask=nm)
        tl.store(gkey_ptr + cur + offs_n, _desc_key(sc, vc, d * N + offs_n), mask=nm)
        tl.debug_barrier()
    offs_g = tl.arange(0, GP)
    gm = offs_g < L * N
    g = tl.load(gkey_ptr + out_b + offs_g, mask=gm, other=_MAXKEY)
    ghi = tl.max(tl.where(gm, g >> 30, 0), axis=0)
    T = _select_smallest(g, ghi, N, scr, NP, ROUNDS)
    tl.store(gtop_ptr + b * N + offs_n, T, mask=nm)


def beam_select_triton(lp: torch.Tensor, budget: int, ci: torch.Tensor, ck: torch.Tensor):
    """``beam_triton`` with selection instead of full sorts; same arguments, identical outputs
    (score, valid, parent, rank [bs, L, N]; gtop [bs, N], the N smallest global keys ascending)."""
    bs, L, K = lp.shape
    N = int(budget)
    C = ci.numel()
    dev = lp.device
    NP = max(16, triton.next_power_of_2(N))
    CP = max(NP, triton.next_power_of_2(C))
    GP = max(16, triton.next_power_of_2(L * N))
    score = torch.empty((bs, L, N), dtype=torch.float32, device=dev)
    valid = torch.empty((bs, L, N), dtype=torch.bool, device=dev)
    parent = torch.empty((bs, L, N), dtype=torch.int64, device=dev)
    rank = torch.empty((bs, L, N), dtype=torch.int64, device=dev)
    gtop = torch.empty((bs, N), dtype=torch.int64, device=dev)
    gkey = torch.empty((bs, L * N), dtype=torch.int64, device=dev)
    scr = torch.empty((bs, NP), dtype=torch.int64, device=dev)
    if bs and max(CP, GP) > 32768:  # packed 16-bit counts: fall back to the sorting kernel
        return beam_triton(lp, budget, ci, ck)
    if bs:
        nw = 4 if max(CP, GP) <= 1024 else (8 if max(CP, GP) <= 4096 else 16)
        _beam_select_kernel[(bs,)](
            lp.contiguous(), ci, ck, score, valid.view(torch.int8), parent, rank, gtop, gkey, scr,
            K, N, C, L=L, NP=NP, CP=CP, GP=GP, ROUNDS=15, num_warps=nw,
        )
    return score, valid, parent, rank, gtop


# ----------------------------------------------------------------------------------------------
# Pruned beam (build_ddtree(..., beam="prune")): the best-first heap stops after N pops, so a
# node whose global key comes after the N-th smallest key found so far (tau) can never be in the
# tree, and neither can any of its descendants (a child's score is <= its parent's, and a deeper
# node loses ties). Per depth only the candidates with key < tau stay alive; tau is kept exact
# as the N-th smallest of the running global top-N (A, sorted) and the new beam, so the beam of
# a depth holds only its nodes that are still in the global top-N (a prefix of the full beam),
# and A is the final global order (gtop) without a last selection. A depth whose beam is empty
# ends the tree: later depths cost one scalar test. Candidate keys carry sub = d * N + i * K + r
# (after every key of earlier depths; (i, r) = (parent order, rank) ascending, the candidate
# table's order, so ties break as in the other beams); a surviving candidate's parent and rank
# come back from its sub with no table lookup (its score is re-added from the parent's score and
# lp: the key folds -0.0 into +0.0). A beam entry's key is then rewritten to sub = d * N + its
# beam position, as the other beams do.
# The new survivors are merged into A without sorting the union: they are compacted, sorted at
# the smallest of three tiers that holds them (64 / 256 / NP lanes; typically a few dozen to a
# few hundred survive a depth), and min(A[j], survivors descending) followed by one bitonic merge
# (log2 NP stages) gives the new A. On the H200 that took the peaked bs 1 N 512 beam from 165 to
# 114 us (N 1024: 529 to 325 us) against sorting the 2 NP union at every depth.
# Finding the survivors: testing every candidate-table entry (~N ln N lanes in one program) is
# instruction-bound, so it runs in 32 bits (tau decoded once into (score, packed (i, r))); by
# default a depth instead counts each parent's survivors, a prefix of its ranks, by binary
# lifting over the lp row and generates them straight into the sort tier (no table pass, no
# compaction); a depth with more than N survivors scans the table (the tighter _head_tau bound,
# then the sort tiers or a selection).
# ----------------------------------------------------------------------------------------------


@triton.jit
def _xor_combine(a, b):
    return a ^ b


@triton.jit
def _bitonic_merge_asc(x, LOG: tl.constexpr):
    """Sort a bitonic [2**LOG] int64 (non-decreasing, then non-increasing) ascending: LOG
    compare-exchange stages, strides 2**(LOG-1) .. 1 (Batcher's bitonic merge). On the [2]*LOG
    hypercube the partner across axis a is x ^ (xor of the pair); the lower lane keeps the min."""
    h = tl.reshape(x, [2] * LOG)
    for a in tl.static_range(LOG):
        y = h ^ tl.reduce(h, a, _xor_combine, keep_dims=True)
        upper = tl.reshape(tl.arange(0, 2), [1] * a + [2] + [1] * (LOG - 1 - a)) == 1
        h = tl.where(upper, tl.maximum(h, y), tl.minimum(h, y))
    return tl.reshape(h, [2**LOG])


@triton.jit
def _merge_top(A, top_desc, NP: tl.constexpr, S: tl.constexpr, LOGNP: tl.constexpr):
    """The NP smallest of A ([NP] int64 ascending) and top_desc ([S] int64 descending, S | NP,
    padded with _MAXKEY), ascending. min(A[j], B[NP-1-j]) of two ascending lists holds the NP
    smallest of their union as a bitonic sequence; B's padding to NP lanes is _MAXKEY, so only
    A's last S lanes take part in the min. Then one bitonic merge (LOGNP stages)."""
    if S == NP:
        C = tl.minimum(A, top_desc)
    else:
        R: tl.constexpr = NP // S
        A2 = tl.reshape(A, [R, S])
        last = (tl.arange(0, R) == R - 1)[:, None]
        tail = tl.min(tl.where(last, A2, _MAXKEY), axis=0)
        C = tl.reshape(tl.where(last, tl.minimum(tail, top_desc)[None, :], A2), [NP])
    return _bitonic_merge_asc(C, LOGNP)


@triton.jit
def _merge_keys(A, key, m, NP: tl.constexpr, S: tl.constexpr, LOGNP: tl.constexpr):
    """``_merge_top`` of A with the keys of the lanes m of ``key`` ([S] int64): sorted descending
    (_MAXKEY outside m); with S > NP (S a multiple of NP) only their NP smallest are merged.
    (A merge by slots — each key's rank in the other list by binary search, one scatter — was
    0.95x of this on the H200 at peaked bs 1 N 512 and bs 64 N 256: bench/RESULTS.md, eighth
    session.)"""
    top = tl.sort(tl.where(m, key, _MAXKEY), descending=True)
    if S > NP:  # more survivors than lanes: their NP smallest, the last NP of the sorted S
        R: tl.constexpr = S // NP
        last = (tl.arange(0, R) == R - 1)[:, None]
        out = _merge_top(A, tl.sum(tl.where(last, tl.reshape(top, [R, NP]), 0), axis=0), NP, NP, LOGNP)
    else:
        out = _merge_top(A, top, NP, S, LOGNP)
    return out


@triton.jit
def _stored_keys(ss, su, n, base, S: tl.constexpr):
    """Keys ([S] int64) of the n (<= S) survivors compacted at ss / su[0 .. n) (score f32, packed
    (i, r) int32; sub = base + packed), and the lane mask."""
    o = tl.arange(0, S)
    m = o < n
    return _desc_key(tl.load(ss + o, mask=m, other=0.0), m, base + tl.load(su + o, mask=m, other=0)), m


@triton.jit
def _merge_survivors(A, ss, su, n, base, NP: tl.constexpr, S: tl.constexpr, LOGNP: tl.constexpr):
    """``_merge_keys`` of A with the n (<= S) survivors compacted at ss / su (``_stored_keys``)."""
    key, m = _stored_keys(ss, su, n, base, S)
    return _merge_keys(A, key, m, NP, S, LOGNP)


@triton.jit
def _score_of_key(key):
    """The float32 score of a valid ``_desc_key`` (its primary inverted; -0.0 comes back as +0.0)."""
    asc = 4294967295 - (key >> 30)
    bits = tl.where(asc >= 2147483648, asc - 2147483648, 4294967295 - asc)
    return bits.to(tl.int32).to(tl.float32, bitcast=True)


@triton.jit
def _threshold(t, base):
    """A key t as the 32-bit survival test's threshold (score f32, packed tie-break int32):
    candidates of this depth (sub = base + packed) beat t when score > ts | (score == ts &
    packed < tsub). An invalid t (fewer than N valid keys so far) gives (-inf, int32 max), which
    every valid candidate beats."""
    t_inv = (t >> 30) >= 4294967296
    ts = tl.where(t_inv, float("-inf"), _score_of_key(tl.minimum(t, 4294967295 << 30)))
    return ts, tl.where(t_inv, 2147483647, (t & 1073741823).to(tl.int32) - base)


@triton.jit
def _head_tau(A, score_prev, lp_row, m_prev, N, base, T1, NP: tl.constexpr, LOGNP: tl.constexpr,
              LOGKP: tl.constexpr):
    """A tighter exact bound when more than N candidates beat tau: the N-th smallest key T of
    A and the heads, the rank-0 children (i, 0) of the first min(m_prev, NP) parents. The heads
    are candidates and their keys ascend with i (parent score non-increasing, sub ascending), so
    one ``_merge_top`` finds T, and the final N-th smallest key of A and all candidates is <= T:
    only candidates with key <= T can enter (or <= T1, the chain bound, when smaller). Returns
    ``_threshold`` of min(T, T1), for the test
    (score > ts) | (score == ts & cs <= tsub)."""
    o = tl.arange(0, NP)
    hv = o < m_prev
    hs = tl.load(score_prev + o, mask=hv, other=float("-inf")) + _clean_lp(tl.load(lp_row))
    head = tl.where(hv, _desc_key(hs, hv, base + (o << LOGKP)), _MAXKEY)
    T = _merge_top(tl.where(o < N, A, _MAXKEY), tl.flip(head, 0), NP, NP, LOGNP)
    return _threshold(tl.minimum(tl.max(tl.where(o < N, T, 0), axis=0), T1), base)  # T[N - 1]


@triton.jit
def _ranks_at_least(R, row, base, t, live, K, LOGKP: tl.constexpr):
    """Per lane, how many ranks r < K of the non-increasing lp row at ``row`` give
    base + lp[r] >= t (0 where not ``live``): binary lifting, LOGKP + 1 dependent loads. R: int32
    zeros of the result's shape; row (pointers), base (f32), t (f32) and live (bool) broadcast
    to it. The additions are the beams' own (parent score + lp)."""
    for s in tl.static_range(LOGKP + 1):
        nxt = R + (1 << (LOGKP - s))
        ok = (nxt <= K) & live
        x = base + _clean_lp(tl.load(row + nxt - 1, mask=ok, other=0.0))
        R = tl.where(ok & (x >= t), nxt, R)
    return R


@triton.jit
def _chain_score(lp_b, N, K, L: tl.constexpr, DP: tl.constexpr, J: tl.constexpr, LOGKP: tl.constexpr):
    """A lower bound on the tree's N-th score from cheap prefixes (f32 scalar; -inf: none).

    The chain prefixes — rank 0 at depths 1 .. d-1, then any rank r < K at depth d — are L * K
    distinct prefixes of the candidate universe with scores P[d] + lp_d[r] (P[d]: the rank-0
    chain's score, the beams' float32 additions in their order), so if at least N of them score
    >= t, the N-th smallest key of the tree is <= (t, the largest sub): a candidate scoring < t
    can never enter it. Two rounds of a J-way search over t in [max(lp_1[0] - 64, lp_1[N - 1]),
    lp_1[0]] (the count at every t checked exactly by ``_ranks_at_least``) find such a t within
    (span / J^2) of the largest. On peaked logits the running top-N of the first depths is far
    looser (the bench's bs 1 N 512 input: 1,319 / 947 survivors at depths 2 / 3 without it,
    144 / 249 with it)."""
    dd = tl.arange(0, DP)
    P = tl.zeros([DP], tl.float32)
    p = tl.zeros([], tl.float32)
    for d in tl.static_range(L):
        P = tl.where(dd == d, p, P)
        p = p + _clean_lp(tl.load(lp_b + d * K))
    rows = lp_b + dd[:, None] * K
    Pd = P[:, None]
    dv = (dd < L)[:, None]
    hi = _clean_lp(tl.load(lp_b))
    lo = hi - 64.0
    if N <= K:
        lo = tl.maximum(lo, _clean_lp(tl.load(lp_b + N - 1)))
    jj = tl.arange(0, J)
    best = tl.full([], float("-inf"), tl.float32)
    if hi > float("-inf"):
        for _ in tl.static_range(2):
            step = (hi - lo) / J
            t = lo + step * jj.to(tl.float32)
            cnt = _ranks_at_least(tl.zeros([DP, J], tl.int32), rows, Pd, t[None, :], dv, K, LOGKP)
            ok = tl.sum(cnt, axis=0) >= N
            jb = tl.max(tl.where(ok, jj, -1), axis=0)
            best = tl.where(jb >= 0, tl.maximum(best, lo + step * jb.to(tl.float32)), best)
            lo = tl.where(jb >= 0, lo + step * jb.to(tl.float32), lo)
            hi = lo + step
    return best


@triton.jit
def _bound_key(t):
    """The key that a score bound t (f32 scalar: at least N prefixes score >= t) puts on the
    tree: (t, the largest sub), so that a candidate scoring t still survives; -inf: _MAXKEY."""
    key = _desc_key(t, t > float("-inf"), tl.zeros([], tl.int64) + 1073741823)
    return tl.where(t > float("-inf"), key, _MAXKEY)


@triton.jit
def _tight_bound_kernel(lp_ptr, tval_ptr, fs_ptr, own_ptr, N, K, L: tl.constexpr, DP: tl.constexpr,
                        J: tl.constexpr, NP: tl.constexpr, LOGKP: tl.constexpr):
    """Grid (bs, J). Program (b, j) tests t_j = t1 + (lp_1[0] - t1) * j / J (t1: ``_chain_score``)
    by generating the prefixes scoring >= t_j depth by depth — each frontier node's children are
    a prefix of its ranks (binary lifting), no sorting — and stops once N are found: then
    tval [bs, J] f32 gets t_j, else -inf (also for every j when there is no chain bound). The
    largest t_j written is a lower bound on the tree's N-th score within (lp_1[0] - t1) / J.
    Scratch: fs [bs, J, NP] f32 frontier scores, own [bs, J, NP] int32 block starts."""
    b = tl.program_id(0).to(tl.int64)
    j = tl.program_id(1)
    lp_b = lp_ptr + b * L * K
    t1 = _chain_score(lp_b, N, K, L, DP, 32, LOGKP)
    hi = _clean_lp(tl.load(lp_b))
    t = t1 + (hi - t1) * (j.to(tl.float32) / J)
    o = tl.arange(0, NP)
    fs = fs_ptr + (b * J + j) * NP
    own = own_ptr + (b * J + j) * NP
    tl.store(own + o, tl.zeros([NP], tl.int32))
    tl.store(fs + o, tl.zeros([NP], tl.float32))  # the root: score 0, one node
    tl.debug_barrier()
    found = t1 > float("-inf")  # j = 0 tests t1 itself: N chain prefixes score >= t1
    if (j > 0) & found:
        tot = tl.zeros([], tl.int32)
        m = tl.zeros([], tl.int32) + 1  # the frontier: the root (score 0) at depth 0
        d = tl.zeros([], tl.int32)
        while (d < L) & (m > 0) & (tot < N):
            s = tl.load(fs + o, mask=o < m, other=0.0)
            # children of frontier node i scoring >= t: its ranks < R_i
            R = _ranks_at_least(tl.zeros([NP], tl.int32), lp_b + d * K, s, t, o < m, K, LOGKP)
            n = tl.sum(R, axis=0)
            tot += n
            if (tot < N) & (n > 0):  # n < N <= NP: generate them as the next frontier
                _mark_blocks(own, R, d + 1, o)
                gp, gr, sn, gm = _generated_children(own, fs, lp_b + d * K, n, NP)
                tl.debug_barrier()
                tl.store(fs + o, sn, mask=gm)
                tl.debug_barrier()
            m = n
            d += 1
        found = tot >= N
    tl.store(tval_ptr + b * J + j, tl.where(found, t, float("-inf")))


@triton.jit
def _max_combine(a, b):
    return tl.maximum(a, b)


@triton.jit
def _beats(x, pk, ts, tsub, teq):
    """The survival test of a depth's candidates against the threshold (ts, tsub): score x
    (f32) above ts, or equal to it with packed (i, r) pk below tsub — or equal to teq (the head
    bound, whose key may be a candidate's; -1: none)."""
    return (x > ts) | ((x == ts) & ((pk < tsub) | (pk == teq)))


@triton.jit
def _survivor_ranks(score_prev, lp_row, cap, m_prev, ts, tsub, teq, NP: tl.constexpr, LOGKP: tl.constexpr):
    """Per parent order i < m_prev ([NP] int32): R_i, how many of its table ranks r < cap_i beat
    the threshold (ts, tsub) as (score desc, packed (i, r) asc); teq = tsub: a candidate equal
    to it survives too (the head bound, whose key may be a candidate's), -1: not. With lp row d
    non-increasing a child's key grows with r, so they are the ranks r < R_i: found by binary
    lifting over r (LOGKP + 1 dependent loads of the lp row) instead of testing every table
    entry. The score is the same float32 addition as the table scan's. (Measured on the H200,
    bench/RESULTS.md, eighth session: 2**b - 1 independent probes per level lost at every size.)"""
    o = tl.arange(0, NP)
    hv = o < m_prev
    s = tl.load(score_prev + o, mask=hv, other=float("-inf"))
    c = tl.where(hv, cap, 0)
    R = tl.zeros([NP], tl.int32)
    for t in tl.static_range(LOGKP + 1):
        nxt = R + (1 << (LOGKP - t))
        ok = nxt <= c
        x = s + _clean_lp(tl.load(lp_row + nxt - 1, mask=ok, other=0.0))
        R = tl.where(ok & _beats(x, (o << LOGKP) | (nxt - 1), ts, tsub, teq), nxt, R)
    return R


@triton.jit
def _mark_blocks(own, R, tag, o):
    """Lay out R[i] ([NP] int32) consecutive slots per parent i = o, in parent order, and mark
    each non-empty block's start in own with (tag << 26 | start << 13 | i) for
    ``_generated_children``; tag (1 .. 31) must grow from one use of own to the next, so that
    older marks lose the running max (starts and parents < 2**13). Ends with a barrier."""
    start = tl.cumsum(R, axis=0) - R
    tl.store(own + tl.where(R > 0, start, 0), (tag << 26) | (start << 13) | o, mask=R > 0)
    tl.debug_barrier()


@triton.jit
def _generated_children(own, score_prev, lp_row, n, S: tl.constexpr):
    """The n (<= S) slots laid out by ``_mark_blocks``: slot j belongs to the parent p whose
    block starts last at or before j (a running max over the marks) and is its rank r = j - start;
    its score is score_prev[p] + lp_row[r] (the beams' addition). Returns (p, r int32, score f32,
    lane mask), [S] each."""
    o = tl.arange(0, S)
    m = o < n
    v = tl.associative_scan(tl.load(own + o, mask=m, other=0), 0, _max_combine)
    p = v & 8191
    r = o - ((v >> 13) & 8191)
    sc = tl.load(score_prev + p, mask=m, other=0.0) + _clean_lp(tl.load(lp_row + r, mask=m, other=0.0))
    return p, r, sc, m


@triton.jit
def _generated_keys(own, score_prev, lp_row, n, base, S: tl.constexpr, LOGKP: tl.constexpr):
    """Keys ([S] int64, _MAXKEY from lane n on) of the n (<= S) generated survivors
    (``_generated_children``), as the table scan builds them; they ascend with the slot among
    equal scores (parent, then rank). Returns (key, lane mask)."""
    p, r, sc, m = _generated_children(own, score_prev, lp_row, n, S)
    return tl.where(m, _desc_key(sc, m, base + ((p << LOGKP) | r)), _MAXKEY), m


@triton.jit
def _merge_tier(A, gen, own, score_prev, lp_row, ss, su, n, base, NP: tl.constexpr, S: tl.constexpr,
                LOGNP: tl.constexpr, LOGKP: tl.constexpr, GEN: tl.constexpr):
    """``_merge_keys`` of A with a depth's n (<= S) survivors at tier S: generated per parent
    (gen 1: ``_generated_keys``) or compacted at ss / su (``_merge_survivors``). One call site
    per tier for both ways keeps one sort network per tier in the kernel: the compiler's time
    (TritonGPUCoalesce, ~90 % of it) grows faster than the kernel's size."""
    if GEN:
        if gen == 1:
            key, m = _generated_keys(own, score_prev, lp_row, n, base, S, LOGKP)
        else:
            key, m = _stored_keys(ss, su, n, base, S)
    else:
        key, m = _stored_keys(ss, su, n, base, S)
    return _merge_keys(A, key, m, NP, S, LOGNP)


@triton.jit
def _beam_prune_kernel(
    lp_ptr,  # [bs, L, K] f32
    ci_ptr,  # [C] int64
    ck_ptr,  # [C] int64
    score_ptr,  # [bs, L, N] f32 out
    valid_ptr,  # [bs, L, N] int8 out
    parent_ptr,  # [bs, L, N] int64 out
    rank_ptr,  # [bs, L, N] int64 out
    gtop_ptr,  # [bs, N] int64 out: the N smallest global keys, ascending
    scr_ptr,  # [bs, NP] int64 scratch
    ss_ptr,  # [bs, S4] f32 scratch: compacted survivor scores
    su_ptr,  # [bs, S4] int32 scratch: compacted survivor subs
    own_ptr,  # [bs, W] int32 scratch: generated survivors' (depth, start, parent) at block starts
    tval_ptr,  # [bs, JT] f32: _tight_bound_kernel's proven thresholds (read when BOUND == 2)
    K,
    N,
    C,
    L: tl.constexpr,
    NP: tl.constexpr,
    CP: tl.constexpr,
    ROUNDS: tl.constexpr,
    S1: tl.constexpr,
    S2: tl.constexpr,
    S3: tl.constexpr,
    S4: tl.constexpr,
    LOGNP: tl.constexpr,
    LOGKP: tl.constexpr,
    GEN: tl.constexpr,
    W: tl.constexpr,
    BOUND: tl.constexpr,
    DP: tl.constexpr,
    JT: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    offs_n = tl.arange(0, NP)
    nm = offs_n < N
    lp_b = lp_ptr + b * L * K
    out_b = b * L * N
    scr = scr_ptr + b * NP
    ss = ss_ptr + b * S4
    su = su_ptr + b * S4
    s0, v0 = _beam_depth0(lp_b, score_ptr, valid_ptr, parent_ptr, rank_ptr, out_b, N, K, NP)
    A = tl.where(nm, _desc_key(s0, v0, offs_n), _MAXKEY)  # ascending: depth 0 is in rank order
    m_prev = tl.minimum(N, K)
    T1 = tl.zeros([], tl.int64) + _MAXKEY  # the score bound's key (_MAXKEY: none)
    if BOUND == 1:  # the chain bound
        T1 = _bound_key(_chain_score(lp_b, N, K, L, DP, 32, LOGKP))
    if BOUND == 2:  # the largest threshold that _tight_bound_kernel proved
        T1 = _bound_key(tl.max(tl.load(tval_ptr + b * JT + tl.arange(0, JT)), axis=0))
    offs_c = tl.arange(0, CP)
    cm = offs_c < C
    if GEN:
        cap = tl.where(nm, tl.minimum(K, N // (offs_n + 1)), 0)  # the table's ranks of parent order i
        ow = tl.arange(0, W)
        tl.store(own_ptr + b * W + ow, tl.zeros([W], tl.int32))  # older than any depth tag
        tl.debug_barrier()
    for d in range(1, L):
        prev = out_b + (d - 1) * N
        cur = out_b + d * N
        m_d = m_prev * 0
        if m_prev > 0:
            # key(score, sub = d * N + packed (i, r)) < tau = A[N - 1], tested in 32 bits
            ts, tsub = _threshold(tl.minimum(tl.max(tl.where(nm, A, 0), axis=0), T1), d * N)
            A2 = A
            n_new = m_prev * 0
            done = m_prev * 0
            teq = m_prev * 0 - 1  # tsub once the threshold is the head bound (a candidate may equal it)
            merged = m_prev * 0  # 1: a selection found this depth's N smallest survivors (top)
            top = tl.full([NP], _MAXKEY, tl.int64)
            if GEN:  # parent i's survivors are its ranks r < R_i (lp rows non-increasing)
                R = _survivor_ranks(score_ptr + prev, lp_b + d * K, cap, m_prev, ts, tsub, teq, NP, LOGKP)
                n_gen = tl.sum(R, axis=0)
                fits = n_gen <= N
                if W > NP:  # too many: tighten tau exactly (_head_tau), count again, select in W lanes
                    if n_gen > N:
                        ts, tsub = _head_tau(A, score_ptr + prev, lp_b + d * K, m_prev, N, d * N, T1, NP, LOGNP,
                                             LOGKP)
                        teq = tsub
                        R = _survivor_ranks(score_ptr + prev, lp_b + d * K, cap, m_prev, ts, tsub, teq, NP,
                                            LOGKP)
                        n_gen = tl.sum(R, axis=0)
                    fits = n_gen <= W
                if fits:
                    done = 1 + done
                    n_new = n_gen
                    if n_gen > 0:
                        _mark_blocks(own_ptr + b * W, R, d, offs_n)
                        if W > NP:
                            if n_gen > NP:  # the N smallest of the W generated keys (a selection), merged
                                key, mg = _generated_keys(own_ptr + b * W, score_ptr + prev, lp_b + d * K,
                                                          n_gen, d * N, W, LOGKP)
                                hi0 = tl.max(tl.where(mg, key >> 30, 0), axis=0)
                                top = _select_smallest(key, hi0, N, scr, NP, ROUNDS)
                                merged = 1 + merged
            if done == 0:  # scan the candidate table: (i, r) packed as i * 2**LOGKP + r in int32
                ci = tl.where(cm, tl.load(ci_ptr + offs_c, mask=cm, other=0).to(tl.int32), 2147483647)
                cs = (ci << LOGKP) | tl.load(ck_ptr + offs_c, mask=cm, other=0).to(tl.int32)
                pv = ci < m_prev  # the beam of depth d-1 is its first m_prev entries
                ps = tl.load(score_ptr + prev + ci, mask=pv, other=float("-inf"))
                cr = cs & ((1 << LOGKP) - 1)
                sc = ps + _clean_lp(tl.load(lp_b + d * K + cr, mask=pv, other=float("-inf")))
                alive = pv & _beats(sc, cs, ts, tsub, teq)
                n_alive = tl.sum(alive.to(tl.int32), axis=0)
                if n_alive > N:  # tau is loose (typically depth 1): tighten it, exactly, see _head_tau
                    ts, tsub = _head_tau(A, score_ptr + prev, lp_b + d * K, m_prev, N, d * N, T1, NP, LOGNP,
                                         LOGKP)
                    alive = alive & _beats(sc, cs, ts, tsub, tsub)  # a candidate equal to the bound survives
                    n_alive = tl.sum(alive.to(tl.int32), axis=0)
                n_new = n_alive
                if n_alive > S4:  # rare: select the N smallest among all lanes
                    key = _desc_key(sc, alive, d * N + cs)
                    hi0 = tl.max(tl.where(alive, key >> 30, 0), axis=0)
                    top = _select_smallest(tl.where(alive, key, _MAXKEY), hi0, N, scr, NP, ROUNDS)
                    merged = 1 + merged
                elif n_alive > 0:  # compact the survivors for the tiers below
                    pos = tl.where(alive, tl.cumsum(alive.to(tl.int32), axis=0) - 1, 0)
                    tl.store(ss + pos, sc, mask=alive)
                    tl.store(su + pos, cs, mask=alive)
                    tl.debug_barrier()
            if merged == 1:  # one merge for either selection (generated W lanes, or all table lanes)
                A2 = _merge_top(A, tl.flip(top, 0), NP, NP, LOGNP)
                tl.debug_barrier()
            if (n_new > 0) & (merged == 0):
                # one sort + merge per tier, whichever way the survivors were found (generated: done
                # 1, n_new <= NP; compacted from the table: n_new <= S4): the smallest tier holding them
                own = own_ptr + b * W
                if n_new <= S1:
                    A2 = _merge_tier(A, done, own, score_ptr + prev, lp_b + d * K, ss, su, n_new, d * N,
                                     NP, S1, LOGNP, LOGKP, GEN)
                elif n_new <= S2:
                    A2 = _merge_tier(A, done, own, score_ptr + prev, lp_b + d * K, ss, su, n_new, d * N,
                                     NP, S2, LOGNP, LOGKP, GEN)
                else:
                    if S4 == NP:  # no wide tiers compiled (their code slows every depth)
                        A2 = _merge_tier(A, done, own, score_ptr + prev, lp_b + d * K, ss, su, n_new, d * N,
                                         NP, NP, LOGNP, LOGKP, GEN)
                    else:
                        if n_new <= NP:
                            A2 = _merge_tier(A, done, own, score_ptr + prev, lp_b + d * K, ss, su, n_new,
                                             d * N, NP, NP, LOGNP, LOGKP, GEN)
                        elif n_new <= S3:  # only compacted survivors come here (generated ones > NP
                            A2 = _merge_survivors(A, ss, su, n_new, d * N, NP, S3, LOGNP)  # were selected)
                        else:
                            A2 = _merge_survivors(A, ss, su, n_new, d * N, NP, S4, LOGNP)
                tl.debug_barrier()
            if n_new > 0:
                sub = (A2 & 1073741823).to(tl.int32)
                isb = nm & (A2 != _MAXKEY) & (sub >= d * N)
                posb = tl.cumsum(isb.to(tl.int32), axis=0) - 1
                m_d = tl.sum(isb.to(tl.int32), axis=0)
                c = tl.where(isb, sub - d * N, 0)
                pi = c >> LOGKP
                pk = c & ((1 << LOGKP) - 1)
                sb = (tl.load(score_ptr + prev + pi, mask=isb, other=0.0)  # the key's addition, so
                      + _clean_lp(tl.load(lp_b + d * K + pk, mask=isb, other=0.0)))  # -0.0 too
                dst = cur + tl.where(isb, posb, 0)
                tl.store(score_ptr + dst, sb, mask=isb)
                tl.store(parent_ptr + dst, pi.to(tl.int64), mask=isb)
                tl.store(rank_ptr + dst, pk.to(tl.int64), mask=isb)
                A = tl.where(isb, ((A2 >> 30) << 30) | (d * N + posb), A2)
        rest = nm & (offs_n >= m_d)
        tl.store(score_ptr + cur + offs_n, tl.full([NP], float("-inf"), tl.float32), mask=rest)
        tl.store(parent_ptr + cur + offs_n, tl.full([NP], -1, tl.int64), mask=rest)
        tl.store(rank_ptr + cur + offs_n, tl.zeros([NP], tl.int64), mask=rest)
        tl.store(valid_ptr + cur + offs_n, (offs_n < m_d).to(tl.int8), mask=nm)
        m_prev = m_d
        tl.debug_barrier()
    tl.store(gtop_ptr + b * N + offs_n, A, mask=nm)


# Argument types of ``_beam_prune_kernel`` as ``beam_prune_triton`` launches it, for compiling it
# ahead of time (``triton.compile(ASTSource(..., signature=..., constexprs=...))``).
BEAM_PRUNE_SIGNATURE = dict(
    lp_ptr="*fp32", ci_ptr="*i64", ck_ptr="*i64", score_ptr="*fp32", valid_ptr="*i8", parent_ptr="*i64",
    rank_ptr="*i64", gtop_ptr="*i64", scr_ptr="*i64", ss_ptr="*fp32", su_ptr="*i32", own_ptr="*i32",
    tval_ptr="*fp32", K="i32", N="i32", C="i32",
    **{c: "constexpr" for c in ("L", "NP", "CP", "ROUNDS", "S1", "S2", "S3", "S4", "LOGNP", "LOGKP", "GEN",
                                "W", "BOUND", "DP", "JT")})


def beam_prune_constexprs(L: int, K: int, budget: int, C: int, *, tiers: tuple = (64, 256),
                          wide: tuple | None = None, gen: bool = True, gen_wide: int = 2,
                          bound: str = "chain", programs: int = 1,
                          num_warps: int | None = None) -> tuple[dict, int] | None:
    """The constexprs and warps ``beam_prune_triton`` launches ``_beam_prune_kernel`` with.

    L: depths; K: per-depth top-k; budget: N; C: candidate-table entries (``candidate_pairs``);
    programs: the tight bound's thresholds per request (JT; 1 for the other bounds); the rest as
    in ``beam_prune_triton``. Returns (constexprs, num_warps), or None when the shape exceeds the
    kernel's packed counts (more than 32,768 candidate lanes or 2^30 keys): ``beam_prune_triton``
    then runs ``beam_triton``. Raises ValueError as ``beam_prune_triton`` documents.
    """
    N = int(budget)
    NP = max(16, triton.next_power_of_2(N))
    CP = max(NP, triton.next_power_of_2(C))
    if wide is None:  # measured on the H200 (bench/RESULTS.md, fourth session)
        wide = (2, 4) if NP <= 64 else (1, 1)
    w3, w4 = (int(w) for w in wide)
    if min(w3, w4) < 1 or w3 & (w3 - 1) or w4 & (w4 - 1):
        raise ValueError(f"wide must be two powers of 2, got {wide}")
    gw = int(gen_wide)
    if gw < 1 or gw & (gw - 1):
        raise ValueError(f"gen_wide must be a power of 2, got {gen_wide}")
    t1, t2 = (int(t) for t in tiers)
    if min(t1, t2) < 1 or t1 & (t1 - 1) or t2 & (t2 - 1):
        raise ValueError(f"tiers must be two powers of 2, got {tiers}")
    t1, t2 = min(t1, t2), max(t1, t2)
    if bound not in ("none", "chain", "tight"):
        raise ValueError(f"bound must be 'none', 'chain' or 'tight', got {bound!r}")
    if num_warps is not None and num_warps not in (1, 2, 4, 8, 16, 32):
        raise ValueError(f"num_warps must be a power of 2 in 1 .. 32, got {num_warps}")
    KP = triton.next_power_of_2(max(K, 1))
    if CP > 32768 or (L - 1) * N + N * KP >= (1 << 30):  # 16-bit counts / 30-bit subs
        return None
    GEN = bool(gen) and L <= 31 and NP <= 8192
    BOUND = {"none": 0, "chain": 1, "tight": 2}[bound]
    if BOUND == 2 and (L > 31 or NP > 8192):  # the threshold kernel's 13-bit block starts
        BOUND = 1
    consts = dict(L=L, NP=NP, CP=CP, ROUNDS=15, S1=min(t1, NP), S2=min(t2, NP),
                  S3=min(min(w3, w4) * NP, CP), S4=min(max(w3, w4) * NP, CP),
                  LOGNP=NP.bit_length() - 1, LOGKP=KP.bit_length() - 1, GEN=GEN,
                  W=gw * NP if GEN and gw * NP <= 8192 else NP,  # 13-bit block starts in own
                  BOUND=BOUND, DP=max(2, triton.next_power_of_2(L)), JT=int(programs) if BOUND == 2 else 1)
    return consts, num_warps or (4 if CP <= 1024 else (8 if CP <= 4096 else 16))


def beam_prune_triton(lp: torch.Tensor, budget: int, ci: torch.Tensor, ck: torch.Tensor,
                      tiers: tuple = (64, 256), wide: tuple | None = None, gen: bool = True,
                      gen_wide: int = 2, bound: str = "chain", tight_programs: int | None = None,
                      num_warps: int | None = None):
    """Pruned beam: per depth only the candidates that can still be in the global top-N.

    lp: [bs, L, K] float32 log-probs (non-increasing along K); ci/ck: ``candidate_pairs``.
    Returns score [bs, L, N] f32, valid [bs, L, N] bool, parent/rank [bs, L, N] int64 and gtop
    [bs, N] int64 (the N smallest global keys ascending). Each depth's beam is the prefix of
    ``beam_triton``'s beam that is still in the global top-N (its first valid entries, equal
    there bit for bit; the rest is invalid: score -inf, parent -1, rank 0); the valid keys of
    gtop equal ``beam_triton``'s, so ``label_count_triton`` builds the identical tree. Work per
    depth follows the number of surviving candidates; a depth with none ends the loop's work.
    tiers: two powers of 2, the lane counts at which a depth's survivors are sorted before the
    bitonic merge (the smallest that holds them; more than the larger: NP lanes). wide: two
    powers of 2, the wider sorted tiers as multiples of NP (capped at the candidate lanes), for
    depths with more than NP survivors, of which the NP smallest are merged; a depth with more
    survivors than the widest tier selects its N smallest among all lanes instead (15 rounds of
    counting). Default: (2, 4) at NP <= 64, else (1, 1) (no wide tiers): on the H200 wide sorts
    of 1024-4096 int64 lanes cost more than the selection, and their code alone slowed every
    depth by ~1.5 us at N 512. Survivors beyond N first face a tighter exact bound
    (``_head_tau``). gen (default True): find each depth's survivors per parent — with lp rows
    non-increasing, parent i's survivors are its ranks r < R_i, R_i by binary lifting over the
    lp row (``_survivor_ranks``) — and generate them in their sort tier (``_merge_tier``)
    instead of testing every candidate-table entry. gen_wide (a power of 2, default 2; 1: off):
    a depth with more than N generated survivors first tightens tau (``_head_tau``) and counts
    again; if at most W = gen_wide * NP (<= 8192) survive, they are generated in W lanes and
    their N smallest selected there; more (or gen_wide 1) scan the table and select among all of
    its lanes. Any choice gives the same outputs (the tests pass small ones to reach every
    branch at small N). bound: a lower bound on the tree's N-th score that tau is never looser
    than — "chain" (default; ``_chain_score``: from the prefixes that leave the rank-0 chain once,
    found before depth 1; on the H200 it took the peaked bs 1 N 512 beam from 117.5 to 87.7 us),
    "tight" (one more launch first, ``tight_bound_triton``: tight_programs thresholds between the
    chain bound and lp_1[0] tested in parallel, within ~1 % of the tree's size on peaked logits,
    yet slower on the H200: 130.3 us against 87.0 at peaked bs 1 N 512, 47.8 of them its own
    launch — with near-ideal survivors a depth still costs its fixed N-wide work) or "none". A
    depth's beam may then be a shorter prefix (entries the bound proves outside the tree are left
    out); gtop and so the tree are the same. num_warps: the kernel's warps (None: 4 up to 1,024
    candidate lanes, 8 up to 4,096, else 16, chosen when every depth scanned the table; an
    override to measure others). gen_wide 1 against 2 on the H200 (bench/RESULTS.md, eighth
    session): equal at peaked bs 1 N 512, 1.04x faster at normal bs 1 N 512, 0.98x / 0.96x at peaked
    N 1024 / bs 64 N 256 — 2 stays, though 1 compiles ~30 s faster. Raises ValueError when a
    tier, a wide factor or gen_wide is not a power of 2, for another bound or for num_warps not a
    power of 2 in 1 .. 32.
    """
    bs, L, K = lp.shape
    N = int(budget)
    C = ci.numel()
    dev = lp.device
    cfg = beam_prune_constexprs(L, K, N, C, tiers=tiers, wide=wide, gen=gen, gen_wide=gen_wide, bound=bound,
                                num_warps=num_warps)
    if bs and cfg is None:
        return beam_triton(lp, budget, ci, ck)
    consts, nw = cfg if cfg is not None else ({"NP": 16, "S4": 16, "W": 16, "BOUND": 0}, 4)
    NP = consts["NP"]
    score = torch.empty((bs, L, N), dtype=torch.float32, device=dev)
    valid = torch.empty((bs, L, N), dtype=torch.bool, device=dev)
    parent = torch.empty((bs, L, N), dtype=torch.int64, device=dev)
    rank = torch.empty((bs, L, N), dtype=torch.int64, device=dev)
    gtop = torch.empty((bs, N), dtype=torch.int64, device=dev)
    scr = torch.empty((bs, NP), dtype=torch.int64, device=dev)
    ss = torch.empty((bs, consts["S4"]), dtype=torch.float32, device=dev)
    su = torch.empty((bs, consts["S4"]), dtype=torch.int32, device=dev)
    own = torch.empty((bs, consts["W"]), dtype=torch.int32, device=dev)
    tval = (tight_bound_triton(lp, N, tight_programs) if consts["BOUND"] == 2 and bs  # else never read:
            else torch.empty((1, 1), dtype=torch.float32, device=dev))                 # no fill launch
    if bs:
        _beam_prune_kernel[(bs,)](
            lp.contiguous(), ci, ck, score, valid.view(torch.int8), parent, rank, gtop, scr, ss, su, own,
            tval, K, N, C, **{**consts, "JT": tval.shape[1]}, num_warps=nw,
        )
    return score, valid, parent, rank, gtop


def tight_bound_triton(lp: torch.Tensor, budget: int, programs: int | None = None) -> torch.Tensor:
    """Thresholds proven to lie below the tree's N-th score (``_tight_bound_kernel``).

    lp: [bs, L, K] float32 log-probs (non-increasing along K); budget: N (<= 8192, L <= 31).
    programs: J thresholds per request, one program each (None: max(8, min(128, 1024 // bs)));
    t_j = t1 + (lp_1[0] - t1) * j / J from the chain bound t1 up. Returns tval [bs, J] float32:
    t_j where at least N prefixes (each token within its depth's top K) score >= t_j, else -inf;
    its row maximum is the bound ``beam_prune_triton(bound="tight")`` starts tau at. No host sync.
    H200, peaked bs 1 N 512, J 128: 47.8 us (bench/RESULTS.md, sixth session). Raises ValueError
    for programs < 1, N > 8192 or L > 31 (the 13-bit block starts and 5-bit depth tags).
    """
    bs, L, K = lp.shape
    N = int(budget)
    J = max(8, min(128, 1024 // max(bs, 1))) if programs is None else int(programs)
    if J < 1:
        raise ValueError(f"programs must be >= 1, got {programs}")
    NP = max(16, triton.next_power_of_2(N))
    if NP > 8192 or L > 31:
        raise ValueError(f"tight_bound_triton needs N <= 8192 and L <= 31, got N = {N}, L = {L}")
    KP = triton.next_power_of_2(max(K, 1))
    dev = lp.device
    tval = torch.empty((bs, J), dtype=torch.float32, device=dev)
    if bs:
        fs = torch.empty((bs, J, NP), dtype=torch.float32, device=dev)
        own = torch.empty((bs, J, NP), dtype=torch.int32, device=dev)
        _tight_bound_kernel[(bs, J)](lp.contiguous(), tval, fs, own, N, K, L=L,
                                     DP=max(2, triton.next_power_of_2(L)), J=J, NP=NP,
                                     LOGKP=KP.bit_length() - 1, num_warps=4)
    return tval


@triton.jit
def _depth_slots(parent_ptr, rank_ptr, base, m, cnt, offs, NP: tl.constexpr):
    """Slots inside one depth of its first m beam entries (the selected nodes: a prefix of the
    beam): #(selected nodes of that depth with a smaller parent order) + rank, from per-parent
    counts (cnt: NP int32 scratch of this program). Returns [NP] int64 slots, parents, ranks and
    whether the next slot holds a sibling (same parent)."""
    pm = offs < m
    par = tl.maximum(tl.load(parent_ptr + base + offs, mask=pm, other=0), 0)
    rk = tl.load(rank_ptr + base + offs, mask=pm, other=0)
    c = _parent_counts(par, pm, cnt, offs, NP)
    tl.store(cnt + offs, tl.cumsum(c, axis=0))  # inclusive: the end of each parent's block
    tl.debug_barrier()
    end = tl.load(cnt + par, mask=pm, other=0).to(tl.int64)
    slot = tl.load(cnt + par - 1, mask=pm & (par > 0), other=0).to(tl.int64) + rk
    tl.debug_barrier()
    return slot, par, rk, slot + 1 < end


@triton.jit
def _parent_counts(par, pm, cnt, offs, NP: tl.constexpr):
    """[NP] int32: how many of the lanes pm have parent order i, at lane i (atomics into the
    NP int32 scratch cnt of this program)."""
    tl.store(cnt + offs, tl.zeros([NP], tl.int32))
    tl.debug_barrier()
    tl.atomic_add(cnt + par, tl.full([NP], 1, tl.int32), mask=pm)
    tl.debug_barrier()
    c = tl.load(cnt + offs)
    tl.debug_barrier()
    return c


@triton.jit
def _label_depth_kernel(
    gtop_ptr,  # [bs, N] int64
    nb_ptr,  # [bs] int64 per-request budget (clamped to [0, N])
    root_ptr,  # [bs] int64
    ids_ptr,  # [bs, L, K] int64
    score_ptr,  # [bs, L, N] f32
    parent_ptr,  # [bs, L, N] int64 (parent order at depth d-1)
    rank_ptr,  # [bs, L, N] int64
    slot_ptr,  # [bs, L, NP] int64 scratch: slots of depth d-1, read by parent
    cnt_ptr,  # [bs, L, NP] int32 scratch
    tok_ptr,  # [bs, N1] int64 out
    par_ptr,  # [bs, N1] int64 out
    dep_ptr,  # [bs, N1] int64 out
    val_ptr,  # [bs, N1] int8 out
    sco_ptr,  # [bs, N1] f32 out
    num_ptr,  # [bs] int64 out
    ri_ptr,  # [bs, N1] int64 out (LINKS): retrieve_index
    rnt_ptr,  # [bs, N1] int64 out (LINKS): retrieve_next_token (first child)
    rns_ptr,  # [bs, N1] int64 out (LINKS): retrieve_next_sibling
    K,
    N,
    L: tl.constexpr,
    NP: tl.constexpr,
    N1P: tl.constexpr,
    LINKS: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    d = tl.program_id(1)
    N1 = N + 1
    offs = tl.arange(0, NP)
    nm = offs < N
    g = tl.load(gtop_ptr + b * N + offs, mask=nm, other=_MAXKEY)
    nb = tl.load(nb_ptr + b)
    take = nm & (offs < nb) & ((g >> 30) < 4294967296)
    dd = tl.where(take, (g & 1073741823) // N, -1)
    total = tl.sum(take.to(tl.int64), axis=0)
    m_d = tl.sum((dd == d).to(tl.int64), axis=0)
    if d == 0:  # the root and the unused slots (> total), which no other program writes
        o1 = tl.arange(0, N1P)
        rest = (o1 < N1) & ((o1 == 0) | (o1 > total))
        tl.store(tok_ptr + b * N1 + o1, tl.where(o1 == 0, tl.load(root_ptr + b), 0), mask=rest)
        tl.store(par_ptr + b * N1 + o1, tl.full([N1P], -1, tl.int64), mask=rest)
        tl.store(dep_ptr + b * N1 + o1, tl.zeros([N1P], tl.int64), mask=rest)
        tl.store(val_ptr + b * N1 + o1, (o1 == 0).to(tl.int8), mask=rest)
        tl.store(sco_ptr + b * N1 + o1, tl.where(o1 == 0, 0.0, float("-inf")), mask=rest)
        tl.store(num_ptr + b, total)
        if LINKS:  # the root's first child is label 1 (rank 0 of depth 0) when the tree has one
            tl.store(ri_ptr + b * N1 + o1, b * N1 + o1, mask=o1 < N1)
            tl.store(rnt_ptr + b * N1 + o1, tl.where((o1 == 0) & (total > 0), 1, -1).to(tl.int64), mask=rest)
            tl.store(rns_ptr + b * N1 + o1, tl.full([N1P], -1, tl.int64), mask=rest)
    if m_d > 0:
        cnt = cnt_ptr + (b * L + d) * NP
        off = 1 + tl.sum(((dd >= 0) & (dd < d)).to(tl.int64), axis=0)
        base = (b * L + d) * N
        pm = offs < m_d
        slot, par, rk, sib = _depth_slots(parent_ptr, rank_ptr, base, m_d, cnt, offs, NP)
        lab = off + slot
        plab = tl.zeros([NP], tl.int64)
        if d > 0:  # the parents' labels: the slots of depth d-1, recounted here
            m_p = tl.sum((dd == d - 1).to(tl.int64), axis=0)
            pslot, _, _, _ = _depth_slots(parent_ptr, rank_ptr, base - N, m_p, cnt, offs, NP)
            sl = slot_ptr + (b * L + d) * NP
            tl.store(sl + offs, pslot, mask=offs < m_p)
            tl.debug_barrier()
            plab = off - m_p + tl.load(sl + par, mask=pm, other=0)
        tok = tl.load(ids_ptr + (b * L + d) * K + rk, mask=pm, other=0)
        scp = tl.load(score_ptr + base + offs, mask=pm, other=0.0)
        col = b * N1 + tl.where(pm, lab, 0)
        tl.store(tok_ptr + col, tok, mask=pm)
        tl.store(par_ptr + col, plab, mask=pm)
        tl.store(dep_ptr + col, tl.full([NP], d + 1, tl.int64), mask=pm)
        tl.store(val_ptr + col, tl.full([NP], 1, tl.int8), mask=pm)
        tl.store(sco_ptr + col, scp, mask=pm)
        if LINKS:  # next sibling: the next slot, inside the parent's block; first child: the
            # children of beam entry i (lane i) at depth d + 1 start at their per-parent offset
            tl.store(rns_ptr + col, tl.where(sib, lab + 1, -1), mask=pm)
            m_n = tl.sum((dd == d + 1).to(tl.int64), axis=0)  # 0 at the last depth
            cpar = tl.maximum(tl.load(parent_ptr + base + N + offs, mask=offs < m_n, other=0), 0)
            ch = _parent_counts(cpar, offs < m_n, cnt, offs, NP)
            first = off + m_d + tl.cumsum(ch, axis=0) - ch
            tl.store(rnt_ptr + col, tl.where(ch > 0, first, -1), mask=pm)


def label_count_triton(gtop, nb, roots, ids, score, parent, rank, budget: int, links: bool = False):
    """Selection + labelling on the GPU: the first nb[b] keys of gtop become the tree of request
    b, a node's slot inside its depth = #(selected nodes of that depth with a smaller parent
    order) + its rank (per-parent counts; no sort). One program per (request, depth): a depth's
    labels need only the counts of its own and its parent depth, so the depths run in parallel
    (a per-depth loop in one program cost 13-42 us at bs 1 on the H200, mostly serial barriers).

    gtop [bs, N] int64 (ascending global keys from a beam kernel), nb [bs] per-request budgets,
    roots [bs] bonus tokens, ids [bs, L, K] int64 token ids, score / parent / rank [bs, L, N]
    (the beam). Returns tokens, parents, depths [bs, N + 1] int64, valid [bs, N + 1] bool,
    scores [bs, N + 1] f32 and num_nodes [bs] int64 — the labelled tree of ``build_ddtree``;
    links=True appends retrieve_index, retrieve_next_token and retrieve_next_sibling [bs, N + 1]
    int64 (``ddtree_tree.build_tree_arrays``'s), written by the same programs: a depth's next
    siblings come from its own per-parent counts, its first children from those of the next
    depth (one more count), so ``tree_arrays_triton``'s links launch is not needed."""
    bs, L, N = score.shape
    K = ids.shape[-1]
    dev = score.device
    N1 = N + 1
    NP = max(16, triton.next_power_of_2(N))
    tokens = torch.empty((bs, N1), dtype=torch.int64, device=dev)
    parents = torch.empty_like(tokens)
    depths = torch.empty_like(tokens)
    valid = torch.empty((bs, N1), dtype=torch.bool, device=dev)
    scores = torch.empty((bs, N1), dtype=torch.float32, device=dev)
    num = torch.empty((bs,), dtype=torch.int64, device=dev)
    slots = torch.empty((bs, L, NP), dtype=torch.int64, device=dev)
    cnt = torch.empty((bs, L, NP), dtype=torch.int32, device=dev)
    ri, rnt, rns = (torch.empty_like(tokens) for _ in range(3)) if links else (tokens, tokens, tokens)
    if bs:
        _label_depth_kernel[(bs, L)](
            gtop, nb.to(torch.int64).contiguous(), roots.to(torch.int64).contiguous(),
            ids.contiguous(), score, parent, rank, slots, cnt, tokens, parents, depths,
            valid.view(torch.int8), scores, num, ri, rnt, rns, K, N, L=L, NP=NP,
            N1P=max(16, triton.next_power_of_2(N1)), LINKS=bool(links), num_warps=4 if NP <= 512 else 8,
        )
    out = (tokens, parents, depths, valid, scores, num)
    return out + (ri, rnt, rns) if links else out


# ----------------------------------------------------------------------------------------------
# Radix top-K prep for 16-bit logits (draft_topk(..., prep="radix")): no torch.topk, no tie pass.
# A bf16/fp16 logit has a 16-bit order-preserving image; two histogram passes find the exact K-th
# value t (high byte, then low byte), a third pass writes every element > t and the first
# K - #(> t) elements == t in id order (per-program offsets) into K slots, and one program per
# row sorts those K packed (value desc, id asc) keys: exactly the tie rule of ddtree_reference.
# The three passes run on a (row, program) grid: program p of a row loops, in increasing column
# order, over T consecutive CH-column chunks [p*T, (p+1)*T) (T = cdiv(NCH, P)), keeping its
# 256-bin byte histogram / counts / running slot offsets in registers across chunks (never a whole
# chunk). The first pass also writes the per-chunk log-sum-exp partials, the same for every P (so
# lse does not depend on P). Default P = NCH (T = 1, one program per chunk): on an H200 (Triton
# 3.6, V = 151,936, bs 64 x L 15 = 960 rows) fewer, looping programs were slower at every P tried
# (P = 3: 1.70 ms against 1.61 ms, and 129 us against 56 us at 15 rows; prefetching the next
# chunk did not help). The time is not per-program overhead but per-element work: at 960 rows a
# pass that loads and reduces its chunk takes ~100 us, one that also builds a tl.histogram of it
# 340 / 390 / 440 / 490 / 660 us for 32 / 64 / 128 / 256 (masked) / 512 bins; the passes took
# 580 (A) / 540 (B) / 400 (C) us (the third one scan of both counts packed in one int32).
# ----------------------------------------------------------------------------------------------


@triton.jit
def _ord16(x):
    """Order-preserving unsigned image of a 16-bit float (int32 in [0, 65535]); -0.0 == +0.0."""
    u = x.to(tl.int16, bitcast=True).to(tl.int32) & 65535
    u = tl.where(u == 32768, 0, u)
    return tl.where(u >= 32768, 65535 - u, u + 32768)


@triton.jit
def _kth_bin(h, K):
    """From a 256-bin histogram h ([256] int32): the bin b of the K-th largest element (the
    largest b with #(elements in bins >= b) >= K; -1 when fewer than K) and #(elements in bins
    > b)."""
    bins = tl.arange(0, 256)
    ge = tl.sum(h, axis=0) - (tl.cumsum(h, axis=0) - h)  # elements in bins >= b
    b = tl.max(tl.where(ge >= K, bins, -1), axis=0)
    return b, tl.sum(tl.where(bins > b, h, 0), axis=0)


@triton.jit
def _select_chunk(x_ptr, key_ptr, row, offs, m, t, ngt, need, og, oe, K, V: tl.constexpr):
    """One chunk of the radix select's write pass: the packed keys ((65535 - ord16) << 32 | id,
    int64) of its elements > t go to key [row, og ...] and those == t, while their rank oe ... is
    below need, to key [row, ngt + rank]; offs / m: the chunk's columns and mask. Chunks must
    come in column order. Returns og, oe advanced past the chunk."""
    o = _ord16(tl.load(x_ptr + row * V + offs, mask=m, other=float("-inf")))
    gt = m & (o > t)
    eq = m & (o == t)
    # one scan and one sum for both counts: #(> t) in the low 16 bits, #(== t) above (CH <= 16384)
    ge = gt.to(tl.int32) + (eq.to(tl.int32) << 16)
    c = tl.cumsum(ge, axis=0)
    pe = oe + (c >> 16) - 1
    se = eq & (pe < need)
    key = ((65535 - o).to(tl.int64) << 32) | offs.to(tl.int64)
    slot = tl.where(gt, og + (c & 65535) - 1, ngt + pe)
    tl.store(key_ptr + row * K + tl.where(gt | se, slot, 0), key, mask=gt | se)
    s = tl.sum(ge, axis=0)
    return og + (s & 65535), oe + (s >> 16)


@triton.jit
def _rk_pass_a(x_ptr, pm_ptr, ps_ptr, h_ptr, NCH, V: tl.constexpr, CH: tl.constexpr, T: tl.constexpr):
    """Grid (R, P). Per chunk: max pm / sum of exp(x - max) ps ([R, NCH] f32); per program: the
    high-byte histogram of its T chunks (h [R, P, 256] int32)."""
    row = tl.program_id(0).to(tl.int64)
    p = tl.program_id(1)
    h = tl.zeros([256], dtype=tl.int32)
    for j in range(T):
        ch = p * T + j
        offs = ch * CH + tl.arange(0, CH)
        m = offs < V  # chunks past the last (ch >= NCH) load nothing
        x = tl.load(x_ptr + row * V + offs, mask=m, other=float("-inf"))
        cm, cs = _chunk_lse_partials(x)
        tl.store(pm_ptr + row * NCH + ch, cm, mask=ch < NCH)
        tl.store(ps_ptr + row * NCH + ch, cs, mask=ch < NCH)
        h += tl.histogram(_ord16(x) >> 8, 256, mask=m)
    tl.store(h_ptr + (row * tl.num_programs(1) + p) * 256 + tl.arange(0, 256), h)


@triton.jit
def _rk_combine_a(pm_ptr, ps_ptr, h_ptr, lse_ptr, b1_ptr, ab_ptr, K, NCH, P, NCHP: tl.constexpr,
                  PP: tl.constexpr):
    """Grid (R,). lse [R] f32 from the per-chunk partials; high byte b1 of the K-th value and
    ab = #(elements with high byte > b1) ([R] int32) from the P per-program histograms."""
    row = tl.program_id(0).to(tl.int64)
    tl.store(lse_ptr + row, _lse_from_partials(pm_ptr, ps_ptr, row, NCH, NCHP))
    bins = tl.arange(0, 256)
    q = tl.arange(0, PP)
    hist = tl.load(h_ptr + (row * P + q[:, None]) * 256 + bins[None, :], mask=(q < P)[:, None], other=0)
    b1, above = _kth_bin(tl.sum(hist, axis=0), K)
    tl.store(b1_ptr + row, b1)
    tl.store(ab_ptr + row, above)


@triton.jit
def _rk_pass_b(x_ptr, b1_ptr, h_ptr, cg_ptr, V: tl.constexpr, CH: tl.constexpr, T: tl.constexpr):
    """Grid (R, P). Per program, over its T chunks: the low-byte histogram of the elements in
    high-byte bin b1 (h [R, P, 256] int32) and the count of high byte > b1 (cg [R, P] int32)."""
    row = tl.program_id(0).to(tl.int64)
    p = tl.program_id(1)
    b1 = tl.load(b1_ptr + row)
    h = tl.zeros([256], dtype=tl.int32)
    cnt = tl.zeros([], dtype=tl.int32)
    for j in range(T):
        offs = (p * T + j) * CH + tl.arange(0, CH)
        m = offs < V
        x = tl.load(x_ptr + row * V + offs, mask=m, other=float("-inf"))
        o = _ord16(x)
        hi = o >> 8
        h += tl.histogram(o & 255, 256, mask=m & (hi == b1))
        cnt += tl.sum((m & (hi > b1)).to(tl.int32), axis=0)
    pid = row * tl.num_programs(1) + p
    tl.store(h_ptr + pid * 256 + tl.arange(0, 256), h)
    tl.store(cg_ptr + pid, cnt)


@triton.jit
def _rk_combine_b(b1_ptr, ab_ptr, h_ptr, cg_ptr, t_ptr, ngt_ptr, og_ptr, oe_ptr, ce_ptr, K, P,
                  PP: tl.constexpr):
    """Grid (R,). K-th value t and ngt = #(> t) ([R] int32); per program p: cg / ce = its
    #(> t) / #(== t) and og / oe their exclusive prefix sums over p ([R, P] int32)."""
    row = tl.program_id(0).to(tl.int64)
    o = tl.arange(0, PP)
    om = o < P
    bins = tl.arange(0, 256)
    hist = tl.load(h_ptr + (row * P + o[:, None]) * 256 + bins[None, :], mask=om[:, None], other=0)
    b1 = tl.load(b1_ptr + row)
    above = tl.load(ab_ptr + row)
    b2, above2 = _kth_bin(tl.sum(hist, axis=0), K - above)
    tl.store(t_ptr + row, b1 * 256 + b2)
    tl.store(ngt_ptr + row, above + above2)
    cgt = tl.load(cg_ptr + row * P + o, mask=om, other=0) + tl.sum(
        tl.where(bins[None, :] > b2, hist, 0), axis=1)
    ceq = tl.sum(tl.where(bins[None, :] == b2, hist, 0), axis=1)
    tl.store(og_ptr + row * P + o, tl.cumsum(cgt, axis=0) - cgt, mask=om)
    tl.store(oe_ptr + row * P + o, tl.cumsum(ceq, axis=0) - ceq, mask=om)
    tl.store(cg_ptr + row * P + o, cgt, mask=om)
    tl.store(ce_ptr + row * P + o, ceq, mask=om)


@triton.jit
def _rk_pass_c(x_ptr, t_ptr, ngt_ptr, og_ptr, oe_ptr, cg_ptr, ce_ptr, key_ptr, K, V: tl.constexpr,
               CH: tl.constexpr, T: tl.constexpr):
    """Grid (R, P). Writes the packed keys ((65535 - ord16) << 32 | id, int64) of every element
    > t and of the first K - ngt elements == t in id order into key [R, K]; each program walks
    its T chunks in order from its offsets og / oe ([R, P] int32)."""
    row = tl.program_id(0).to(tl.int64)
    p = tl.program_id(1)
    pid = row * tl.num_programs(1) + p
    t = tl.load(t_ptr + row)
    ngt = tl.load(ngt_ptr + row)
    need = K - ngt
    og = tl.load(og_ptr + pid)  # running slot offsets: next "> t" slot, next "== t" rank
    oe = tl.load(oe_ptr + pid)
    g_end = og + tl.load(cg_ptr + pid)
    e_end = tl.minimum(oe + tl.load(ce_ptr + pid), need)
    for j in range(T):
        # once the rest of this program's range holds nothing selected, chunks load nothing
        work = (og < g_end) | (oe < e_end)
        offs = (p * T + j) * CH + tl.arange(0, CH)
        m = (offs < V) & (tl.full([CH], 1, tl.int1) & work)
        og, oe = _select_chunk(x_ptr, key_ptr, row, offs, m, t, ngt, need, og, oe, K, V)


@triton.jit
def _rk_final(x_ptr, key_ptr, lse_ptr, lp_ptr, ids_ptr, K, V: tl.constexpr, KP: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    kk = tl.arange(0, KP)
    km = kk < K
    key = tl.load(key_ptr + row * K + kk, mask=km, other=_MAXKEY)
    _write_topk(x_ptr, lse_ptr, lp_ptr, ids_ptr, row, tl.sort(key), K, V, KP)


def _rk_programs(nch: int, programs_per_row: int | None = None) -> tuple[int, int]:
    """(P, T) for the radix passes over rows of ``nch`` >= 1 chunks: T = cdiv(nch, P0) chunks per
    program and P = cdiv(nch, T) <= P0 programs per row (none empty), where P0 =
    ``programs_per_row`` clamped to [1, nch] (None: nch, i.e. T = 1)."""
    p0 = nch if programs_per_row is None else max(1, min(int(programs_per_row), nch))
    t = triton.cdiv(nch, p0)
    return triton.cdiv(nch, t), t


def _check_16bit_topk(name: str, x: torch.Tensor, k: int, chunk: int, min_chunk: int):
    """The argument checks shared by the 16-bit top-k preps; returns (R, V). Raises ValueError
    naming ``name`` for another dtype, k outside [1, V] or a chunk that is not a power of 2 in
    [min_chunk, 16384]."""
    if x.dtype not in (torch.bfloat16, torch.float16):
        raise ValueError(f"{name} needs bf16/fp16 logits, got {x.dtype}")
    R, V = x.shape
    if not 1 <= k <= V:
        raise ValueError(f"{name} needs 1 <= k <= V = {V}, got k = {k}")
    if not (min_chunk <= chunk <= 16384 and chunk & (chunk - 1) == 0):
        raise ValueError(f"chunk must be a power of 2 in [{min_chunk}, 16384], got {chunk}")
    return R, V


def topk_radix_triton(x: torch.Tensor, k: int, chunk: int = 4096,
                      programs_per_row: int | None = None):
    """Exact per-row top-k under the tie rule (value desc, id asc) for 16-bit float logits.

    x: [R, V] bf16/fp16 (made contiguous); 1 <= k <= V; chunk: columns per chunk (a power of 2).
    Returns lp [R, k] float32 (min(x - lse, 0), non-increasing), ids [R, k] int64, lse [R]
    float32 — what ``draft_topk`` returns, with no ``torch.topk`` and no separate tie pass
    (6 launches: 3 over (row, program) grids, 3 per row; no host sync, CUDA-graph capturable).
    programs_per_row: programs P per row of the three big passes, each looping over
    T = cdiv(NCH, P) consecutive chunks (NCH = cdiv(V, chunk); P is clamped to [1, NCH], then
    lowered to cdiv(NCH, T) so that no program is empty); None = NCH (one program per chunk, the
    fastest on an H200 at 15 to 960 rows: see the section comment). ids, lp and lse do not depend
    on P (lse comes from the same per-chunk partials for every P). Raises ValueError for other
    dtypes, k outside [1, V], chunk not a power of 2 in [16, 16384] or programs_per_row < 1.
    """
    R, V = _check_16bit_topk("topk_radix_triton", x, k, chunk, 16)
    if programs_per_row is not None and programs_per_row < 1:
        raise ValueError(f"programs_per_row must be >= 1, got {programs_per_row}")
    dev = x.device
    x = x.contiguous()
    lse = torch.empty((R,), dtype=torch.float32, device=dev)
    lp = torch.empty((R, k), dtype=torch.float32, device=dev)
    ids = torch.empty((R, k), dtype=torch.int64, device=dev)
    _radix_into(x, k, chunk, programs_per_row, lp, ids, lse)
    return lp, ids, lse


def _radix_into(x, k, chunk, programs_per_row, lp, ids, lse):
    """The radix passes of ``topk_radix_triton`` writing into lp / ids / lse."""
    R, V = x.shape
    dev = x.device
    NCH = triton.cdiv(V, chunk)
    NCHP = max(16, triton.next_power_of_2(NCH))
    P, T = _rk_programs(NCH, programs_per_row)
    PP = max(16, triton.next_power_of_2(P))
    i32 = dict(dtype=torch.int32, device=dev)
    pm = torch.empty((R, NCH), dtype=torch.float32, device=dev)
    ps = torch.empty_like(pm)
    hist = torch.empty((R, P, 256), **i32)
    b1 = torch.empty((R,), **i32)
    ab = torch.empty((R,), **i32)
    cg = torch.empty((R, P), **i32)
    ce = torch.empty((R, P), **i32)
    og = torch.empty((R, P), **i32)
    oe = torch.empty((R, P), **i32)
    t = torch.empty((R,), **i32)
    ngt = torch.empty((R,), **i32)
    keys = torch.empty((R, k), dtype=torch.int64, device=dev)
    if R == 0:
        return
    _rk_pass_a[(R, P)](x, pm, ps, hist, NCH, V=V, CH=chunk, T=T, num_warps=8)
    _rk_combine_a[(R,)](pm, ps, hist, lse, b1, ab, k, NCH, P, NCHP=NCHP, PP=PP, num_warps=4)
    _rk_pass_b[(R, P)](x, b1, hist, cg, V=V, CH=chunk, T=T, num_warps=8)
    _rk_combine_b[(R,)](b1, ab, hist, cg, t, ngt, og, oe, ce, k, P, PP=PP, num_warps=4)
    _rk_pass_c[(R, P)](x, t, ngt, og, oe, cg, ce, keys, k, V=V, CH=chunk, T=T, num_warps=8)
    KP = max(16, triton.next_power_of_2(k))
    _rk_final[(R,)](x, keys, lse, lp, ids, k, V=V, KP=KP, num_warps=4 if KP <= 512 else 8)


# ----------------------------------------------------------------------------------------------
# Bound top-K prep (draft_topk(..., prep="bound")): histogram only what can be in the top K.
# On an H200 a tl.histogram of every element is what the radix prep pays for (a 256-bin one
# costs ~4x the load + reduce of the same chunk). Here pass A writes, besides the same per-chunk
# log-sum-exp partials, the maximum of every SB-element sub-block (a reshape + max, no histogram).
# The sub-block maxima are distinct elements, so their K-th largest value m bounds the K-th
# largest element from below: at least K elements are >= m, and every element of the top K is.
# A 5-ary search over the ~V / SB maxima finds m exactly (one packed reduction per round). Pass B
# appends every element >= m (typically ~1.0-1.3 K of them) to the row's candidate list through
# one atomic per program, and one program per row sorts the candidates' packed (value desc,
# id asc) keys and keeps the first K: the tie rule of ddtree_reference. A row with more than CAP
# candidates (heavy ties at m, flat logits) is redone exactly by ``_bd_fallback``: the radix
# select of that row in one looping program, one launch that returns at once for every other
# row (the six gated radix launches it replaced cost ~10 us at bs 1 for nothing).
# ----------------------------------------------------------------------------------------------


@triton.jit
def _bd_pass_a(x_ptr, pm_ptr, ps_ptr, sbm_ptr, NCH, V: tl.constexpr, CH: tl.constexpr, SB: tl.constexpr):
    """Grid (R, NCH). Per chunk: pm / ps as ``_rk_pass_a`` ([R, NCH] f32), and the ord16 maximum
    of each SB-element sub-block (sbm [R, NCH * CH / SB] int32, -1 where it holds no element)."""
    row = tl.program_id(0).to(tl.int64)
    ch = tl.program_id(1)
    offs = ch * CH + tl.arange(0, CH)
    m = offs < V
    x = tl.load(x_ptr + row * V + offs, mask=m, other=float("-inf"))
    cm, cs = _chunk_lse_partials(x)
    tl.store(pm_ptr + row * NCH + ch, cm)
    tl.store(ps_ptr + row * NCH + ch, cs)
    o = tl.where(m, _ord16(x), -1)
    sb = tl.max(tl.reshape(o, [CH // SB, SB]), axis=1)
    tl.store(sbm_ptr + (row * NCH + ch) * (CH // SB) + tl.arange(0, CH // SB), sb)


@triton.jit
def _bd_combine_a(pm_ptr, ps_ptr, sbm_ptr, lse_ptr, thr_ptr, cnt_ptr, K, NCH, NSB,
                  NCHP: tl.constexpr, NSBP: tl.constexpr, ROUNDS: tl.constexpr):
    """Grid (R,). lse [R] f32 (the formula of ``_rk_combine_a``); thr [R] int32 = the K-th
    largest sub-block maximum (0 = every element when fewer than K sub-blocks hold one);
    cnt [R] int32 = 0 (pass B's candidate counter)."""
    row = tl.program_id(0).to(tl.int64)
    tl.store(lse_ptr + row, _lse_from_partials(pm_ptr, ps_ptr, row, NCH, NCHP))
    sj = tl.arange(0, NSBP)
    v = tl.load(sbm_ptr + row * NSB + sj, mask=sj < NSB, other=-1)
    # largest thr with #(v >= thr) >= K; invariant #(v >= lo) >= K > #(v >= hi + 1)
    lo = tl.zeros([], tl.int32)
    hi = tl.zeros([], tl.int32) + 65535
    for _ in range(ROUNDS):
        step = (hi - lo) // 5 + 1
        c = _packed_count4(v >= lo + step, v >= lo + 2 * step, v >= lo + 3 * step, v >= lo + 4 * step)
        lo = lo + _fields_at_least(c, K).to(tl.int32) * step
        hi = tl.minimum(lo + step - 1, hi)
    enough = tl.sum((v >= 0).to(tl.int32), axis=0) >= K
    tl.store(thr_ptr + row, tl.where(enough, lo, 0))
    tl.store(cnt_ptr + row, 0)


@triton.jit
def _bd_pass_b(x_ptr, sbm_ptr, thr_ptr, cnt_ptr, cand_ptr, NCH, CAP, V: tl.constexpr, CH: tl.constexpr,
               SB: tl.constexpr):
    """Grid (R, NCH). Appends the packed key ((65535 - ord16) << 32 | id, int64) of every element
    >= thr to cand [R, CAP] (slots from one atomic on cnt [R] per program; cnt ends as the row's
    candidate count, also when it exceeds CAP). Chunks whose maximum is < thr load nothing (the
    maximum in ord16 terms, from the sub-block maxima: a float max would skip a NaN, which ord16
    ranks above +inf as the radix prep does)."""
    row = tl.program_id(0).to(tl.int64)
    ch = tl.program_id(1)
    thr = tl.load(thr_ptr + row)
    cmax = tl.max(tl.load(sbm_ptr + (row * NCH + ch) * (CH // SB) + tl.arange(0, CH // SB)), axis=0)
    work = cmax >= thr
    offs = ch * CH + tl.arange(0, CH)
    m = (offs < V) & (tl.full([CH], 1, tl.int1) & work)
    x = tl.load(x_ptr + row * V + offs, mask=m, other=float("-inf"))
    o = _ord16(x)
    sel = m & (o >= thr)
    n = tl.sum(sel.to(tl.int32), axis=0)
    base = tl.atomic_add(cnt_ptr + row, n)
    pos = base + tl.cumsum(sel.to(tl.int32), axis=0) - 1
    key = ((65535 - o).to(tl.int64) << 32) | offs.to(tl.int64)
    ok = sel & (pos < CAP)
    tl.store(cand_ptr + row * CAP + tl.where(ok, pos, 0), key, mask=ok)


@triton.jit
def _bd_final(x_ptr, cand_ptr, cnt_ptr, lse_ptr, lp_ptr, ids_ptr, K, CAP, V: tl.constexpr,
              CAPP: tl.constexpr, KP: tl.constexpr):
    """Grid (R,). Rows with K <= cnt <= CAP: sort the candidates' keys, write the first K as lp
    (min(x - lse, 0), f32) and ids (int64) [R, K]. Rows with more are left to the fallback, and
    so are rows with fewer (cnt is set to CAP + 1 for ``_bd_fallback``)."""
    row = tl.program_id(0).to(tl.int64)
    n = tl.load(cnt_ptr + row)
    if n > CAP:
        return
    if n < K:  # cannot happen when pass B saw every element >= thr; redo the row exactly anyway
        tl.store(cnt_ptr + row, CAP + 1)
        return
    jj = tl.arange(0, CAPP)
    key = tl.load(cand_ptr + row * CAP + jj, mask=jj < n, other=_MAXKEY)
    srt = tl.sort(key)
    top = tl.min(tl.reshape(srt, [CAPP // KP, KP]), axis=0)  # ascending: row 0 is the first KP
    _write_topk(x_ptr, lse_ptr, lp_ptr, ids_ptr, row, top, K, V, KP)


@triton.jit
def _bd_fallback(x_ptr, cnt_ptr, key_ptr, lse_ptr, lp_ptr, ids_ptr, K, CAP, NCH, V: tl.constexpr,
                 CH: tl.constexpr, KP: tl.constexpr):
    """Grid (R,). The exact radix select of one row in one looping program, for the rows that
    ``_bd_final`` left (cnt [R] > CAP); every other row returns at once (one launch instead of
    the radix prep's six). Over the row's chunks in order: the high-byte histogram, then the
    low-byte histogram of high-byte bin b1 (the K-th value t), then the packed keys of every
    element > t and of the first K - #(> t) elements == t in id order into key [R, K] int64;
    then those keys sorted -> lp / ids (lse from pass A, already written)."""
    row = tl.program_id(0).to(tl.int64)
    if tl.load(cnt_ptr + row) <= CAP:
        return
    h = tl.zeros([256], dtype=tl.int32)
    for j in range(NCH):
        offs = j * CH + tl.arange(0, CH)
        m = offs < V
        x = tl.load(x_ptr + row * V + offs, mask=m, other=float("-inf"))
        h += tl.histogram(_ord16(x) >> 8, 256, mask=m)
    b1, above = _kth_bin(h, K)
    h2 = tl.zeros([256], dtype=tl.int32)
    for j in range(NCH):
        offs = j * CH + tl.arange(0, CH)
        m = offs < V
        o = _ord16(tl.load(x_ptr + row * V + offs, mask=m, other=float("-inf")))
        h2 += tl.histogram(o & 255, 256, mask=m & ((o >> 8) == b1))
    b2, above2 = _kth_bin(h2, K - above)
    t = b1 * 256 + b2
    ngt = above + above2
    need = K - ngt
    og = tl.zeros([], dtype=tl.int32)  # next "> t" slot, next "== t" rank
    oe = tl.zeros([], dtype=tl.int32)
    for j in range(NCH):
        offs = j * CH + tl.arange(0, CH)
        og, oe = _select_chunk(x_ptr, key_ptr, row, offs, offs < V, t, ngt, need, og, oe, K, V)
    tl.debug_barrier()  # the keys were written across lanes
    kk = tl.arange(0, KP)
    key = tl.load(key_ptr + row * K + kk, mask=kk < K, other=_MAXKEY)
    _write_topk(x_ptr, lse_ptr, lp_ptr, ids_ptr, row, tl.sort(key), K, V, KP)


def topk_bound_triton(x: torch.Tensor, k: int, chunk: int = 4096, sub_block: int = 64,
                      cap: int | None = None):
    """Exact per-row top-k under the tie rule (value desc, id asc) for 16-bit float logits,
    histogramming only the candidates (see the section comment); same results as
    ``topk_radix_triton``, lse bit-identical.

    x: [R, V] bf16/fp16; 1 <= k <= V; chunk: columns per pass-A/B program (a power of 2 in
    [64, 16384]); sub_block: elements per sub-block maximum (a power of 2 dividing chunk);
    cap: candidate slots per row (None: max(2 * next_pow2(k), 256)); a row with more candidates
    is recomputed by ``_bd_fallback`` (one looping program per row). Returns lp [R, k] f32,
    ids [R, k] int64, lse [R] f32. 5 launches (the last returns at once for rows that did not
    overflow); no host sync, CUDA-graph
    capturable. Raises ValueError for other dtypes or bad k / chunk / sub_block / cap.
    """
    R, V = _check_16bit_topk("topk_bound_triton", x, k, chunk, 64)
    if not (1 <= sub_block <= chunk and sub_block & (sub_block - 1) == 0):
        raise ValueError(f"sub_block must be a power of 2 dividing chunk = {chunk}, got {sub_block}")
    KP = max(16, triton.next_power_of_2(k))
    cap = max(2 * KP, 256) if cap is None else int(cap)
    if cap < k:
        raise ValueError(f"cap must be >= k = {k}, got {cap}")
    CAPP = max(KP, triton.next_power_of_2(cap))
    NCH = triton.cdiv(V, chunk)
    NSB = NCH * (chunk // sub_block)
    if NSB >= 65536:
        raise ValueError(f"{NSB} sub-blocks per row: use a larger sub_block (the counts are 16-bit)")
    dev = x.device
    x = x.contiguous()
    pm = torch.empty((R, NCH), dtype=torch.float32, device=dev)
    ps = torch.empty_like(pm)
    sbm = torch.empty((R, NSB), dtype=torch.int32, device=dev)
    thr = torch.empty((R,), dtype=torch.int32, device=dev)
    cnt = torch.empty((R,), dtype=torch.int32, device=dev)
    cand = torch.empty((R, cap), dtype=torch.int64, device=dev)
    lse = torch.empty((R,), dtype=torch.float32, device=dev)
    lp = torch.empty((R, k), dtype=torch.float32, device=dev)
    ids = torch.empty((R, k), dtype=torch.int64, device=dev)
    if R == 0:
        return lp, ids, lse
    _bd_pass_a[(R, NCH)](x, pm, ps, sbm, NCH, V=V, CH=chunk, SB=sub_block, num_warps=8)
    _bd_combine_a[(R,)](pm, ps, sbm, lse, thr, cnt, k, NCH, NSB, NCHP=max(16, triton.next_power_of_2(NCH)),
                        NSBP=max(16, triton.next_power_of_2(NSB)), ROUNDS=8, num_warps=8)
    _bd_pass_b[(R, NCH)](x, sbm, thr, cnt, cand, NCH, cap, V=V, CH=chunk, SB=sub_block, num_warps=8)
    _bd_final[(R,)](x, cand, cnt, lse, lp, ids, k, cap, V=V, CAPP=CAPP, KP=KP,
                    num_warps=16 if CAPP >= 512 else 4)  # H200: 16 warps 1.19x at K 512
    keys = torch.empty((R, k), dtype=torch.int64, device=dev)
    _bd_fallback[(R,)](x, cnt, keys, lse, lp, ids, k, cap, NCH, V=V, CH=chunk, KP=KP,
                       num_warps=8)  # overflowed rows only
    return lp, ids, lse
