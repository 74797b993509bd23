"""DDTree's top-K prep (Triton, CUDA): the drafter's logits [bs * L, V] to each depth's top-K
log-probs and token ids under the tie rule (value desc, id asc), and the rows' log-sum-exp —
``ddtree_tree.draft_topk``'s Triton path; each kernel has a torch twin that the CPU uses.

| kernel                     | torch twin                                | H200 result (bench/RESULTS.md)      |
|----------------------------|-------------------------------------------|-------------------------------------|
| ``topk_radix_triton``      | ``torch.topk`` + lse + tie fix (bf16/fp16) | an option, slower than bound at     |
|                            | (3 passes over (row, program) grids, P    | every size: 46-54 us at bs 1, 1.54- |
|                            | programs per row looping over chunks)     | 1.62 ms at bs 64                    |
| ``topk_bound_triton``      | same; sub-block maxima bound the K-th     | 16-bit default at K > 32: 28-34 us  |
|                            | value, only candidates sorted (one        | at bs 1 (K <= 512), 49.5 at 1024,   |
|                            | looping program redoes overflowing rows)  | 590-789 us at bs 64                 |
| ``lse_triton``             | ``torch.logsumexp(x.float())``            | "row" prep (one program per row)    |
| ``tie_fix_triton``         | full-vocabulary int32 ``where`` + topk    | "row" prep                          |
| ``prep_chunked_triton``    | (both of the above, (row, chunk) grid)    | "chunked": 2.3x "row" at bs 1       |
| ``topk_small_triton``      | same (K <= 32, bf16/fp16/fp32); each      | default prep for K <= 32 (bf16):    |
|                            | logit read once, then one program per row | 16-21 us at bs 1, 30-36 at bs 8,    |
|                            | gathers the K best sub-blocks and sorts   | 172-192 at bs 64 (bound: 24-27 /    |
|                            | their candidates                          | 77-80 / 521-536)                    |

Importing this module needs Triton; ``sglang/srt/speculative/ddtree_tree.py`` imports it lazily,
only for CUDA tensors (or when asked to). The kernels also run under ``TRITON_INTERPRET=1`` on CPU
tensors, which is how tests/unit/test_ddtree_kernels.py checks them; every loop has compile-time
bounds so that the interpreter can run it. H200 figures: bench/RESULTS.md. Depends on torch, Triton and ``ddtree_keys``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .ddtree_keys import _MAXKEY, _fields_at_least, _packed_count4

__all__ = [
    "lse_triton",
    "tie_fix_triton",
    "prep_chunked_triton",
    "topk_radix_triton",
    "topk_bound_triton",
    "topk_small_triton",
    "SMALL_K_MAX",
]


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


# ----------------------------------------------------------------------------------------------
# Chunk-parallel prep (log-sum-exp + tie fix over (row, chunk) programs). Not yet measured on the
# GPU: opt in with draft_topk(..., prep="chunked"); bench/tree_build.py times both.
# ----------------------------------------------------------------------------------------------


@triton.jit
def _chunk_exp_sum(xf, cm):
    """The sum of exp(xf - cm) over a chunk's float32 values ``xf`` (-inf where masked) and its
    maximum ``cm`` (0 for an all -inf chunk): the second log-sum-exp partial, one formula for
    ``_chunk_lse_partials`` and ``_bd_pass_a`` (which takes its maximum another way)."""
    e = tl.where(xf > float("-inf"), tl.exp(xf - cm), 0.0)
    return tl.where(cm > float("-inf"), tl.sum(e, axis=0), 0.0)


@triton.jit
def _chunk_lse_partials(x):
    """Log-sum-exp partials of one chunk (16/32-bit floats, -inf where masked): its float32
    maximum and the sum of exp(x - max) (0 for an all -inf chunk). Every chunked prep uses this
    one formula, so their lse values are bit-identical."""
    xf = x.to(tl.float32)
    cm = tl.max(xf, axis=0)
    return cm, _chunk_exp_sum(xf, cm)


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
def _ord32(x):
    """Order-preserving unsigned image of a float32 (int64 in [0, 2**32 - 1]); -0.0 == +0.0;
    +NaN above +inf, as ``_ord16`` ranks a 16-bit NaN."""
    u = x.to(tl.int32, bitcast=True).to(tl.int64) & 4294967295
    u = tl.where(u == 2147483648, 0, u)
    return tl.where(u >= 2147483648, 4294967295 - u, u + 2147483648)


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
def _max_nan(a, b):
    """Combine function of a NaN-propagating maximum (``tl.max`` skips NaN)."""
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def _bd_pass_a(x_ptr, pm_ptr, ps_ptr, sbm_ptr, NCH, V: tl.constexpr, CH: tl.constexpr, SB: tl.constexpr,
               W32: tl.constexpr = False):
    """Grid (R, NCH). Per chunk: pm / ps as ``_rk_pass_a`` ([R, NCH] f32), and the ord16 maximum
    of each SB-element sub-block (sbm [R, NCH * CH / SB] int32, -1 where it holds no element);
    with ``W32`` (float32 logits, the small-K prep) the ``_ord32`` maximum, sbm int64.

    The maxima are taken on the float values and only they are mapped to order images (the
    image is monotone, -0.0 == +0.0): one float max per element where the image of every element
    cost ~6 integer ops (pass A 1.6x faster at bs 64 on the H200); the chunk maximum comes from
    the sub-block maxima. Those maxima propagate NaN; a chunk with a NaN takes every element's
    image as before (NaN keeps its place above +inf) and the NaN-skipping maximum for its
    partials (the bound and radix preps' lse)."""
    row = tl.program_id(0).to(tl.int64)
    ch = tl.program_id(1)
    offs = ch * CH + tl.arange(0, CH)
    m = offs < V
    x = tl.load(x_ptr + row * V + offs, mask=m, other=float("-inf"))
    xf = x.to(tl.float32)
    # NaN-propagating sub-block maxima: a NaN shows, where a plain float max would skip it
    sbx = tl.reduce(tl.reshape(xf, [CH // SB, SB]), 1, _max_nan)
    filled = (ch * CH + tl.arange(0, CH // SB) * SB) < V   # the sub-block holds an element
    if W32:
        sb = tl.where(filled, _ord32(sbx), -1)
    else:
        sb = tl.where(filled, _ord16(sbx.to(x.dtype)), -1)
    cm = tl.max(sbx, axis=0)
    if tl.max((sbx != sbx).to(tl.int32), axis=0) > 0:
        # a NaN in the chunk: the partials' maximum skips NaN (as _chunk_lse_partials' does), and
        # every element's image keeps NaN's place above +inf
        cm = tl.max(xf, axis=0)
        if W32:
            o = tl.where(m, _ord32(x), -1)
        else:
            o = tl.where(m, _ord16(x), -1)
        sb = tl.max(tl.reshape(o, [CH // SB, SB]), axis=1)
    cs = _chunk_exp_sum(xf, cm)   # _chunk_lse_partials' formula: bit-identical partials
    tl.store(pm_ptr + row * NCH + ch, cm)
    tl.store(ps_ptr + row * NCH + ch, cs)
    tl.store(sbm_ptr + (row * NCH + ch) * (CH // SB) + tl.arange(0, CH // SB), sb)


@triton.jit
def _kth_sub_block_max(v, K, NCH, OMAX: tl.constexpr, SPC: tl.constexpr, NSBP: tl.constexpr,
                       ROUNDS: tl.constexpr):
    """The K-th largest of a row's sub-block maxima images v ([NSBP] int32 / int64, chunk j's
    SPC sub-blocks at lanes j * SPC ..., -1 = empty or padding): the largest t with
    #(v >= t) >= K, by the 5-ary search (one packed count of four thresholds per round).

    The search starts from [lo, hi] with #(v >= lo) >= K > #(v >= hi + 1): hi is the largest
    image; lo is the smallest chunk maximum when the row has NCH >= K chunks (each chunk's maximum
    is a sub-block maximum of its own, so at least NCH of them are >= it), else 0. On logits the
    chunk maxima lie close to the row's maximum (a few hundred 16-bit images apart where the full
    range is 65,536), so most rounds find lo == hi and skip their count (on the H200 the search
    from the whole range was 28 of the small prep's 49 us row program at batch 64, K 8). Returns
    0 ... OMAX (v's dtype); a row with fewer than K images >= 0 gets a value the callers replace
    (they take every non-empty sub-block then)."""
    cmx = tl.max(tl.reshape(v, [NSBP // SPC, SPC]), axis=1)
    hi = tl.max(v, axis=0)
    lo = tl.where(NCH >= K, tl.min(tl.where(cmx >= 0, cmx, OMAX), axis=0), 0).to(hi.dtype)
    hi = tl.maximum(hi, lo)
    for _ in range(ROUNDS):
        if hi > lo:
            step = (hi - lo) // 5 + 1
            c = _packed_count4(v >= lo + step, v >= lo + 2 * step, v >= lo + 3 * step, v >= lo + 4 * step)
            lo = lo + _fields_at_least(c, K).to(lo.dtype) * step
            hi = tl.minimum(lo + step - 1, hi)
    return lo


@triton.jit
def _bd_combine_a(pm_ptr, ps_ptr, sbm_ptr, lse_ptr, thr_ptr, cnt_ptr, K, NCH, NSB,
                  NCHP: tl.constexpr, NSBP: tl.constexpr, SPC: tl.constexpr, ROUNDS: tl.constexpr):
    """Grid (R,). lse [R] f32 (the formula of ``_rk_combine_a``); thr [R] int32 = the K-th
    largest sub-block maximum (0 = every element when fewer than K sub-blocks hold one);
    cnt [R] int32 = 0 (pass B's candidate counter)."""
    row = tl.program_id(0).to(tl.int64)
    tl.store(lse_ptr + row, _lse_from_partials(pm_ptr, ps_ptr, row, NCH, NCHP))
    sj = tl.arange(0, NSBP)
    v = tl.load(sbm_ptr + row * NSB + sj, mask=sj < NSB, other=-1)
    lo = _kth_sub_block_max(v, K, NCH, 65535, SPC, NSBP, ROUNDS)
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


# Warps of pass A's (row, chunk) programs (bound and small preps). 4 ran pass A 1.1x faster at
# bs 64 on the H200, but a reduction's order follows the warps: the exp-sum partials, and so the
# lse, would no longer be bit-identical to the radix and chunked preps' (and revision 9's).
PASS_A_WARPS = 8


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
    _bd_pass_a[(R, NCH)](x, pm, ps, sbm, NCH, V=V, CH=chunk, SB=sub_block, num_warps=PASS_A_WARPS)
    _bd_combine_a[(R,)](pm, ps, sbm, lse, thr, cnt, k, NCH, NSB, NCHP=max(16, triton.next_power_of_2(NCH)),
                        NSBP=max(16, triton.next_power_of_2(NSB)), SPC=chunk // sub_block, ROUNDS=8,
                        num_warps=8)
    _bd_pass_b[(R, NCH)](x, sbm, thr, cnt, cand, NCH, cap, V=V, CH=chunk, SB=sub_block, num_warps=8)
    _bd_final[(R,)](x, cand, cnt, lse, lp, ids, k, cap, V=V, CAPP=CAPP, KP=KP,
                    num_warps=16 if CAPP >= 512 else 4)  # H200: 16 warps 1.19x at K 512
    keys = torch.empty((R, k), dtype=torch.int64, device=dev)
    _bd_fallback[(R,)](x, cnt, keys, lse, lp, ids, k, cap, NCH, V=V, CH=chunk, KP=KP,
                       num_warps=8)  # overflowed rows only
    return lp, ids, lse



# ----------------------------------------------------------------------------------------------
# Small-K prep (draft_topk(..., prep="small"), K <= 32): each logit is read once. Pass A is the
# bound prep's (16-bit) or its float32 twin ``_bd_pass_a`` with ``W32``: per (row, chunk) program the
# log-sum-exp partials and the order-image maximum of every SB-element sub-block. Then ONE
# program per row (``_sk_select``) does the rest, reading ~K * SB more elements:
# - the row's K best sub-blocks under (maximum desc, sub-block index asc). They hold the row's
#   top K: every top-K element's sub-block has its best element (a distinct element, at least as
#   good) in the top K too, so at most K sub-blocks hold top-K elements, each among the K best
#   (sub-blocks are contiguous id ranges, so index order is the id order of equal maxima). The
#   K-th largest maximum thr comes from the bound prep's 5-ary search (8 rounds for 16-bit
#   images, 14 for 32-bit ones); ties at thr are taken in index order (one prefix sum).
# - those sub-blocks' elements >= thr (the K best maxima are K elements >= thr, so the K-th
#   value is >= thr): usually ~K to 2K of them, compacted into at most CAP slots and sorted as
#   packed (value desc, id asc) keys; a row with more (heavy ties at thr) sorts all GS * SB
#   gathered keys instead, in the same program. The first K keys give ids, lp = min(x - lse, 0).
# No fallback launch, no atomics; lse bit-identical to the bound prep's for 16-bit logits (the
# same partials and combine formula).
# ----------------------------------------------------------------------------------------------

SMALL_K_MAX = 32  # the largest K that ``topk_small_triton`` takes (its gather holds K sub-blocks)
SK_GROUP = 16  # sub-blocks the small prep's row program gathers at a time (H200: 8 and 32 slower at K 32)
SK_SELECT_WARPS = 8  # warps of that program


@triton.jit
def _sk_write(x_ptr, lp_ptr, ids_ptr, row, top, lse, K, V: tl.constexpr, KP: tl.constexpr):
    """Write a row's top K from its first KP ascending keys ``top`` (id in the low 31 bits):
    ids [R, K] int64 and lp = min(x - lse, 0) [R, K] f32."""
    kk = tl.arange(0, KP)
    km = kk < K
    ids = tl.where(km, top & 2147483647, 0)
    xv = tl.load(x_ptr + row * V + ids, mask=km, other=0.0).to(tl.float32)
    tl.store(lp_ptr + row * K + kk, tl.minimum(xv - lse, 0.0), mask=km)
    tl.store(ids_ptr + row * K + kk, ids, mask=km)


@triton.jit
def _sk_gather(x_ptr, gsc_ptr, row, g0, nsel, thr, OMAX: tl.constexpr, GN: tl.constexpr, GS: tl.constexpr,
               SB: tl.constexpr, V: tl.constexpr, W32: tl.constexpr):
    """The packed (value desc, id asc) keys [GN * SB] int64 of the elements >= thr in the row's
    chosen sub-blocks g0 ... g0 + GN - 1 (their indices in gsc [R, GS], nsel of them), _MAXKEY
    elsewhere, and the candidate mask [GN * SB]. Ids ascend along the keys (the indices do)."""
    gg = g0 + tl.arange(0, GN)
    gok = gg < nsel
    g = tl.load(gsc_ptr + row * GS + gg, mask=gok, other=0).to(tl.int64)
    cols = tl.reshape(g[:, None] * SB + tl.arange(0, SB)[None, :], [GN * SB])
    cm = tl.reshape(gok[:, None] & (tl.arange(0, SB)[None, :] >= 0), [GN * SB]) & (cols < V)
    xv = tl.load(x_ptr + row * V + cols, mask=cm, other=float("-inf"))
    if W32:
        o = _ord32(xv)
    else:
        o = _ord16(xv).to(tl.int64)
    cand = cm & (o >= thr)
    return tl.where(cand, ((OMAX - o) << 31) | cols, _MAXKEY), cand


@triton.jit
def _sk_select(x_ptr, pm_ptr, ps_ptr, sbm_ptr, gsc_ptr, csc_ptr, lse_ptr, lp_ptr, ids_ptr, K, NCH,
               NSB, CAP, V: tl.constexpr, SB: tl.constexpr, SPC: tl.constexpr, W32: tl.constexpr,
               NCHP: tl.constexpr, NSBP: tl.constexpr, GS: tl.constexpr, GRP: tl.constexpr,
               CAPP: tl.constexpr, KP: tl.constexpr, ROUNDS: tl.constexpr):
    """Grid (R,). lse [R] f32 from the partials (the bound prep's formula); the K best
    sub-blocks' indices through gsc [R, GS] (scratch), their elements >= thr through csc
    [R, CAP] int64 (scratch), GRP sub-blocks at a time -> ids [R, K] int64, lp [R, K] f32 (see
    the section comment). sbm [R, NSB]: int32 16-bit images (W32 False) or int64 32-bit ones
    (W32 True), -1 = empty; SPC sub-blocks per pass-A chunk."""
    row = tl.program_id(0).to(tl.int64)
    lse = _lse_from_partials(pm_ptr, ps_ptr, row, NCH, NCHP)
    tl.store(lse_ptr + row, lse)
    sj = tl.arange(0, NSBP)
    v = tl.load(sbm_ptr + row * NSB + sj, mask=sj < NSB, other=-1).to(tl.int64)
    if W32:
        omax: tl.constexpr = 4294967295
    else:
        omax: tl.constexpr = 65535
    lo = _kth_sub_block_max(v, K, NCH, omax, SPC, NSBP, ROUNDS)
    real = v >= 0
    enough = tl.sum(real.to(tl.int32), axis=0) >= K
    thr = tl.where(enough, lo, 0)
    eq = v == thr
    need = K - tl.sum((v > thr).to(tl.int32), axis=0)
    sel = (v > thr) | (eq & (tl.cumsum(eq.to(tl.int32), axis=0) <= need))
    sel = tl.where(enough, sel, real)  # K sub-blocks, or every non-empty one when fewer
    nsel = tl.sum(sel.to(tl.int32), axis=0)
    tl.store(gsc_ptr + row * GS + tl.where(sel, tl.cumsum(sel.to(tl.int32), axis=0) - 1, 0), sj, mask=sel)
    tl.debug_barrier()  # the indices were written across lanes
    # candidates GRP sub-blocks at a time (GRP * SB lanes live, not GS * SB: more rows per SM)
    n = tl.zeros([], tl.int32)
    for gi in range(GS // GRP):
        key, cand = _sk_gather(x_ptr, gsc_ptr, row, gi * GRP, nsel, thr, omax, GRP, GS, SB, V, W32)
        pos = n + tl.cumsum(cand.to(tl.int32), axis=0) - 1
        tl.store(csc_ptr + row * CAP + tl.where(cand, pos, 0), key, mask=cand & (pos < CAP))
        n += tl.sum(cand.to(tl.int32), axis=0)
    tl.debug_barrier()  # the keys were written across lanes
    if n <= CAP:
        jj = tl.arange(0, CAPP)
        ck = tl.load(csc_ptr + row * CAP + jj, mask=jj < n, other=_MAXKEY)
        top = tl.min(tl.reshape(tl.sort(ck), [CAPP // KP, KP]), axis=0)
        _sk_write(x_ptr, lp_ptr, ids_ptr, row, top, lse, K, V, KP)
    else:  # heavy ties at thr: sort every gathered key
        key, cand = _sk_gather(x_ptr, gsc_ptr, row, 0, nsel, thr, omax, GS, GS, SB, V, W32)
        top = tl.min(tl.reshape(tl.sort(key), [GS * SB // KP, KP]), axis=0)
        _sk_write(x_ptr, lp_ptr, ids_ptr, row, top, lse, K, V, KP)


def topk_small_triton(x: torch.Tensor, k: int, chunk: int = 4096, sub_block: int = 128, cap: int = 256):
    """Exact per-row top-k under the tie rule (value desc, id asc) for k <= ``SMALL_K_MAX``,
    reading each logit once (see the section comment); for bf16 / fp16 the same lp, ids and lse
    as ``topk_bound_triton`` (lse bit-identical: the same partials and combine).

    x: [R, V] bf16 / fp16 / fp32 (made contiguous), V < 2**31; 1 <= k <= min(V, 32); chunk:
    columns per pass-A program (a power of 2 in [64, 16384]); sub_block: elements per sub-block
    maximum (a power of 2 dividing chunk; the row program gathers next_pow2(k) of them); cap:
    candidate slots per row (>= k) before a row sorts all of its gathered keys instead. Returns
    lp [R, k] f32 (min(x - lse, 0), non-increasing), ids [R, k] int64, lse [R] f32 (for fp32 as
    the chunked prep's partials: equal to ``torch.logsumexp`` up to float32 rounding). 2
    launches, no host sync, CUDA-graph capturable. Raises ValueError for other dtypes or bad
    k / chunk / sub_block / cap, or more than 65,535 sub-blocks per row.
    """
    if x.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise ValueError(f"topk_small_triton needs bf16/fp16/fp32 logits, got {x.dtype}")
    R, V = x.shape
    if not 1 <= k <= min(V, SMALL_K_MAX):
        raise ValueError(f"topk_small_triton needs 1 <= k <= min(V, {SMALL_K_MAX}) = "
                         f"{min(V, SMALL_K_MAX)}, got k = {k}")
    if not (64 <= chunk <= 16384 and chunk & (chunk - 1) == 0):
        raise ValueError(f"chunk must be a power of 2 in [64, 16384], got {chunk}")
    if not (1 <= sub_block <= chunk and sub_block & (sub_block - 1) == 0):
        raise ValueError(f"sub_block must be a power of 2 dividing chunk = {chunk}, got {sub_block}")
    if cap < k:
        raise ValueError(f"cap must be >= k = {k}, got {cap}")
    if V >= 2**31:
        raise ValueError(f"V = {V}: ids must fit in 31 bits")
    NCH = triton.cdiv(V, chunk)
    NSB = NCH * (chunk // sub_block)
    if NSB >= 65536:
        raise ValueError(f"{NSB} sub-blocks per row: use a larger sub_block (the counts are 16-bit)")
    w32 = x.dtype == torch.float32
    KP = max(16, triton.next_power_of_2(k))
    GS = max(triton.next_power_of_2(k), triton.next_power_of_2(triton.cdiv(KP, sub_block)))
    CAPP = max(KP, triton.next_power_of_2(cap))
    dev = x.device
    x = x.contiguous()
    pm = torch.empty((R, NCH), dtype=torch.float32, device=dev)
    ps = torch.empty_like(pm)
    sbm = torch.empty((R, NSB), dtype=torch.int64 if w32 else torch.int32, device=dev)
    gsc = torch.empty((R, GS), dtype=torch.int32, device=dev)
    csc = torch.empty((R, cap), dtype=torch.int64, device=dev)
    lse = torch.empty((R,), dtype=torch.float32, device=dev)
    lp = torch.empty((R, k), dtype=torch.float32, device=dev)
    ids = torch.empty((R, k), dtype=torch.int64, device=dev)
    if R == 0:
        return lp, ids, lse
    _bd_pass_a[(R, NCH)](x, pm, ps, sbm, NCH, V=V, CH=chunk, SB=sub_block, W32=w32,
                         num_warps=PASS_A_WARPS)
    _sk_select[(R,)](x, pm, ps, sbm, gsc, csc, lse, lp, ids, k, NCH, NSB, cap, V=V, SB=sub_block,
                     SPC=chunk // sub_block, W32=w32, NCHP=max(16, triton.next_power_of_2(NCH)),
                     NSBP=max(16, triton.next_power_of_2(NSB)), GS=GS, GRP=min(GS, SK_GROUP), CAPP=CAPP,
                     KP=KP, ROUNDS=14 if w32 else 8, num_warps=SK_SELECT_WARPS)
    return lp, ids, lse
