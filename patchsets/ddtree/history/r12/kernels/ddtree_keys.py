"""The packed keys and counts that DDTree's Triton kernels share (CUDA; also under
``TRITON_INTERPRET=1`` on CPU tensors).

A tree key is one int64: its primary (a score's float32 bits, order-inverted so that a larger
score gives a smaller key, plus 2**32 when the entry is invalid) shifted left by ``_SUB_BITS``, and
a 30-bit sub below it (depth * N + position, or a candidate's packed (parent, rank)): ascending
keys are the tree's order (score desc, then sub asc). ``_desc_key`` builds them in the beams
(``ddtree_beam``), the labelling reads them back (``ddtree_verify_inputs``), ``_MAXKEY`` pads
unused lanes everywhere (also the top-K preps' value keys, ``ddtree_prep``). The torch twin of the
key is ``ddtree_tree.desc_key`` (sglang/srt/speculative/).

``_packed_count4`` / ``_fields_at_least`` count four thresholds in one reduction: the 5-ary
searches of the beam's selection (``ddtree_beam._select_smallest``) and of the bound and small-K
preps' K-th sub-block maximum (``ddtree_prep._bd_combine_a``, ``ddtree_prep._sk_select``).

Depends on Triton alone.
"""

from __future__ import annotations

import triton
import triton.language as tl

__all__ = ["_SUB_BITS", "_MAXKEY", "_desc_key", "_packed_count4", "_fields_at_least"]

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
def _packed_count4(c1, c2, c3, c4):
    """Four lane counts (bool tensors, each count < 2**16) in ONE int64 reduction, 16 bits apart."""
    return tl.sum(c1.to(tl.int64) + (c2.to(tl.int64) << 16) + (c3.to(tl.int64) << 32)
                  + (c4.to(tl.int64) << 48), axis=0)


@triton.jit
def _fields_at_least(c, n):
    """How many of the four 16-bit counts packed in c (``_packed_count4``) are >= n (int64)."""
    return ((((c & 65535) >= n).to(tl.int64) + (((c >> 16) & 65535) >= n).to(tl.int64))
            + ((((c >> 32) & 65535) >= n).to(tl.int64) + (((c >> 48) & 65535) >= n).to(tl.int64)))

