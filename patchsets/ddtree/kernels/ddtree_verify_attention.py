"""DDTree's verify attention (Triton): the target's attention in one tree-verify pass.

Every request b verifies T_b = N + 1 tree tokens (the root: the bonus token, then the draft nodes).
Token t attends to the request's committed KV prefix (P_b slots of the KV pool, all of it) and to
those tree tokens that are its ancestors or itself (SGLang's FULL_MASK ``custom_mask``, the tree
block of each row). SGLang's ``extend_attention_fwd`` computes the same thing one query head at a
time in tiles of 64-128 query rows: at T 16 most of each tile is padding and each KV head is read
once per query head sharing it (GQA), which is what made the tree's verify cost +16 % over the
chain's at batch 64 and the attention 37 of 63 ms of a 16-token verify on an H200
(bench/RESULTS.md, 2026-12-02 breakdown).

Here one program serves one (request, KV head, row block, KV split): its rows are (token, query
head of the group) pairs, so a tile of T 16 x 4 heads = 64 rows reads each K/V block once for all
the heads that share it. When the batch alone cannot fill the GPU the prefix is split across
programs (flash-decoding) and a second kernel merges the partial softmax states. The tree part runs
in the last split, with the mask read from ``custom_mask``; its prefix columns are not read: every
tree token sees the whole committed prefix, as SGLang's ``skip_prefix_custom_mask`` assumes too.

Without a mask the tree part is causal (token t sees tokens 0..t): a chain's verify — DFlash's own
step, which the DDTREE worker runs where its budget schedule says ``chain`` — takes the same kernel.

``tree_verify_attention_fwd`` has ``extend_attention_fwd``'s arguments (the subset a tree verify
uses); ``tree_verify_attention_supports`` says which calls it serves (no logit cap, sliding window,
sinks or scaled-FP8 KV; the same dtype for queries, new K/V and the pool). ``ddtree_verify_fwd`` is
what SGLang's triton backend calls for DDTREE's target verify (its ``verify_fwd`` protocol: True when
it ran, False to fall back to ``extend_attention_fwd``). Like the module's other
kernels it runs under ``TRITON_INTERPRET=1`` on CPU tensors (tests/unit/test_ddtree_verify_attention.py).
Depends on torch and Triton alone.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = [
    "ddtree_verify_fwd",
    "tree_verify_attention_fwd",
    "tree_verify_attention_supports",
    "tree_verify_kv_splits",
    "tree_verify_launch",
    "tree_verify_row_blocks",
]

_LOG2E = 1.4426950408889634
# Below this many programs (request x KV head x row block) the prefix is split across programs.
_MIN_PROGRAMS_PER_SM = 2
_MAX_KV_SPLITS = 16


@triton.jit
def _online_softmax_step(m_i, l_i, acc, s, v):
    """Fold one key block into a row block's running softmax state (flash attention's online
    softmax, base 2): s [BLOCK_M, BLOCK_N] scaled logits (-inf where unseen), v [BLOCK_N, BLOCK_DV].
    A row that has seen no key yet keeps m = -inf, l = 0, acc = 0."""
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.math.exp2(s - m_use[:, None])
    alpha = tl.math.exp2(m_i - m_use)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
    return m_new, l_i * alpha + tl.sum(p, 1), acc


@triton.jit
def _tree_verify_attn_kernel(
    Q, K_new, V_new, O, K_buf, V_buf,
    qo_indptr, kv_indptr, kv_indices, custom_mask, mask_indptr,
    Acc, Ml,  # fp32 partial states [bs * MB, Hkv, SPLITS, BLOCK_M, BLOCK_DV] and [..., BLOCK_M, 2]
    qk_scale,  # sm_scale * log2(e)
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_ot, stride_oh,
    stride_kbt, stride_kbh, stride_vbt, stride_vbh,
    n_kv_heads,
    G: tl.constexpr,  # query heads per KV head
    MB: tl.constexpr,  # row blocks per request
    SPLITS: tl.constexpr,
    D: tl.constexpr, DV: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
    BLOCK_T: tl.constexpr,  # keys per step of the tree part (BLOCK_N: of the prefix)
    ANCESTORS_FIRST: tl.constexpr,
    CAUSAL: tl.constexpr,  # no custom_mask: token t sees tree tokens 0..t (a chain's verify)
    FOLD_G: tl.constexpr,  # G a power of two dividing BLOCK_M: read each token's mask row once
):
    pid = tl.program_id(0)
    kvh = tl.program_id(1)
    sid = tl.program_id(2)
    b = pid // MB
    mb = pid % MB
    q_start = tl.load(qo_indptr + b).to(tl.int64)
    T = tl.load(qo_indptr + b + 1).to(tl.int64) - q_start
    kv_start = tl.load(kv_indptr + b).to(tl.int64)
    P = tl.load(kv_indptr + b + 1).to(tl.int64) - kv_start

    rows = mb * BLOCK_M + tl.arange(0, BLOCK_M)
    t = rows // G
    qh = kvh * G + rows % G
    row_ok = t < T
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    offs_n = tl.arange(0, BLOCK_N)
    d_ok = offs_d < D
    dv_ok = offs_dv < DV
    q = tl.load(Q + (q_start + t)[:, None] * stride_qt + qh[:, None] * stride_qh + offs_d[None, :],
                mask=row_ok[:, None] & d_ok[None, :], other=0.0)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], tl.float32)

    # The committed prefix, this split's share of it (no mask: every tree token sees all of it).
    chunk = tl.cdiv(tl.cdiv(P, SPLITS), BLOCK_N) * BLOCK_N
    lo = sid * chunk
    hi = tl.minimum(lo + chunk, P)
    for start in range(lo, hi, BLOCK_N):
        n = start + offs_n
        n_ok = n < hi
        slot = tl.load(kv_indices + kv_start + n, mask=n_ok, other=0).to(tl.int64)
        k = tl.load(K_buf + slot[None, :] * stride_kbt + kvh * stride_kbh + offs_d[:, None],
                    mask=n_ok[None, :] & d_ok[:, None], other=0.0)
        s = tl.where(n_ok[None, :], tl.dot(q, k) * qk_scale, float("-inf"))
        v = tl.load(V_buf + slot[:, None] * stride_vbt + kvh * stride_vbh + offs_dv[None, :],
                    mask=n_ok[:, None] & dv_ok[None, :], other=0.0)
        m_i, l_i, acc = _online_softmax_step(m_i, l_i, acc, s, v)

    # The tree tokens: ancestors-or-self of each row, as custom_mask's tree block says (CAUSAL:
    # tokens 0..t, the chain's).
    if sid == SPLITS - 1:
        row_len = P + T
        if CAUSAL:
            m_base = 0
        else:
            m_base = tl.load(mask_indptr + b).to(tl.int64)
        if ANCESTORS_FIRST or CAUSAL:  # ancestors precede a node: this block's rows see keys <= its last t
            j_end = tl.minimum(T, (mb * BLOCK_M + BLOCK_M - 1) // G + 1)
        else:
            j_end = T
        offs_t = tl.arange(0, BLOCK_T)
        for start in range(0, j_end, BLOCK_T):
            j = start + offs_t
            j_ok = j < j_end
            k = tl.load(K_new + (q_start + j)[None, :] * stride_kt + kvh * stride_kh + offs_d[:, None],
                        mask=j_ok[None, :] & d_ok[:, None], other=0.0)
            if CAUSAL:
                seen = (j[None, :] <= t[:, None]) & row_ok[:, None] & j_ok[None, :]
            elif FOLD_G:  # one mask row per token, shared by the G rows of its query heads
                tq = (mb * BLOCK_M) // G + tl.arange(0, BLOCK_M // G)
                seen_t = tl.load(custom_mask + m_base + tq[:, None] * row_len + P + j[None, :],
                                 mask=(tq < T)[:, None] & j_ok[None, :], other=0)
                seen = tl.reshape(tl.broadcast_to(seen_t[:, None, :], (BLOCK_M // G, G, BLOCK_T)),
                                  (BLOCK_M, BLOCK_T)) != 0
            else:
                seen = tl.load(custom_mask + m_base + t[:, None] * row_len + P + j[None, :],
                               mask=row_ok[:, None] & j_ok[None, :], other=0) != 0
            s = tl.where(seen, tl.dot(q, k) * qk_scale, float("-inf"))
            v = tl.load(V_new + (q_start + j)[:, None] * stride_vt + kvh * stride_vh + offs_dv[None, :],
                        mask=j_ok[:, None] & dv_ok[None, :], other=0.0)
            m_i, l_i, acc = _online_softmax_step(m_i, l_i, acc, s, v)

    if SPLITS == 1:
        out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
        tl.store(O + (q_start + t)[:, None] * stride_ot + qh[:, None] * stride_oh + offs_dv[None, :],
                 out.to(O.dtype.element_ty), mask=row_ok[:, None] & dv_ok[None, :])
    else:
        part = (pid.to(tl.int64) * n_kv_heads + kvh) * SPLITS + sid
        r = tl.arange(0, BLOCK_M)
        tl.store(Acc + (part * BLOCK_M + r)[:, None] * BLOCK_DV + offs_dv[None, :], acc)
        tl.store(Ml + (part * BLOCK_M + r) * 2, m_i)
        tl.store(Ml + (part * BLOCK_M + r) * 2 + 1, l_i)


@triton.jit
def _tree_verify_merge_kernel(
    O, Acc, Ml, qo_indptr,
    stride_ot, stride_oh,
    n_kv_heads,
    G: tl.constexpr, MB: tl.constexpr, SPLITS: tl.constexpr, DV: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_DV: tl.constexpr,
):
    pid = tl.program_id(0)
    kvh = tl.program_id(1)
    b = pid // MB
    mb = pid % MB
    q_start = tl.load(qo_indptr + b).to(tl.int64)
    T = tl.load(qo_indptr + b + 1).to(tl.int64) - q_start
    r = tl.arange(0, BLOCK_M)
    rows = mb * BLOCK_M + r
    t = rows // G
    qh = kvh * G + rows % G
    row_ok = t < T
    offs_dv = tl.arange(0, BLOCK_DV)

    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], tl.float32)
    for s in range(SPLITS):
        part = (pid.to(tl.int64) * n_kv_heads + kvh) * SPLITS + s
        m_s = tl.load(Ml + (part * BLOCK_M + r) * 2)
        l_s = tl.load(Ml + (part * BLOCK_M + r) * 2 + 1)
        a_s = tl.load(Acc + (part * BLOCK_M + r)[:, None] * BLOCK_DV + offs_dv[None, :])
        m_new = tl.maximum(m, m_s)
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)  # every split so far empty
        w_old = tl.math.exp2(m - m_use)
        w_s = tl.math.exp2(m_s - m_use)
        acc = acc * w_old[:, None] + a_s * w_s[:, None]
        l = l * w_old + l_s * w_s
        m = m_new
    out = acc / tl.where(l == 0.0, 1.0, l)[:, None]
    tl.store(O + (q_start + t)[:, None] * stride_ot + qh[:, None] * stride_oh + offs_dv[None, :],
             out.to(O.dtype.element_ty), mask=row_ok[:, None] & (offs_dv < DV)[None, :])


def tree_verify_row_blocks(max_len_extend: int, group: int) -> tuple[int, int]:
    """(rows per program, row blocks per request) for verify width ``max_len_extend`` (tokens per
    request) and ``group`` query heads per KV head: a request's T x group rows in blocks of 16-128."""
    rows = max(1, int(max_len_extend)) * group
    block_m = max(16, min(128, triton.next_power_of_2(rows)))
    return block_m, triton.cdiv(rows, block_m)


def tree_verify_kv_splits(batch_size: int, n_kv_heads: int, row_blocks: int, sm_count: int) -> int:
    """How many programs share one request's prefix: 1 when batch x KV heads x row blocks already
    gives every SM two programs, else the power of two that does (at most 16). Depends on shapes
    only (never on the prefix lengths), so a CUDA graph captured at a batch size keeps it."""
    programs = max(1, batch_size * n_kv_heads * row_blocks)
    want = triton.cdiv(_MIN_PROGRAMS_PER_SM * max(1, sm_count), programs)
    return 1 if want <= 1 else min(_MAX_KV_SPLITS, triton.next_power_of_2(want))


def tree_verify_launch(block_m: int, row_blocks: int, programs: int) -> tuple[int, int, int, int]:
    """(prefix keys per step BLOCK_N, warps, pipeline stages, tree keys per step BLOCK_T) for row
    blocks of ``block_m`` rows, ``row_blocks`` of them per request and ``programs`` = requests x KV
    heads x row blocks (before any prefix split). From H200 sweeps (Qwen3-8B heads, bs 1-64, T
    16-65: bench/results/2026-12-03-h200-verify-attention*.md, 2026-12-04-h200-verify-attention-block-t.md),
    the best of each row: 64-row blocks 32 keys on 4 warps, 64 keys in 3 stages from 512 programs
    on, the tree part 16 keys a step (at T 16 its 32-key step cost the tree 1.4x the causal verify
    at bs 16); 128-row blocks 32 keys on 4 warps from 1,024 programs on, else 32 keys on 8 warps with
    16-key tree steps (two row blocks, or under 128 programs) or 128 keys with 32-key tree steps."""
    if block_m < 128:
        return (64, 4, 3, 16) if programs >= 512 else (32, 4, 2, 16)
    if programs >= 1024:
        return 32, 4, 2, 32
    return (32, 8, 2, 16) if row_blocks <= 2 or programs < 128 else (128, 8, 2, 32)


def tree_verify_attention_supports(q: torch.Tensor, k_buffer: torch.Tensor, *, logit_cap: float = 0.0,
                                   sliding_window_size: int = -1, sinks: torch.Tensor | None = None,
                                   k_descale: float = 1.0, v_descale: float = 1.0) -> bool:
    """Whether ``tree_verify_attention_fwd`` computes this call exactly as ``extend_attention_fwd``
    would (up to floating-point order): no logit cap, sliding window, attention sinks or scaled KV,
    the pool in the queries' dtype (bf16/fp16/fp32) and whole heads (q [S, Hq, D] with Hq a multiple
    of the pool's KV heads). The caller falls back to ``extend_attention_fwd`` otherwise."""
    if logit_cap and logit_cap > 0:
        return False
    if sliding_window_size is not None and sliding_window_size > 0:
        return False
    if sinks is not None or k_descale != 1.0 or v_descale != 1.0:
        return False
    if q.dtype not in (torch.bfloat16, torch.float16, torch.float32) or k_buffer.dtype != q.dtype:
        return False
    if q.dim() != 3 or k_buffer.dim() != 3 or q.shape[1] % k_buffer.shape[1] != 0:
        return False
    return q.stride(-1) == 1 and k_buffer.stride(-1) == 1


def tree_verify_attention_fwd(
    q_extend: torch.Tensor,
    k_extend: torch.Tensor,
    v_extend: torch.Tensor,
    o_extend: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    qo_indptr: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    custom_mask: torch.Tensor | None,
    mask_indptr: torch.Tensor | None,
    max_len_extend: int,
    sm_scale: float | None = None,
    *,
    num_kv_splits: int | None = None,
    ancestors_first: bool = True,
    block_n: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
    block_t: int | None = None,
) -> None:
    """Tree-verify attention, written into ``o_extend``.

    Args (S = total tree tokens = qo_indptr[-1]; shapes as SGLang's ``extend_attention_fwd``):
      q_extend: [S, Hq, D]; k_extend / v_extend: [S, Hkv, D] / [S, Hkv, Dv], the tree tokens' own
        K/V; o_extend: [S, Hq, Dv] (written; same dtype as q). One dtype for q, K/V and the pool:
        bf16, fp16 or fp32.
      k_buffer / v_buffer: the layer's KV pool [slots, Hkv, D] / [slots, Hkv, Dv].
      qo_indptr: int32/int64 [bs + 1], the requests' token offsets (T_b = its differences).
      kv_indptr: int32/int64 [bs + 1]; kv_indices: int [kv_indptr[-1]] pool slots of each request's
        committed prefix, in order.
      custom_mask: flat bool/uint8, SGLang's FULL_MASK layout (``ddtree_tree.build_custom_mask``):
        request b's rows start at mask_indptr[b], row t is P_b + T_b entries (prefix, then tree).
        Only the tree columns are read; the prefix is taken as fully visible. None: causal — token
        t sees tokens 0..t of its request (a chain's verify, as ``extend_attention_fwd`` with
        ``is_causal`` and no mask).
      mask_indptr: int64 [bs + 1] (None with ``custom_mask`` None).
      max_len_extend: host int >= every T_b (the verify width N + 1); sets the row blocks.
      sm_scale: softmax scale (default D ** -0.5).
      num_kv_splits: programs sharing one prefix (default ``tree_verify_kv_splits`` for this
        device); a CUDA graph must keep the value it was captured with (it depends on shapes only).
      ancestors_first: the tree block is lower triangular (every node after its ancestors, as
        DDTree's depth-ordered labels are): each row block stops at its last row's column. False
        reads all T columns.
      block_n / num_warps / num_stages / block_t: launch knobs (prefix keys per step, warps,
        pipeline stages, tree keys per step); default ``tree_verify_launch``'s choice (block_t:
        its choice when block_n is not given either, else block_n).
    Raises:
      ValueError: a shape or dtype the kernel does not serve (``tree_verify_attention_supports``),
      or a ``custom_mask`` without its ``mask_indptr``.
    No host sync; allocates fp32 partial states [bs * row blocks, Hkv, splits, rows, Dv] when
    splits > 1.
    """
    if not (_same_layout(q_extend, k_extend, v_extend, o_extend, v_buffer)
            and tree_verify_attention_supports(q_extend, k_buffer)):
        raise ValueError(f"tree_verify_attention_fwd: unsupported call (q {tuple(q_extend.shape)} "
                         f"{q_extend.dtype}, pool {tuple(k_buffer.shape)} {k_buffer.dtype}); use extend_attention_fwd")
    if custom_mask is not None and mask_indptr is None:
        raise ValueError("tree_verify_attention_fwd: a custom_mask needs its mask_indptr (request b's rows start there)")
    _launch(q_extend, k_extend, v_extend, o_extend, k_buffer, v_buffer, qo_indptr, kv_indptr, kv_indices,
            custom_mask, mask_indptr, max_len_extend, sm_scale, num_kv_splits=num_kv_splits,
            ancestors_first=ancestors_first, block_n=block_n, num_warps=num_warps, num_stages=num_stages,
            block_t=block_t)


def _folds(group: int, block_m: int) -> bool:
    """Whether a row block reads one mask row per token (``FOLD_G``): ``group`` query heads per KV
    head a power of two (> 1) dividing ``block_m``."""
    return group > 1 and group & (group - 1) == 0 and block_m % group == 0


def _same_layout(q: torch.Tensor, *others: torch.Tensor) -> bool:
    """The other tensors in q's dtype, each with a contiguous last dimension (the kernel's loads)."""
    return all(x.dtype == q.dtype and x.stride(-1) == 1 for x in others)


def _launch(q_extend: torch.Tensor, k_extend: torch.Tensor, v_extend: torch.Tensor, o_extend: torch.Tensor,
            k_buffer: torch.Tensor, v_buffer: torch.Tensor, qo_indptr: torch.Tensor, kv_indptr: torch.Tensor,
            kv_indices: torch.Tensor, custom_mask: torch.Tensor | None, mask_indptr: torch.Tensor | None,
            max_len_extend: int, sm_scale: float | None, *, num_kv_splits: int | None,
            ancestors_first: bool, block_n: int | None, num_warps: int | None,
            num_stages: int | None, block_t: int | None = None) -> None:
    """``tree_verify_attention_fwd`` after its checks (the caller has made them)."""
    S, Hq, D = q_extend.shape
    Hkv, Dv = v_buffer.shape[1], v_buffer.shape[2]
    bs = qo_indptr.numel() - 1
    if bs <= 0 or S == 0:
        return
    G = Hq // Hkv
    BLOCK_M, MB = tree_verify_row_blocks(max_len_extend, G)
    BLOCK_D, BLOCK_DV = triton.next_power_of_2(D), triton.next_power_of_2(Dv)
    if num_kv_splits is None:
        sms = torch.cuda.get_device_properties(q_extend.device).multi_processor_count \
            if q_extend.is_cuda else 1
        num_kv_splits = tree_verify_kv_splits(bs, Hkv, MB, sms)
    splits = max(1, int(num_kv_splits))
    knob_n, knob_w, knob_s, knob_t = tree_verify_launch(BLOCK_M, MB, bs * MB * Hkv)
    block_t = block_t or (block_n if block_n else knob_t)
    block_n, num_warps, num_stages = block_n or knob_n, num_warps or knob_w, num_stages or knob_s
    if splits > 1:
        acc = torch.empty(bs * MB * Hkv * splits * BLOCK_M * BLOCK_DV, dtype=torch.float32, device=q_extend.device)
        ml = torch.empty(bs * MB * Hkv * splits * BLOCK_M * 2, dtype=torch.float32, device=q_extend.device)
    else:
        acc = ml = o_extend  # not touched by the kernel
    scale = (D ** -0.5 if sm_scale is None else float(sm_scale)) * _LOG2E
    causal = custom_mask is None
    if causal:  # the kernel reads neither: any int tensor stands in for the pointers
        mask, mask_indptr = qo_indptr, qo_indptr
    else:
        mask = custom_mask.view(torch.uint8) if custom_mask.dtype == torch.bool else custom_mask
    _tree_verify_attn_kernel[(bs * MB, Hkv, splits)](
        q_extend, k_extend, v_extend, o_extend, k_buffer, v_buffer,
        qo_indptr, kv_indptr, kv_indices, mask, mask_indptr,
        acc, ml, scale,
        q_extend.stride(0), q_extend.stride(1), k_extend.stride(0), k_extend.stride(1),
        v_extend.stride(0), v_extend.stride(1), o_extend.stride(0), o_extend.stride(1),
        k_buffer.stride(0), k_buffer.stride(1), v_buffer.stride(0), v_buffer.stride(1),
        Hkv,
        G=G, MB=MB, SPLITS=splits, D=D, DV=Dv,
        BLOCK_M=BLOCK_M, BLOCK_N=block_n, BLOCK_D=BLOCK_D, BLOCK_DV=BLOCK_DV, BLOCK_T=block_t,
        ANCESTORS_FIRST=ancestors_first, CAUSAL=causal, FOLD_G=_folds(G, BLOCK_M),
        num_warps=num_warps, num_stages=num_stages,
    )
    if splits > 1:
        _tree_verify_merge_kernel[(bs * MB, Hkv)](
            o_extend, acc, ml, qo_indptr, o_extend.stride(0), o_extend.stride(1), Hkv,
            G=G, MB=MB, SPLITS=splits, DV=Dv, BLOCK_M=BLOCK_M, BLOCK_DV=BLOCK_DV, num_warps=4,
        )


def ddtree_verify_fwd(
    q_extend: torch.Tensor,
    k_extend: torch.Tensor,
    v_extend: torch.Tensor,
    o_extend: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    qo_indptr: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    custom_mask: torch.Tensor | None,
    is_causal: bool,
    mask_indptr: torch.Tensor | None,
    max_len_extend: int,
    k_descale: float = 1.0,
    v_descale: float = 1.0,
    sm_scale: float | None = None,
    *,
    logit_cap: float = 0.0,
    sliding_window_size: int = -1,
    sinks: torch.Tensor | None = None,
    window_kv_offsets: torch.Tensor | None = None,
    xai_temperature_len: int = -1,
    **_backend_extras: object,
) -> bool:
    """SGLang triton backend's target-verify hook for DDTREE (the arguments its ``forward_extend``
    passes to a ``verify_fwd``). Runs ``tree_verify_attention_fwd`` and returns True when the call
    is a tree verify (a ``custom_mask`` with its ``mask_indptr``) or a chain step's causal verify
    (no mask, ``is_causal``: DFlash's own step inside the DDTREE worker) and has nothing the kernel
    does not serve (see ``tree_verify_attention_supports``; also no sliding-window offsets or xAI
    temperature); else returns False without writing, and the backend runs
    ``extend_attention_fwd`` (e.g. a non-causal call without a mask). Extra keyword arguments
    (``max_bs``) are ignored."""
    if window_kv_offsets is not None:
        return False
    if custom_mask is None and not is_causal:
        return False
    if custom_mask is not None and mask_indptr is None:
        return False
    if xai_temperature_len is not None and xai_temperature_len > 0:
        return False
    if not (_same_layout(q_extend, k_extend, v_extend, o_extend, v_buffer)
            and tree_verify_attention_supports(q_extend, k_buffer, logit_cap=logit_cap,
                                               sliding_window_size=sliding_window_size, sinks=sinks,
                                               k_descale=k_descale, v_descale=v_descale)):
        return False
    _launch(q_extend, k_extend, v_extend, o_extend, k_buffer, v_buffer, qo_indptr, kv_indptr, kv_indices,
            custom_mask, mask_indptr, max_len_extend, sm_scale, num_kv_splits=None, ancestors_first=True,
            block_n=None, num_warps=None, num_stages=None)
    return True
