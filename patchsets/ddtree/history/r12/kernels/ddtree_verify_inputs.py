"""DDTree's verify inputs (Triton, CUDA): from the beam's global keys to what the target's verify
pass reads — the labelled tree (tokens, parents, depths, valid, scores [bs, N + 1]), SGLang's
retrieve arrays (retrieve_index / next_token / next_sibling), the ancestor-or-self tree mask
[bs, N + 1, N + 1] and SGLang's flat ``custom_mask`` (TreeMaskMode.FULL_MASK). The Triton path of
``ddtree_tree.build_ddtree_from_topk`` (labels, links, mask) and ``build_custom_mask``; each kernel
has a torch twin that the CPU uses.

| kernel                     | torch twin                                | H200 result (bench/RESULTS.md)      |
|----------------------------|-------------------------------------------|-------------------------------------|
| ``label_count_triton``     | selection + labelling in ``build_ddtree_from_topk``, positions from per-parent counts, one program per (request, depth); ``links=True`` also writes the retrieve arrays | 9-26 us (was 13-47 with a per-depth loop); with links + ``tree_mask_triton`` 15.6 us against 16.1 for labels + ``tree_arrays_triton`` (bs 1 N 512) |
| ``tree_arrays_triton``     | ``ddtree_tree.build_tree_arrays``         | 10-68 us (was up to 1.2 ms)         |
| ``custom_mask_triton``     | torch path of ``build_custom_mask``       | 1.4-3.6x faster                     |

``tree_mask_triton`` is ``tree_arrays_triton``'s mask alone, for labels that brought their links.

Importing this module needs Triton; ``sglang/srt/speculative/ddtree_tree.py`` imports it lazily,
only for CUDA tensors (or when asked to). The kernels also run under ``TRITON_INTERPRET=1`` on CPU
tensors, which is how tests/unit/test_ddtree_kernels.py checks them; every loop has compile-time
bounds so that the interpreter can run it. H200 figures: bench/RESULTS.md. Depends on torch, Triton and ``ddtree_keys``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .ddtree_keys import _MAXKEY

__all__ = [
    "label_count_triton",
    "tree_arrays_triton",
    "tree_mask_triton",
    "custom_mask_triton",
]


# ----------------------------------------------------------------------------------------------
# Labels (``label_count_triton``): the selected nodes of one depth form a down-set of the
# (parent order, rank) grid, so a node's position inside its depth is
# (#selected nodes with a smaller parent order) + its rank: counts, no sort.
# ----------------------------------------------------------------------------------------------


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
# The retrieve arrays and the ancestor-or-self tree mask from parents and valid flags
# (``tree_arrays_triton``, ``tree_mask_triton``).
# ----------------------------------------------------------------------------------------------


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


# ----------------------------------------------------------------------------------------------
# SGLang's flat FULL_MASK ``custom_mask`` from the tree mask (``custom_mask_triton``).
# ----------------------------------------------------------------------------------------------


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

