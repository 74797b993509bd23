"""DDTree's beam (Triton, CUDA): from each depth's top-K log-probs [bs, L, K] to the per-depth
beams (score, valid, parent, rank [bs, L, N]) and the N smallest global keys (gtop [bs, N]) —
the tree's node set and order, ``ddtree_tree.build_ddtree_from_topk``'s Triton path (labels
follow in ``ddtree_verify_inputs.label_count_triton``). Each beam has a torch twin that the CPU
uses.

| kernel                     | torch twin                                | H200 result (bench/RESULTS.md)      |
|----------------------------|-------------------------------------------|-------------------------------------|
| ``beam_triton``            | ``ddtree_tree._beam_search`` (~10 ops/depth) | 24 us (N 16) .. 3.5 ms (N 1024)  |
| ``beam_select_triton``     | same; selection instead of sorts          | 209 us (N 256) .. 678 us (N 1024)   |
| ``beam_prune_triton``      | same; only candidates that can still be   | default: 18-56 us flat; peaked bs 1 |
|                            | in the global top-N (the heap's early     | N 512 / 1024: 94 / 250 us with the  |
|                            | stop), survivors merged, not re-sorted;   | survivors generated per parent (118 |
|                            | survivors generated per parent; more than | / 297 scanning the table in 32 bits,|
|                            | N of them: exact head bound, then a       | 125 / 348 in 64 bits); bench inputs |
|                            | selection among <= 2 NP generated lanes   | bs 1 N 512: 117.7 us (138.2 before) |

``tight_bound_triton`` is the opt-in threshold launch of ``beam_prune_triton(bound="tight")``;
``beam_prune_constexprs`` and ``BEAM_PRUNE_SIGNATURE`` give the pruned beam's launch for compiling
it ahead of time.

Importing this module needs Triton; ``sglang/srt/speculative/ddtree_tree.py`` imports it lazily,
only for CUDA tensors (or when asked to). The kernels also run under ``TRITON_INTERPRET=1`` on CPU
tensors, which is how tests/unit/test_ddtree_kernels.py checks them; every loop has compile-time
bounds so that the interpreter can run it. H200 figures: bench/RESULTS.md. Depends on torch, Triton and ``ddtree_keys``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .ddtree_keys import _MAXKEY, _desc_key, _fields_at_least, _packed_count4

__all__ = [
    "beam_triton",
    "beam_select_triton",
    "beam_prune_triton",
    "beam_prune_constexprs",
    "tight_bound_triton",
    "BEAM_PRUNE_SIGNATURE",
]


@triton.jit
def _clean_lp(x):
    """Log-probs as the beams use them: NaN -> -inf (a row of NaN or all -inf logits has NaN
    lp: it drafts nothing) and > 0 -> 0, so a child never outranks its parent. The torch twin is
    ``ddtree_tree.clean_lp``."""
    return tl.where(x <= 0.0, x, tl.where(x > 0.0, 0.0, float("-inf")))


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
# Selection instead of sorting (build_ddtree(..., beam="select")). Per depth the beam is
# the N smallest of ~N H(N) packed keys; instead of a full tl.sort of all of them, a 5-ary search
# on the keys' 33-bit primary (score bits + invalid flag) finds the primary P of the N-th smallest
# key, ties at P go to the smallest sub (= lane index, a cumsum), the N survivors are compacted
# and only they are sorted. The global order (running merge sort per depth before) is one such
# selection over all L * N beam keys at the end.
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

