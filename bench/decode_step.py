"""Benchmark: the whole DFLASH / DDTREE decode step around a Qwen3-8B-shaped target (issue 17).

What one decode step runs, per request, for each arm (every phase a CUDA graph, timed by replays):

  draft   DFlash's draft forward: the block [bonus, MASK x (B-1)] (B = 16) through a DFlash-shaped
          drafter (``--draft-layers``, default 5, Qwen3 layers of the target's sizes) attending
          non-causally to the committed context's draft KV and to the block, then the target's LM
          head on the B - 1 mask positions -> draft logits [bs, 15, 151,936]. The same for both arms.
  build   DFLASH: per-depth argmax -> the chain [bonus, 15 drafts] and its positions.
          DDTREE: this repo's ``ddtree_info.build_tree_from_logits`` (the Triton tree kernels, K = N)
          and ``prepare_verify_tensors`` (depth positions, SGLang's FULL_MASK ``custom_mask``).
  verify  the target forward over T tokens per request (DFLASH: T = 16, causal; DDTREE: T = N + 1
          with the tree mask), KV context ``--context`` (1,024) per request, writing the T tokens' KV,
          capturing the hidden states of 5 layers for the drafter, full-vocabulary logits at every
          token and their argmax (greedy verify).
  post    DFLASH: the chain's accept (prefix match, bonus, output rows), no KV move.
          DDTREE: ``finish_verify_tensors`` (the Triton greedy walk, output rows, KV-move pairs,
          accepted hidden rows) and the KV compaction of the accepted path in all target layers.
          Both: the committed tokens' target hidden states -> the drafter's fc, hidden norm and the
          K/V of every draft layer into the draft KV cache (DFlash's "append target hidden").
  step    the four graphs replayed back to back (the figure that counts).

Target: ``--layers`` 36, hidden 4096, 32 query / 8 KV heads of 128, MLP 12,288, vocabulary 151,936,
bf16, random weights (Qwen3: q/k RMSNorm per head, neox RoPE theta 1e6). Layers are written as an
optimized engine runs them: cuBLAS GEMMs (fused QKV and gate-up), three small Triton kernels of this
file (fused add + RMSNorm; q/k-norm + RoPE + KV-cache store; SiLU-and-mul) and attention from
SGLang 0.5.23's own triton ``extend_attention_fwd`` (``--attn sglang``: the kernel source verbatim
from the wheel, given as the wheel or a zip of its ``sglang/kernels/ops/attention/{extend_attention,
decode_attention,score_mod}.py``; the two helpers it imports from ``sglang.srt`` — platform checks
and env flags — are stubbed with their CUDA defaults, or the real package is used when it imports)
with the tree ``custom_mask`` for DDTREE, causal for DFLASH and non-causal for the drafter, exactly
as SGLang's triton backend calls it; ``--tree-attn ddtree`` runs DDTREE's tree-masked verify
through DDTree's own ``tree_verify_attention_fwd`` instead (bench/verify_attention.py times the two
kernels alone), and ``--chain-attn ddtree`` the chain's causal verify too (the DFLASH arm then is
a DDTREE server's chain step, ddtree revision 12 on, not DFLASH as SGLang runs it). ``--attn sdpa`` is torch SDPA with a dense mask (the CPU smoke
run and the reference of the correctness check).

Draft logits are made peaked as a trained drafter's are (``tests/support/ddtree.py``'s "peaked"
kind: N(0, 3^2) logits from the LM head, plus four tokens per row lifted by ~19/17/16/15 with one
``index_add_`` inside the draft graph, counted in both arms), so trees are deep, the costly case of
the builder. The post phase is timed alone on target picks that follow the draft (80 % per node:
real walks and real KV moves); the whole-step replay verifies on the random target's own picks.
Every post-verify op has static shapes (all bs x B move pairs are copied, no-ops onto the dummy
slot), so its time does not depend on the acceptance.

Output: the table per batch (median step ms per arm and width, the phases, the verify alone against
DFLASH's), then the projected committed tokens/s ratio DDTREE / DFLASH for two acceptance curves
(``--project`` recomputes them from a JSON written earlier, no GPU):

  paper     Qwen3-8B MATH-500 (Ringel & Romano, arXiv 2604.12989): DFlash tau 7.79 at block 16,
            DDTree tau 10.73 at its best budget, taken as N = 512; in between the best N-node tree's
            expected accepted drafts rise linearly in log2 N from 6.79 at N = 15 (the floor tree,
            taken as no better than the chain: a lower bound) to 9.73 at N = 512 (the same curve as
            tests/unit/test_ddtree_budget.py's ``paper_like_accept``).
  fixtures  the tiny live CPU fixtures (bench/results/2026-12-02-cpu-live-accept-lengths.md, block 4):
            DFLASH tau 2.23; DDTREE budget 1 / 3 / 8: 1.64 / 2.27 / 2.61. Mapped to block 16 by the
            budget over the floor (N / 15 = n / 3), linear in log between measured points, held
            at 2.61 past n = 8 (no gain measured beyond it; budget 16 with top-2 gave 2.54).

and two DDTREE policies: (a) a fixed budget of 256; (b) the schedule ``ddtree_budget.best_budget_per_batch``
picks from the measured cost table over the measured budgets (floor B - 1 = 15, ceiling 256).

Cost table JSON (``--cost-out``; ``load_cost_model(path)`` returns a ``ddtree_budget.VerifyCostModel``):

  {"format": "sglpatch-ddtree-step-cost/1",
   "block_size": 16, "unit": "seconds",
   "draft_s": {"<batch>": s, ...},                       # the draft phase (budget-independent)
   "table": [{"batch": b, "tokens": N + 1, "budget": N, "seconds": s}, ...],
                                                       # DDTREE's step minus the draft phase:
                                                       # build + verify + post at that width
   "device": ..., "date": ..., "command": ..., "shape": {...}}

so ``VerifyCostModel.step_s(b, N + 1)`` is DDTREE's measured step at the measured points. The
schedule it gives is written as ``ddtree_budget.load_schedule``'s JSON file (``--schedule-out``).

Usage:
  python3 bench/decode_step.py --smoke                     # CPU, tiny shapes, eager, no graphs
  python3 bench/decode_step.py --sglang-src .gpu/sglang-0.5.23-attention-kernels.zip \\
      --warm-jobs 12 --out decode_step.json --cost-out cost.json --schedule-out schedule.json
  python3 bench/decode_step.py --project decode_step.json   # the projection tables again
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import json
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import asdict, dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from patchsets.ddtree.modules import ddtree_info as D  # noqa: E402
from patchsets.ddtree.modules.ddtree_budget import (  # noqa: E402
    CHAIN,
    AutoBudgetPlanner,
    batch_bucket,
    VerifyCostModel,
    best_budget_per_batch,
)
from patchsets.ddtree.modules.ddtree_tree import custom_mask_size  # noqa: E402

try:
    import triton
    import triton.language as tl

    HAVE_TRITON = True
except ImportError:  # pragma: no cover
    HAVE_TRITON = False

COST_FORMAT = "sglpatch-ddtree-step-cost/1"


# ---------------------------------------------------------------------------------------------
# Shapes
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Shape:
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    inter: int
    vocab: int
    draft_layers: int
    ctx_features: int
    block: int
    eps: float = 1e-6
    rope_theta: float = 1e6


QWEN3_8B = Shape(36, 4096, 32, 8, 128, 12288, 151_936, 5, 5, 16)
SMOKE = Shape(2, 64, 4, 2, 16, 128, 512, 1, 2, 16)


def capture_layers(n_layers: int, n_features: int) -> List[int]:
    """Target layers before which the drafter's context features are captured: DFlash's
    ``build_target_layer_ids`` (1 .. L-3, evenly) + 1 (SGLang captures "before layer i+1")."""
    if n_features == 1:
        ids = [n_layers // 2]
    elif n_layers - 3 >= 1:
        ids = [int(round(1 + i * (n_layers - 4) / (n_features - 1))) for i in range(n_features)]
    else:
        ids = [0] * n_features
    return [min(i + 1, n_layers - 1) for i in ids]


# ---------------------------------------------------------------------------------------------
# Small fused kernels (Triton on CUDA; torch elsewhere)
# ---------------------------------------------------------------------------------------------
if HAVE_TRITON:

    @triton.jit
    def _add_rmsnorm_kernel(x_ptr, res_ptr, w_ptr, out_ptr, n_cols, eps,
                            HAS_RES: tl.constexpr, WRITE_RES: tl.constexpr, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        offs = tl.arange(0, BLOCK)
        m = offs < n_cols
        x = tl.load(x_ptr + row * n_cols + offs, mask=m, other=0.0).to(tl.float32)
        if HAS_RES:
            x += tl.load(res_ptr + row * n_cols + offs, mask=m, other=0.0).to(tl.float32)
        if WRITE_RES:
            tl.store(res_ptr + row * n_cols + offs, x.to(res_ptr.dtype.element_ty), mask=m)
        var = tl.sum(x * x, axis=0) / n_cols
        w = tl.load(w_ptr + offs, mask=m, other=0.0).to(tl.float32)
        y = x * tl.rsqrt(var + eps) * w
        tl.store(out_ptr + row * n_cols + offs, y.to(out_ptr.dtype.element_ty), mask=m)

    @triton.jit
    def _qkv_post_kernel(qkv_ptr, stride_row, q_ptr, k_ptr, v_ptr, qw_ptr, kw_ptr, cos_ptr, sin_ptr,
                         pos_ptr, loc_ptr, kc_ptr, vc_ptr, eps,
                         HQ: tl.constexpr, HKV: tl.constexpr, HD: tl.constexpr, STORE_CACHE: tl.constexpr):
        t = tl.program_id(0).to(tl.int64)
        h = tl.program_id(1)
        HALF: tl.constexpr = HD // 2
        offs = tl.arange(0, HALF)
        src = qkv_ptr + t * stride_row + h * HD
        x1 = tl.load(src + offs).to(tl.float32)
        x2 = tl.load(src + HALF + offs).to(tl.float32)
        if h < HQ + HKV:
            r = tl.rsqrt((tl.sum(x1 * x1, axis=0) + tl.sum(x2 * x2, axis=0)) / HD + eps)
            if h < HQ:
                w1 = tl.load(qw_ptr + offs).to(tl.float32)
                w2 = tl.load(qw_ptr + HALF + offs).to(tl.float32)
            else:
                w1 = tl.load(kw_ptr + offs).to(tl.float32)
                w2 = tl.load(kw_ptr + HALF + offs).to(tl.float32)
            y1 = x1 * r * w1
            y2 = x2 * r * w2
            pos = tl.load(pos_ptr + t)
            c = tl.load(cos_ptr + pos * HALF + offs)
            s = tl.load(sin_ptr + pos * HALF + offs)
            o1 = y1 * c - y2 * s
            o2 = y2 * c + y1 * s
            if h < HQ:
                dst = q_ptr + (t * HQ + h) * HD
                tl.store(dst + offs, o1.to(q_ptr.dtype.element_ty))
                tl.store(dst + HALF + offs, o2.to(q_ptr.dtype.element_ty))
            else:
                hk = h - HQ
                dst = k_ptr + (t * HKV + hk) * HD
                tl.store(dst + offs, o1.to(k_ptr.dtype.element_ty))
                tl.store(dst + HALF + offs, o2.to(k_ptr.dtype.element_ty))
                if STORE_CACHE:
                    loc = tl.load(loc_ptr + t)
                    cd = kc_ptr + (loc * HKV + hk) * HD
                    tl.store(cd + offs, o1.to(kc_ptr.dtype.element_ty))
                    tl.store(cd + HALF + offs, o2.to(kc_ptr.dtype.element_ty))
        else:
            hv = h - HQ - HKV
            dst = v_ptr + (t * HKV + hv) * HD
            tl.store(dst + offs, x1.to(v_ptr.dtype.element_ty))
            tl.store(dst + HALF + offs, x2.to(v_ptr.dtype.element_ty))
            if STORE_CACHE:
                loc = tl.load(loc_ptr + t)
                cd = vc_ptr + (loc * HKV + hv) * HD
                tl.store(cd + offs, x1.to(vc_ptr.dtype.element_ty))
                tl.store(cd + HALF + offs, x2.to(vc_ptr.dtype.element_ty))

    @triton.jit
    def _silu_mul_kernel(gu_ptr, out_ptr, n_inter, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        cb = tl.program_id(1)
        offs = cb * BLOCK + tl.arange(0, BLOCK)
        m = offs < n_inter
        g = tl.load(gu_ptr + row * 2 * n_inter + offs, mask=m, other=0.0).to(tl.float32)
        u = tl.load(gu_ptr + row * 2 * n_inter + n_inter + offs, mask=m, other=0.0).to(tl.float32)
        y = g / (1.0 + tl.exp(-g)) * u
        tl.store(out_ptr + row * n_inter + offs, y.to(out_ptr.dtype.element_ty), mask=m)


class Ops:
    """The layer's small ops: Triton kernels (``use_triton``) or their torch equivalents."""

    def __init__(self, use_triton: bool, eps: float):
        self.use_triton = use_triton and HAVE_TRITON
        self.eps = eps

    def add_rmsnorm(self, x, res, w, out, *, has_res: bool, write_res: bool):
        """out = rmsnorm(x (+ res)) * w; res <- x (+ res) when write_res."""
        n = x.shape[-1]
        if self.use_triton:
            rows = x.numel() // n
            _add_rmsnorm_kernel[(rows,)](x, res if res is not None else x, w, out, n, self.eps,
                                        HAS_RES=has_res, WRITE_RES=write_res,
                                        BLOCK=triton.next_power_of_2(n), num_warps=8 if n >= 2048 else 4)
            return out
        s = x.float() + res.float() if has_res else x.float()
        if write_res:
            res.copy_(s)
        out.copy_(s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + self.eps) * w.float())
        return out

    def qkv_post(self, qkv, q, k, v, qw, kw, cos, sin, pos, loc, kc, vc, hq: int, hkv: int, hd: int):
        """q/k RMSNorm per head + neox RoPE at ``pos``; k, v out (and into the cache at ``loc``)."""
        T = qkv.shape[0]
        if self.use_triton:
            _qkv_post_kernel[(T, hq + 2 * hkv)](qkv, qkv.stride(0), q if q is not None else k, k, v, qw, kw,
                                                 cos, sin, pos, loc, kc, vc, self.eps,
                                                 HQ=hq, HKV=hkv, HD=hd, STORE_CACHE=True, num_warps=1)
            return
        x = qkv.float().view(T, hq + 2 * hkv, hd)
        half = hd // 2
        c = cos[pos][:, None, :]
        s = sin[pos][:, None, :]

        def norm_rope(y, w):
            y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + self.eps) * w.float()
            y1, y2 = y[..., :half], y[..., half:]
            return torch.cat([y1 * c - y2 * s, y2 * c + y1 * s], -1)

        if hq:
            q.copy_(norm_rope(x[:, :hq], qw))
        kk = norm_rope(x[:, hq:hq + hkv], kw)
        k.copy_(kk)
        v.copy_(x[:, hq + hkv:])
        kc[loc] = k
        vc[loc] = v

    def silu_mul(self, gu, out):
        n = out.shape[-1]
        if self.use_triton:
            blk = 1024
            _silu_mul_kernel[(gu.shape[0], triton.cdiv(n, blk))](gu, out, n, BLOCK=blk, num_warps=4)
            return out
        g, u = gu[:, :n].float(), gu[:, n:].float()
        out.copy_(F.silu(g) * u)
        return out


# ---------------------------------------------------------------------------------------------
# Attention: SGLang 0.5.23's triton extend kernel, or torch SDPA with a dense mask
# ---------------------------------------------------------------------------------------------
_SHIM_ENVIRON = '''"""Stub of sglang.srt.environ for the decode-step bench: every flag at its default."""
class _Flag:
    def __init__(self, default):
        self.default = default
    def get(self):
        return self.default
class _Envs:
    SGLANG_FORCE_LEAN_GRID_CU_MULT = _Flag(1.0)
    def __getattr__(self, name):
        return _Flag(False)
envs = _Envs()
'''
_SHIM_UTILS = '''"""Stub of the sglang.srt.utils platform checks the attention kernels import (CUDA values)."""
import torch
def is_cuda():
    return bool(torch.cuda.is_available() and torch.version.cuda)
def is_hip():
    return False
def is_gfx95_supported():
    return False
def is_gfx1250_supported():
    return False
def get_device_core_count(device_id: int = 0):
    return torch.cuda.get_device_properties(device_id).multi_processor_count if torch.cuda.is_available() else 0
'''
_KERNEL_FILES = ("extend_attention.py", "decode_attention.py", "score_mod.py")
_KERNEL_DIR = "sglang/kernels/ops/attention/"


def load_sglang_extend_attention(src: Optional[str]) -> Tuple[Callable, str]:
    """SGLang 0.5.23's ``extend_attention_fwd``: from the installed package when it imports, else
    from ``src`` (the wheel, or a zip holding ``sglang/kernels/ops/attention/{extend_attention,
    decode_attention,score_mod}.py``) into a temporary package whose ``sglang.srt.environ`` and
    ``sglang.srt.utils`` are stubs. Returns (function, description). Raises RuntimeError."""
    try:
        from sglang.kernels.ops.attention.extend_attention import extend_attention_fwd  # type: ignore

        return extend_attention_fwd, "sglang package (installed)"
    except Exception:  # noqa: BLE001
        pass
    if not src:
        raise RuntimeError("SGLang is not importable and no --sglang-src (wheel or kernel zip) was given")
    root = tempfile.mkdtemp(prefix="sgl_attn_")
    with zipfile.ZipFile(src) as z:
        for name in _KERNEL_FILES:
            data = z.read(_KERNEL_DIR + name)
            path = os.path.join(root, _KERNEL_DIR, name)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "wb") as f:
                f.write(data)
    for pkg in ("sglang", "sglang/kernels", "sglang/kernels/ops", "sglang/kernels/ops/attention", "sglang/srt"):
        os.makedirs(os.path.join(root, pkg), exist_ok=True)
        open(os.path.join(root, pkg, "__init__.py"), "a").close()
    with open(os.path.join(root, "sglang/srt/environ.py"), "w") as f:
        f.write(_SHIM_ENVIRON)
    with open(os.path.join(root, "sglang/srt/utils.py"), "w") as f:
        f.write(_SHIM_UTILS)
    # keep the DDTree kernels' names (bound to patchsets.ddtree.kernels by modules/__init__.py)
    for m in [m for m in sys.modules if (m == "sglang" or m.startswith("sglang."))
              and not m.startswith("sglang.kernels.ops.speculative.ddtree_")]:
        del sys.modules[m]
    sys.path.insert(0, root)
    mod = importlib.import_module("sglang.kernels.ops.attention.extend_attention")
    return mod.extend_attention_fwd, f"sglang 0.5.23 kernel source from {os.path.basename(src)} (platform/env helpers stubbed)"


@dataclass
class AttnMeta:
    """One attention call's batch layout: every request has ``P`` prefix tokens (in the pool at
    ``kv_indices``) and ``T`` new tokens (q/k/v rows ``b * T ..``)."""

    bs: int
    T: int
    P: int
    qo_indptr: torch.Tensor  # int32 [bs + 1]
    kv_indptr: torch.Tensor  # int32 [bs + 1]
    kv_indices: torch.Tensor  # int64 [bs * P]
    causal: bool
    custom_mask: Optional[torch.Tensor] = None  # flat bool, FULL_MASK layout
    mask_indptr: Optional[torch.Tensor] = None  # int64 [bs + 1]
    dense: Optional[torch.Tensor] = None  # bool [bs, T, T] (SDPA): the new tokens' own mask


class Attention:
    """``kind`` sglang (SGLang's extend kernel) or sdpa; ``tree_fn``: another kernel for the calls
    with a tree ``custom_mask`` (DDTREE's verify), e.g. DDTree's ``tree_verify_attention_fwd``;
    ``chain_fn``: for the causal calls without a mask (the chain's verify), the same signature
    (its mask arguments None)."""

    def __init__(self, kind: str, scale: float, extend_fn: Optional[Callable] = None,
                 tree_fn: Optional[Callable] = None, chain_fn: Optional[Callable] = None):
        self.kind, self.scale, self.extend_fn = kind, scale, extend_fn
        self.tree_fn, self.chain_fn = tree_fn, chain_fn

    def __call__(self, q, k, v, kc, vc, m: AttnMeta):
        own = self.tree_fn if m.custom_mask is not None else self.chain_fn if m.causal else None
        if own is not None:
            o = torch.empty_like(q)
            own(q, k, v, o, kc, vc, m.qo_indptr, m.kv_indptr, m.kv_indices, m.custom_mask,
                m.mask_indptr if m.custom_mask is not None else None, m.T, self.scale)
            return o
        if self.kind == "sglang":
            o = torch.empty_like(q)
            self.extend_fn(q, k, v, o, kc, vc, m.qo_indptr, m.kv_indptr, m.kv_indices, m.custom_mask,
                           m.causal, m.mask_indptr if m.mask_indptr is not None else m.qo_indptr.long(),
                           m.T, 1.0, 1.0, sm_scale=self.scale)
            return o
        return sdpa_attention(q, k, v, kc, vc, m, self.scale)


def sdpa_attention(q, k, v, kc, vc, m: AttnMeta, scale: float):
    bs, T, P = m.bs, m.T, m.P
    hq, hkv, hd = q.shape[1], k.shape[1], q.shape[2]
    idx = m.kv_indices.view(bs, P)
    kk = torch.cat([kc[idx], k.view(bs, T, hkv, hd)], 1).transpose(1, 2)
    vv = torch.cat([vc[idx], v.view(bs, T, hkv, hd)], 1).transpose(1, 2)
    qq = q.view(bs, T, hq, hd).transpose(1, 2)
    if m.dense is not None:
        own = m.dense
    elif m.causal:
        own = torch.tril(torch.ones(T, T, dtype=torch.bool, device=q.device)).expand(bs, T, T)
    else:
        own = torch.ones(bs, T, T, dtype=torch.bool, device=q.device)
    mask = torch.cat([torch.ones(bs, T, P, dtype=torch.bool, device=q.device), own], 2)[:, None]
    kk = kk.repeat_interleave(hq // hkv, dim=1)
    vv = vv.repeat_interleave(hq // hkv, dim=1)
    o = F.scaled_dot_product_attention(qq, kk, vv, attn_mask=mask, scale=scale)
    return o.transpose(1, 2).reshape(bs * T, hq, hd)


# ---------------------------------------------------------------------------------------------
# The model pair: target and DFlash-shaped drafter (random weights)
# ---------------------------------------------------------------------------------------------
class Models:
    def __init__(self, shape: Shape, device, *, attn: Attention, ops: Ops, bs_max: int, context: int,
                 max_width: int, seed: int = 0, dtype=torch.bfloat16):
        self.s, self.dev, self.attn, self.ops, self.dtype = shape, device, attn, ops, dtype
        s = shape
        self.hq, self.hkv, self.hd = s.heads, s.kv_heads, s.head_dim
        self.P = context
        self.W = max(s.block, max_width)  # KV window per request (max(B, N + 1))
        self.S = self.P + self.W  # slots per request
        self.slots = 1 + bs_max * self.S  # slot 0: the dummy slot
        g = torch.Generator(device=device).manual_seed(seed)

        def randn(*size, std=1.0):
            return torch.randn(*size, device=device, dtype=dtype, generator=g).mul_(std)

        H, I, V = s.hidden, s.inter, s.vocab
        qkv_out = (s.heads + 2 * s.kv_heads) * s.head_dim

        def layer():
            return dict(
                wqkv=randn(qkv_out, H, std=0.02), wo=randn(H, s.heads * s.head_dim, std=0.02),
                qn=torch.ones(s.head_dim, device=device, dtype=dtype),
                kn=torch.ones(s.head_dim, device=device, dtype=dtype),
                ln1=torch.ones(H, device=device, dtype=dtype), ln2=torch.ones(H, device=device, dtype=dtype),
                wgu=randn(2 * I, H, std=0.02), wd=randn(H, I, std=0.02),
            )

        self.embed = randn(V, H, std=1.0)
        self.lm_head = randn(V, H, std=3.0 / math.sqrt(H))  # N(0, 3^2) logits on unit-rms hidden
        self.final_norm = torch.ones(H, device=device, dtype=dtype)
        self.layers = [layer() for _ in range(s.layers)]
        self.draft = [layer() for _ in range(s.draft_layers)]
        self.fc = randn(H, s.ctx_features * H, std=0.02)
        self.hidden_norm = torch.ones(H, device=device, dtype=dtype)
        self.draft_norm = torch.ones(H, device=device, dtype=dtype)
        self.capture = capture_layers(s.layers, s.ctx_features)
        # KV pools [layers, slots, kv_heads, head_dim], random contents
        def pool(n):
            t = torch.empty(n, self.slots, s.kv_heads, s.head_dim, device=device, dtype=dtype)
            for i in range(n):  # per layer: no single > 2**31-element generator call
                t[i].normal_(generator=g)
            return t

        self.Kc, self.Vc = pool(s.layers), pool(s.layers)
        self.Kd, self.Vd = pool(s.draft_layers), pool(s.draft_layers)
        max_pos = self.P + self.W + 8
        inv = 1.0 / (s.rope_theta ** (torch.arange(0, s.head_dim, 2, device=device, dtype=torch.float32) / s.head_dim))
        ang = torch.arange(max_pos, device=device, dtype=torch.float32)[:, None] * inv[None, :]
        self.cos, self.sin = ang.cos().contiguous(), ang.sin().contiguous()
        self.mask_token = V - 1

    def weight_bytes(self) -> int:
        ts = [self.embed, self.lm_head, self.fc] + [t for l in self.layers + self.draft for t in l.values()]
        return sum(t.numel() * t.element_size() for t in ts)

    # one Qwen3 decoder layer ------------------------------------------------------------------
    def layer_forward(self, p, x, res, pos, loc, kc, vc, meta: AttnMeta, first: bool):
        T = x.shape[0]
        ops = self.ops
        h = torch.empty_like(x)
        ops.add_rmsnorm(x, res, p["ln1"], h, has_res=not first, write_res=True)
        qkv = F.linear(h, p["wqkv"])
        q = torch.empty(T, self.hq, self.hd, device=x.device, dtype=x.dtype)
        k = torch.empty(T, self.hkv, self.hd, device=x.device, dtype=x.dtype)
        v = torch.empty_like(k)
        ops.qkv_post(qkv, q, k, v, p["qn"], p["kn"], self.cos, self.sin, pos, loc, kc, vc, self.hq, self.hkv, self.hd)
        o = self.attn(q, k, v, kc, vc, meta)
        x = F.linear(o.view(T, self.hq * self.hd), p["wo"])
        h = torch.empty_like(x)
        ops.add_rmsnorm(x, res, p["ln2"], h, has_res=True, write_res=True)
        gu = F.linear(h, p["wgu"])
        a = torch.empty(T, self.s.inter, device=x.device, dtype=x.dtype)
        ops.silu_mul(gu, a)
        return F.linear(a, p["wd"])

    def target_forward(self, ids, pos, loc, meta: AttnMeta, aux_out: torch.Tensor) -> torch.Tensor:
        """Verify forward: returns the argmax of the full-vocabulary logits at every token and
        writes the captured hidden states [T, features * H] into ``aux_out``."""
        H = self.s.hidden
        x = F.embedding(ids, self.embed)
        res = torch.empty_like(x)
        for li, p in enumerate(self.layers):
            for j, c in enumerate(self.capture):
                if c == li:
                    if li == 0:
                        aux_out[:, j * H:(j + 1) * H].copy_(x)
                    else:
                        torch.add(x, res, out=aux_out[:, j * H:(j + 1) * H])
            x = self.layer_forward(p, x, res, pos, loc, self.Kc[li], self.Vc[li], meta, first=li == 0)
        h = torch.empty_like(x)
        self.ops.add_rmsnorm(x, res, self.final_norm, h, has_res=True, write_res=False)
        logits = F.linear(h, self.lm_head)
        return logits.argmax(-1)

    def draft_forward(self, ids, pos, loc, meta: AttnMeta, peak_idx, peak_val) -> torch.Tensor:
        """DFlash draft block -> logits [bs * (B - 1), V] of the mask positions (peaked)."""
        bs, B, H = meta.bs, self.s.block, self.s.hidden
        x = F.embedding(ids, self.embed)
        res = torch.empty_like(x)
        for li, p in enumerate(self.draft):
            x = self.layer_forward(p, x, res, pos, loc, self.Kd[li], self.Vd[li], meta, first=li == 0)
        h = torch.empty_like(x)
        self.ops.add_rmsnorm(x, res, self.draft_norm, h, has_res=True, write_res=False)
        hs = h.view(bs, B, H)[:, 1:].reshape(bs * (B - 1), H)
        logits = F.linear(hs, self.lm_head)
        logits.view(-1).index_add_(0, peak_idx, peak_val)
        return logits

    def draft_append(self, ctx_hidden, pos, loc):
        """DFlash's append of committed tokens' target hidden states to the draft KV cache:
        fc -> hidden norm -> per draft layer K/V projection, k-norm, RoPE, cache store."""
        h = F.linear(ctx_hidden, self.fc)
        hn = torch.empty_like(h)
        self.ops.add_rmsnorm(h, None, self.hidden_norm, hn, has_res=False, write_res=False)
        n = h.shape[0]
        qsz = self.hq * self.hd
        for li, p in enumerate(self.draft):
            kv = F.linear(hn, p["wqkv"][qsz:])
            k = torch.empty(n, self.hkv, self.hd, device=h.device, dtype=h.dtype)
            v = torch.empty_like(k)
            self.ops.qkv_post(kv, None, k, v, p["qn"], p["kn"], self.cos, self.sin, pos, loc,
                              self.Kd[li], self.Vd[li], 0, self.hkv, self.hd)

    def move_kv(self, tgt, src):
        """Compaction of the accepted path: every target layer's K and V rows src -> tgt."""
        for buf in (self.Kc, self.Vc):
            buf[:, tgt] = buf[:, src]


# ---------------------------------------------------------------------------------------------
# One batch's static state and the phases of each arm
# ---------------------------------------------------------------------------------------------
class Batch:
    def __init__(self, m: Models, bs: int, seed: int = 1):
        self.m, self.bs = m, bs
        dev, s = m.dev, m.s
        B, P = s.block, m.P
        g = torch.Generator(device=dev).manual_seed(seed + bs)
        self.g = g
        self.prefix = torch.full((bs,), P, dtype=torch.int64, device=dev)
        base = 1 + torch.arange(bs, device=dev, dtype=torch.int64) * m.S
        self.kv_indices = (base[:, None] + torch.arange(P, device=dev)).reshape(-1).contiguous()
        self.kv_indptr = torch.arange(0, (bs + 1) * P, P, device=dev, dtype=torch.int32)
        self.window = (base[:, None] + P + torch.arange(m.W, device=dev)).contiguous()  # [bs, W]
        # the draft block: [bonus, MASK x (B - 1)] at positions prefix + 0..B-1, KV into window[:, :B]
        self.block_ids = torch.full((bs, B), m.mask_token, dtype=torch.int64, device=dev)
        self.block_ids[:, 0] = torch.randint(0, s.vocab - 1, (bs,), generator=g, device=dev)
        self.block_pos = (self.prefix[:, None] + torch.arange(B, device=dev)).reshape(-1).contiguous()
        self.block_loc = self.window[:, :B].reshape(-1).contiguous()
        self.draft_meta = AttnMeta(bs, B, P, self.qo(B), self.kv_indptr, self.kv_indices, causal=False)
        # peaked draft logits: four lifted tokens per row (tests/support/ddtree.py "peaked")
        L, V = B - 1, s.vocab
        rows = bs * L
        tok = torch.randint(0, V, (rows, 4), generator=g, device=dev)
        self.peak_idx = (torch.arange(rows, device=dev)[:, None] * V + tok).reshape(-1)
        lift = torch.tensor([19.0, 17.0, 16.0, 15.0], device=dev)
        self.peak_val = (lift + 2 * torch.randn(rows, 4, generator=g, device=dev)).reshape(-1).to(m.dtype)
        self.aux_width = s.ctx_features * s.hidden

    def qo(self, T: int) -> torch.Tensor:
        return torch.arange(0, (self.bs + 1) * T, T, device=self.m.dev, dtype=torch.int32)

    def draft_fn(self):
        m = self.m
        return m.draft_forward(self.block_ids.reshape(-1), self.block_pos, self.block_loc, self.draft_meta,
                               self.peak_idx, self.peak_val)


class Arm:
    """The build / verify / post phases of one arm at one width, with static buffers."""

    def __init__(self, b: Batch, arm: str, width: int, logits: torch.Tensor):
        self.b, self.arm, self.T = b, arm, width
        m, bs, dev = b.m, b.bs, b.m.dev
        s = m.s
        self.B, self.L = s.block, s.block - 1
        self.logits = logits.view(bs, self.L, s.vocab)
        self.loc = b.window[:, :width].reshape(-1).contiguous()
        self.aux = None
        self.choice = None
        if arm == "dflash":
            assert width == s.block
            self.ids = torch.empty(bs, width, dtype=torch.int64, device=dev)
            self.pos = torch.empty(bs * width, dtype=torch.int64, device=dev)
            self.ar = torch.arange(width, device=dev)
            self.meta = AttnMeta(bs, width, m.P, b.qo(width), b.kv_indptr, b.kv_indices, causal=True)
        else:
            self.sizes = D.DDTreeSizes(s.block, width - 1, width - 1)
            self.pos_buf = torch.empty(bs * width, dtype=torch.int64, device=dev)
            self.mask_buf = torch.empty(custom_mask_size(bs * m.P, bs, width), dtype=torch.bool, device=dev)
            mi = torch.zeros(bs + 1, dtype=torch.int64, device=dev)
            mi[1:] = torch.cumsum(width * (b.prefix + width), 0)
            self.meta = AttnMeta(bs, width, m.P, b.qo(width), b.kv_indptr, b.kv_indices, causal=True,
                                 mask_indptr=mi)
            self.tree = None
        self.draft_loc = b.window[:, : self.B].reshape(-1).contiguous()
        self.draft_pos = b.block_pos

    # build ------------------------------------------------------------------------------------
    def build(self):
        b = self.b
        if self.arm == "dflash":
            drafts = self.logits.argmax(-1)
            self.ids[:, 0].copy_(b.block_ids[:, 0])
            self.ids[:, 1:].copy_(drafts)
            torch.add(b.prefix[:, None], self.ar, out=self.pos.view(b.bs, self.T))
            return self.ids, self.pos
        tree = D.build_tree_from_logits(self.logits, b.block_ids[:, 0], self.sizes)
        vi = D.prepare_verify_tensors(tree, b.prefix, positions_out=self.pos_buf, custom_mask_out=self.mask_buf,
                                      prefix_lens_sum=b.bs * b.m.P)
        return tree, vi

    def bind_build(self, out):
        """Point the verify inputs at the build phase's (captured) outputs."""
        if self.arm == "dflash":
            self.v_ids, self.v_pos = out[0].reshape(-1), out[1]
        else:
            self.tree, vi = out
            self.v_ids, self.v_pos = self.tree.tokens.reshape(-1), vi.positions
            self.meta.custom_mask = vi.custom_mask
            if self.b.m.attn.kind == "sdpa":
                self.meta.dense = self.tree.tree_mask

    # verify -----------------------------------------------------------------------------------
    def verify(self):
        b = self.b
        aux = torch.empty(b.bs * self.T, b.aux_width, device=b.m.dev, dtype=b.m.dtype)
        choice = b.m.target_forward(self.v_ids, self.v_pos, self.loc, self.meta, aux)
        return choice, aux

    def bind_verify(self, out):
        self.choice, self.aux = out

    # post -------------------------------------------------------------------------------------
    def post(self):
        b, m = self.b, self.b.m
        bs, B = b.bs, self.B
        if self.arm == "dflash":
            drafts = self.v_ids.view(bs, B)[:, 1:]
            ch = self.choice.view(bs, B)
            acc = (drafts == ch[:, :-1]).to(torch.int64).cumprod(-1).sum(-1)
            bonus = torch.gather(ch, 1, acc[:, None])
            out = torch.where(torch.arange(B - 1, device=m.dev)[None, :] < acc[:, None], drafts, 0)
            out = torch.cat([out, torch.zeros_like(bonus)], 1).scatter_(1, acc[:, None], bonus)
            commit = (acc + 1).to(torch.int32)
            new_seq = b.prefix + commit
            m.draft_append(self.aux[: bs * B], self.draft_pos, self.draft_loc)
            return out, commit, new_seq
        step = D.finish_verify_tensors(self.tree, self.choice.view(bs, self.T), b.prefix,
                                       b.window[:, : self.T], self.sizes)
        m.move_kv(step.kv_moves.tgt_loc, step.kv_moves.src_loc)
        ctx = self.aux.index_select(0, step.hidden_rows.reshape(-1))
        m.draft_append(ctx, step.draft_positions, self.draft_loc)
        return step.outputs.out_tokens, step.outputs.commit_lens, step.outputs.new_seq_lens

    def follow_choice(self, p: float = 0.8) -> torch.Tensor:
        """Target picks that follow the draft with probability p per node (real walks)."""
        b = self.b
        bs, dev, g = b.bs, b.m.dev, b.g
        V = b.m.s.vocab
        if self.arm == "dflash":
            nxt = torch.cat([self.v_ids.view(bs, self.B)[:, 1:], torch.zeros(bs, 1, dtype=torch.int64, device=dev)], 1)
        else:
            child = self.tree.retrieve_next_token.clamp(min=0)
            nxt = torch.gather(self.tree.tokens, 1, child)
        rnd = torch.randint(0, V, nxt.shape, generator=g, device=dev)
        return torch.where(torch.rand(nxt.shape, generator=g, device=dev) < p, nxt, rnd).reshape(-1)


# ---------------------------------------------------------------------------------------------
# Timing
# ---------------------------------------------------------------------------------------------
def capture(fn, warmup: int = 1):
    """Eager warm-up on a side stream, capture, one replay. Returns (graph, captured outputs)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = fn()
    g.replay()
    torch.cuda.synchronize()
    return g, out


def replay_ms(graphs: Sequence, reps: int, before: Optional[Callable] = None) -> List[float]:
    times = []
    for _ in range(reps):
        if before is not None:
            before()
        a = torch.cuda.Event(enable_timing=True)
        e = torch.cuda.Event(enable_timing=True)
        a.record()
        for g in graphs:
            g.replay()
        e.record()
        e.synchronize()
        times.append(a.elapsed_time(e))
    return times


def eager_ms(fn, reps: int = 1) -> Tuple[List[float], object]:
    out = None
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        out = fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    return times, out


def med(xs: Sequence[float]) -> float:
    return float(statistics.median(xs))


# ---------------------------------------------------------------------------------------------
# Ceilings and the verify forward's floor (METHOD.md: bytes over bandwidth, FLOPs over the rate)
# ---------------------------------------------------------------------------------------------
def measure_ceilings(log) -> dict:
    """Device-to-device copy bandwidth (read + write bytes) and bf16 8192^3 matmul rate."""
    a = torch.randn(1 << 30, device="cuda", dtype=torch.bfloat16)  # 2 GiB
    b = torch.empty_like(a)
    for _ in range(3):
        b.copy_(a)
    t = []
    for _ in range(10):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        b.copy_(a)
        e1.record()
        e1.synchronize()
        t.append(e0.elapsed_time(e1))
    bw = 2 * a.numel() * 2 / (med(t) / 1e3)
    del a, b
    x = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    y = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        x @ y
    t = []
    for _ in range(10):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        x @ y
        e1.record()
        e1.synchronize()
        t.append(e0.elapsed_time(e1))
    rate = 2 * 8192 ** 3 / (med(t) / 1e3)
    del x, y
    torch.cuda.empty_cache()
    log(f"ceilings: copy {bw / 1e12:.2f} TB/s (read + write), bf16 matmul {rate / 1e12:.0f} TFLOP/s")
    return dict(copy_bytes_per_s=bw, bf16_flop_per_s=rate)


def verify_floor_ms(m: "Models", bs: int, T: int, ceil: Optional[dict]) -> Optional[float]:
    """max(bytes / bandwidth, FLOPs / matmul rate) of the target verify: every target weight and
    the LM head read once, the prefix KV read once, the logits written once; 2 FLOPs per weight
    per token plus the attention's 4 * (P + T) * heads * head_dim per token and layer."""
    if not ceil:
        return None
    s = m.s
    el = 2
    layer_params = sum(t.numel() for t in m.layers[0].values())
    w_bytes = (layer_params * s.layers + s.vocab * s.hidden) * el
    kv_bytes = bs * m.P * s.layers * 2 * s.kv_heads * s.head_dim * el
    logit_bytes = bs * T * s.vocab * el
    flops = 2 * (layer_params * s.layers + s.vocab * s.hidden) * bs * T
    flops += 4 * bs * T * (m.P + T) * s.heads * s.head_dim * s.layers
    return 1e3 * max((w_bytes + kv_bytes + logit_bytes) / ceil["copy_bytes_per_s"], flops / ceil["bf16_flop_per_s"])


# ---------------------------------------------------------------------------------------------
# Correctness checks (GPU, before timing)
# ---------------------------------------------------------------------------------------------
def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp(min=1e-30))


def check_kernels(m: Models, log) -> Dict[str, float]:
    """Triton ops against their torch versions and the attention kernel against dense SDPA, on
    fresh random inputs of the model's shapes (bs 2, a DDTree of 32 nodes and a chain)."""
    dev, dt, s = m.dev, m.dtype, m.s
    res: Dict[str, float] = {}
    tri, ref = m.ops, Ops(False, m.ops.eps)
    H = s.hidden
    x = torch.randn(7, H, device=dev, dtype=dt)
    r0 = torch.randn(7, H, device=dev, dtype=dt)
    w = torch.rand(H, device=dev, dtype=dt) + 0.5
    outs = []
    for ops in (tri, ref):
        r = r0.clone()
        o = torch.empty_like(x)
        ops.add_rmsnorm(x, r, w, o, has_res=True, write_res=True)
        outs.append((o, r))
    res["add_rmsnorm"] = max(rel_err(outs[0][0], outs[1][0]), rel_err(outs[0][1], outs[1][1]))
    gu = torch.randn(5, 2 * s.inter, device=dev, dtype=dt)
    a1, a2 = torch.empty(5, s.inter, device=dev, dtype=dt), torch.empty(5, s.inter, device=dev, dtype=dt)
    tri.silu_mul(gu, a1)
    ref.silu_mul(gu, a2)
    res["silu_mul"] = rel_err(a1, a2)
    T = 6
    qkv = torch.randn(T, (m.hq + 2 * m.hkv) * m.hd, device=dev, dtype=dt)
    pos = torch.randint(0, m.P, (T,), device=dev)
    loc = torch.randperm(m.slots - 1, device=dev)[:T] + 1
    qw, kw = torch.rand(m.hd, device=dev, dtype=dt) + 0.5, torch.rand(m.hd, device=dev, dtype=dt) + 0.5
    got = []
    for ops in (tri, ref):
        q = torch.empty(T, m.hq, m.hd, device=dev, dtype=dt)
        k = torch.empty(T, m.hkv, m.hd, device=dev, dtype=dt)
        v = torch.empty_like(k)
        kc = torch.zeros(m.slots, m.hkv, m.hd, device=dev, dtype=dt)
        vc = torch.zeros_like(kc)
        ops.qkv_post(qkv, q, k, v, qw, kw, m.cos, m.sin, pos, loc, kc, vc, m.hq, m.hkv, m.hd)
        got.append((q, k, v, kc[loc], vc[loc]))
    res["qkv_post"] = max(rel_err(a, b) for a, b in zip(*got))
    # attention: SGLang kernel (or whatever m.attn is) vs dense SDPA, tree and chain
    if m.attn.kind == "sglang":
        bs = 2
        b = Batch(m, bs, seed=99)
        L, V = s.block - 1, s.vocab
        logits = (torch.randn(bs, L, V, device=dev) * 3).to(dt)
        for arm, width in (("ddtree", 33), ("dflash", s.block)):
            a = Arm(b, arm, width, logits)
            a.bind_build(a.build())
            T = width
            q = torch.randn(bs * T, m.hq, m.hd, device=dev, dtype=dt)
            k = torch.randn(bs * T, m.hkv, m.hd, device=dev, dtype=dt)
            v = torch.randn_like(k)
            got = m.attn(q, k, v, m.Kc[0], m.Vc[0], a.meta)
            meta = AttnMeta(**{**a.meta.__dict__})
            if arm == "ddtree":
                meta.dense = a.tree.tree_mask
            want = sdpa_attention(q.float(), k.float(), v.float(), m.Kc[0].float(), m.Vc[0].float(), meta, m.attn.scale)
            res[f"attention_{arm}_{width}"] = rel_err(got, want)
    for k_, v_ in res.items():
        log(f"check {k_}: rel err {v_:.2e}")
    bad = {k_: v_ for k_, v_ in res.items() if not (v_ < 2e-2)}
    if bad:
        raise RuntimeError(f"correctness check failed: {bad}")
    return res


# ---------------------------------------------------------------------------------------------
# The measurement
# ---------------------------------------------------------------------------------------------
def measure_batch(m: Models, bs: int, widths: Sequence[int], *, graphs: bool, target_s: float,
                  min_reps: int, max_reps: int, repeat_dflash: bool, log, deadline: float,
                  ceil: Optional[dict] = None) -> List[dict]:
    b = Batch(m, bs)
    rows: List[dict] = []
    B = m.s.block

    def reps_for(ms: float) -> int:
        return int(max(min_reps, min(max_reps, round(target_s * 1e3 / max(ms, 1e-3)))))

    if graphs:
        g_draft, logits = capture(b.draft_fn)
        draft_ms = med(replay_ms([g_draft], reps_for(med(replay_ms([g_draft], 2)))))
    else:
        t, logits = eager_ms(b.draft_fn, 2)
        draft_ms, g_draft = min(t), None
    log(f"bs {bs}: draft phase {draft_ms:.3f} ms")
    configs = [("dflash", B)] + [("ddtree", w) for w in widths]
    if repeat_dflash:
        configs.append(("dflash", B))
    for i, (arm, width) in enumerate(configs):
        if time.time() > deadline:
            log(f"bs {bs}: deadline reached, skipping {arm} {width} and later")
            break
        t0 = time.time()
        a = Arm(b, arm, width, logits)
        row = dict(bs=bs, arm=arm, width=width, budget=width - 1 if arm == "ddtree" else None,
                   repeat=i > 0 and arm == "dflash", draft_ms=draft_ms,
                   verify_floor_ms=verify_floor_ms(m, bs, width, ceil))
        if graphs:
            g_build, out = capture(a.build)
            a.bind_build(out)
            g_verify, out = capture(a.verify)
            a.bind_verify(out)
            follow = a.follow_choice()
            a.choice.copy_(follow)
            g_post, post_out = capture(a.post)
            one = med(replay_ms([g_draft, g_build, g_verify, g_post], 2))
            n = reps_for(one)
            row["build_ms"] = med(replay_ms([g_build], n))
            row["verify_ms"] = med(replay_ms([g_verify], n))
            row["post_ms"] = med(replay_ms([g_post], n, before=lambda c=a.choice, f=follow: c.copy_(f)))
            # tokens committed per request on the follow picks (a sanity figure: real walks)
            row["commit_mean_follow"] = float(post_out[1].float().mean())
            steps = replay_ms([g_draft, g_build, g_verify, g_post], n)
            row["step_ms"] = med(steps)
            row["step_min_ms"], row["step_max_ms"] = min(steps), max(steps)
            row["reps"] = n
            torch.cuda.synchronize()
            del g_build, g_verify, g_post, out, post_out, follow
        else:
            t, out = eager_ms(a.build)
            a.bind_build(out)
            row["build_ms"] = t[0]
            t, out = eager_ms(a.verify)
            a.bind_verify(out)
            row["verify_ms"] = t[0]
            a.choice.copy_(a.follow_choice())
            t, post_out = eager_ms(a.post)
            row["post_ms"] = t[0]
            row["commit_mean_follow"] = float(post_out[1].float().mean())
            row["step_ms"] = draft_ms + row["build_ms"] + row["verify_ms"] + row["post_ms"]
            row["reps"] = 1
        row["wall_s"] = round(time.time() - t0, 2)
        rows.append(row)
        log(f"bs {bs:3d} {arm:6s} T {width:3d}: build {row['build_ms']:.3f}  verify {row['verify_ms']:.3f}  "
            f"post {row['post_ms']:.3f}  step {row['step_ms']:.3f} ms  ({row['reps']} reps, {row['wall_s']} s)")
        del a
        if graphs:
            torch.cuda.empty_cache()
    del g_draft, logits, b
    if graphs:
        torch.cuda.empty_cache()
    return rows


# ---------------------------------------------------------------------------------------------
# Where a step's time goes: each piece captured alone over all layers, as the forward runs it
# ---------------------------------------------------------------------------------------------
BREAKDOWN_CONFIGS = (("dflash", 16), ("ddtree", 16), ("ddtree", 65), ("ddtree", 257))


def breakdown(m: Models, bss: Sequence[int], configs: Sequence[Tuple[str, int]], log, *,
              target_s: float = 0.3, deadline: float = float("inf")) -> List[dict]:
    """Per (batch, arm, width): the verify's pieces summed over the target's layers (every layer's
    own weights and KV, so nothing is served from L2 that the forward would not find there), the
    LM head, the build and post pieces and the draft's LM head, each a CUDA graph of its own
    (median replay, ms; eager once off CUDA). The layer pieces + head sum to about the verify."""
    cuda = torch.cuda.is_available() and m.dev != "cpu"

    def timed(fn) -> float:
        if not cuda:
            return eager_ms(fn)[0][0]
        g, out = capture(fn)
        one = med(replay_ms([g], 2))
        t = med(replay_ms([g], int(max(3, min(30, round(target_s * 1e3 / max(one, 1e-3)))))))
        del g, out
        return t

    rows = []
    for bs in bss:
        b = Batch(m, bs)
        logits = b.draft_fn()
        for arm, width in configs:
            if time.time() > deadline:
                log("breakdown: deadline reached")
                return rows
            row = _breakdown_one(m, b, logits, arm, width, timed)
            rows.append(row)
            log("breakdown " + " ".join(f"{k_}={v_:.3f}" if isinstance(v_, float) else f"{k_}={v_}"
                                         for k_, v_ in row.items()))
            if cuda:
                torch.cuda.empty_cache()
    return rows


def _breakdown_one(m: Models, b: Batch, logits, arm: str, width: int, timed) -> dict:
    ops, bs = m.ops, b.bs
    H, I = m.s.hidden, m.s.inter
    a = Arm(b, arm, width, logits)
    a.bind_build(a.build())
    a.bind_verify(a.verify())
    a.choice.copy_(a.follow_choice())
    n = bs * width
    dt, dev = m.dtype, m.dev
    x = torch.randn(n, H, device=dev, dtype=dt)
    res = torch.randn(n, H, device=dev, dtype=dt)
    h = torch.randn(n, H, device=dev, dtype=dt)
    qkv = F.linear(h, m.layers[0]["wqkv"])
    q = torch.empty(n, m.hq, m.hd, device=dev, dtype=dt)
    k = torch.empty(n, m.hkv, m.hd, device=dev, dtype=dt)
    v = torch.empty_like(k)
    ops.qkv_post(qkv, q, k, v, m.layers[0]["qn"], m.layers[0]["kn"], m.cos, m.sin, a.v_pos, a.loc,
                 m.Kc[0], m.Vc[0], m.hq, m.hkv, m.hd)
    o2 = torch.randn(n, m.hq * m.hd, device=dev, dtype=dt)
    gu = torch.randn(n, 2 * I, device=dev, dtype=dt)
    act = torch.randn(n, I, device=dev, dtype=dt)

    def norms():
        for p in m.layers:
            ops.add_rmsnorm(x, res, p["ln1"], h, has_res=True, write_res=False)
            ops.add_rmsnorm(x, res, p["ln2"], h, has_res=True, write_res=False)

    def qkv_gemm():
        for p in m.layers:
            F.linear(h, p["wqkv"])

    def qkv_post():
        for li, p in enumerate(m.layers):
            ops.qkv_post(qkv, q, k, v, p["qn"], p["kn"], m.cos, m.sin, a.v_pos, a.loc, m.Kc[li], m.Vc[li],
                         m.hq, m.hkv, m.hd)

    def attention():
        for li in range(m.s.layers):
            m.attn(q, k, v, m.Kc[li], m.Vc[li], a.meta)

    def o_gemm():
        for p in m.layers:
            F.linear(o2, p["wo"])

    def gate_up():
        for p in m.layers:
            F.linear(h, p["wgu"])

    def silu():
        for _ in m.layers:
            ops.silu_mul(gu, act)

    def down():
        for p in m.layers:
            F.linear(act, p["wd"])

    def head():
        hh = torch.empty_like(x)
        ops.add_rmsnorm(x, res, m.final_norm, hh, has_res=True, write_res=False)
        return F.linear(hh, m.lm_head).argmax(-1)

    pieces = dict(norms=norms, qkv_gemm=qkv_gemm, qk_norm_rope_store=qkv_post, attention=attention,
                  o_gemm=o_gemm, gate_up_gemm=gate_up, silu_mul=silu, down_gemm=down, head=head)
    row = dict(bs=bs, arm=arm, width=width)
    for name, fn in pieces.items():
        row[name] = timed(fn)
    row["layers_sum"] = sum(row[k_] for k_ in pieces if k_ != "head")
    row["verify_sum"] = row["layers_sum"] + row["head"]
    if arm == "ddtree":
        row["tree_build"] = timed(lambda: D.build_tree_from_logits(a.logits, b.block_ids[:, 0], a.sizes))
        row["verify_inputs"] = timed(lambda: D.prepare_verify_tensors(
            a.tree, b.prefix, positions_out=a.pos_buf, custom_mask_out=a.mask_buf, prefix_lens_sum=bs * m.P))
        step = D.finish_verify_tensors(a.tree, a.choice.view(bs, width), b.prefix, b.window[:, :width], a.sizes)
        row["walk_finish"] = timed(lambda: D.finish_verify_tensors(
            a.tree, a.choice.view(bs, width), b.prefix, b.window[:, :width], a.sizes))
        row["move_kv"] = timed(lambda: m.move_kv(step.kv_moves.tgt_loc, step.kv_moves.src_loc))
        rows_idx = step.hidden_rows.reshape(-1)
        row["draft_append"] = timed(lambda: m.draft_append(a.aux.index_select(0, rows_idx), step.draft_positions,
                                                           a.draft_loc))
    else:
        row["chain_build"] = timed(a.build)
        row["draft_append"] = timed(lambda: m.draft_append(a.aux[: bs * a.B], a.draft_pos, a.draft_loc))
    hs = torch.randn(bs * (m.s.block - 1), H, device=dev, dtype=dt)
    row["draft_lm_head"] = timed(lambda: F.linear(hs, m.lm_head))
    return row


def breakdown_table(rows: Sequence[dict], main_rows: Sequence[dict]) -> str:
    keys = ["norms", "qkv_gemm", "qk_norm_rope_store", "attention", "o_gemm", "gate_up_gemm", "silu_mul",
            "down_gemm", "head"]
    lines = ["Verify forward by piece (each summed over all target layers, every layer's own weights and KV; "
             "CUDA-graph medians, ms) and the verify phase of the main table",
             "", "| bs | arm | T | " + " | ".join(keys) + " | sum | verify (main run) | attention share |",
             "|---:|---|---:|" + "---:|" * (len(keys) + 3)]
    for r in rows:
        v = next((x["verify_ms"] for x in main_rows if x["bs"] == r["bs"] and x["arm"] == r["arm"]
                  and x["width"] == r["width"] and not x.get("repeat")), float("nan"))
        lines.append(f"| {r['bs']} | {r['arm'].upper()} | {r['width']} | " + " | ".join(f"{r[k]:.3f}" for k in keys)
                     + f" | {r['verify_sum']:.3f} | {v:.3f} | {r['attention'] / r['verify_sum']:.0%} |")
    lines += ["", "Build, post and draft pieces (ms)", "",
              "| bs | arm | T | tree build / chain | verify inputs (positions + mask) | walk + finish | move_kv (all layers) | draft append | draft LM head |",
              "|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        def f(k):
            return f"{r[k]:.3f}" if k in r else "-"
        lines.append(f"| {r['bs']} | {r['arm'].upper()} | {r['width']} | {f('tree_build') if 'tree_build' in r else f('chain_build')} | "
                     f"{f('verify_inputs')} | {f('walk_finish')} | {f('move_kv')} | {f('draft_append')} | {f('draft_lm_head')} |")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# Acceptance curves and the projection
# ---------------------------------------------------------------------------------------------
PAPER_DFLASH_TAU = 7.79
PAPER_DDTREE_TAU = 10.73
PAPER_BEST_BUDGET = 512
FIXTURE_DFLASH_TAU = 2.23
FIXTURE_POINTS = ((1, 1.64), (3, 2.27), (8, 2.61))  # block 4: budget -> tau
FIXTURE_FLOOR = 3


def paper_accept(n: int, floor: int = 15) -> float:
    """Expected accepted draft tokens (tau - 1) of the best n-node tree, block 16, paper curve."""
    n = max(int(n), floor)
    return (PAPER_DFLASH_TAU - 1) + (PAPER_DDTREE_TAU - PAPER_DFLASH_TAU) * math.log2(n / floor) / math.log2(PAPER_BEST_BUDGET / floor)


def fixture_accept(n: int, floor: int = 15) -> float:
    """tau - 1 on the live fixtures' curve, budget mapped by n / floor = budget / 3 (block 4)."""
    x = math.log(max(int(n), 1) / floor * FIXTURE_FLOOR)
    pts = [(math.log(b), t - 1) for b, t in FIXTURE_POINTS]
    if x <= pts[0][0]:
        return pts[0][1]
    for (x0, y0), (x1, y1) in zip(pts, pts[1:]):
        if x <= x1:
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return pts[-1][1]


CURVES = {
    "paper": (paper_accept, PAPER_DFLASH_TAU - 1,
              "Qwen3-8B MATH-500 (arXiv 2604.12989): DFlash tau 7.79; DDTree tau 7.79 at N = 15 rising "
              "linearly in log2 N to 10.73 at N = 512"),
    "fixtures": (fixture_accept, FIXTURE_DFLASH_TAU - 1,
                 "live CPU fixtures, block 4: DFLASH 2.23; DDTREE budget 1/3/8: 1.64/2.27/2.61, "
                 "budget mapped by N/15 = n/3, log-linear between, flat past n = 8"),
}


def cost_table(rows: Sequence[dict]) -> dict:
    """The measured cost table (see the module docstring for the format), from the first
    measurement of each (batch, DDTREE width)."""
    draft: Dict[int, float] = {}
    table = {}
    for r in rows:
        draft.setdefault(r["bs"], r["draft_ms"] / 1e3)
        if r["arm"] == "ddtree" and (r["bs"], r["width"]) not in table:
            table[(r["bs"], r["width"])] = dict(batch=r["bs"], tokens=r["width"], budget=r["width"] - 1,
                                               seconds=(r["step_ms"] - r["draft_ms"]) / 1e3)
    chain = {bs: dflash_step_ms(rows, bs) / 1e3 for bs in sorted({r["bs"] for r in rows if r["arm"] == "dflash"})}
    return dict(format=COST_FORMAT, unit="seconds", draft_s={str(k): v for k, v in sorted(draft.items())},
                chain_s={str(k): v for k, v in chain.items()}, table=[table[k] for k in sorted(table)])


def cost_model_from_dict(d: dict) -> VerifyCostModel:
    """``chain_s`` (DFlash's whole step by batch size; absent in tables written before chain steps)
    lets the planner choose chain steps."""
    if d.get("format") != COST_FORMAT:
        raise ValueError(f"not a {COST_FORMAT} cost table (format={d.get('format')!r})")
    return VerifyCostModel(table={(int(r["batch"]), int(r["tokens"])): float(r["seconds"]) for r in d["table"]},
                           draft_s={int(k): float(v) for k, v in d["draft_s"].items()},
                           chain_s={int(k): float(v) for k, v in d.get("chain_s", {}).items()})


def load_cost_model(path: str) -> VerifyCostModel:
    """A ``VerifyCostModel`` from a cost table JSON written by this bench (``--cost-out``)."""
    with open(path, encoding="utf-8") as f:
        return cost_model_from_dict(json.load(f))


def dflash_step_ms(rows: Sequence[dict], bs: int) -> float:
    """DFLASH's step at ``bs``: the median of its measurements (first and repeat)."""
    xs = [r["step_ms"] for r in rows if r["bs"] == bs and r["arm"] == "dflash"]
    return med(xs)


AUTO_STEPS = 2000
AUTO_TIME_SIGMA = 0.03       # per-step time noise (log-normal sigma)
AUTO_ACCEPT_SIGMA = 0.30     # per-request accept noise (log-normal sigma; a step averages bs requests)


def simulate_auto(model: VerifyCostModel, bs: int, dflash_s: float, acc: Callable[[int], float],
                  floor: int, ceiling: int, steps: int = AUTO_STEPS, seed: int = 17) -> dict:
    """Revision 7's online planner (``AutoBudgetPlanner``, as the worker drives it) over ``steps``
    decode steps at batch ``bs``: each step's time is the cost model's (DFLASH's measured step
    for a chain step) with log-normal noise, its committed tokens per request ``1 + acc(n)`` with
    log-normal noise of sigma ``AUTO_ACCEPT_SIGMA / sqrt(bs)``. Returns the realized tokens/s —
    exploration and re-measuring included — and the plan it ended on. Simulated on measured step
    times: no device run."""
    rng = random.Random(seed * 1009 + bs)
    planner = AutoBudgetPlanner(floor, ceiling)
    tokens = seconds = 0.0
    used: Dict[int, int] = {}
    for _ in range(steps):
        n = planner.choose(bs)
        used[n] = used.get(n, 0) + 1
        # log-normal noise of mean 1 (exp(N(-s^2/2, s))): the noise alone favours no budget
        ts, ta = AUTO_TIME_SIGMA, AUTO_ACCEPT_SIGMA / math.sqrt(bs)
        t = (dflash_s if n == CHAIN else model.step_s(bs, n + 1)) * math.exp(rng.gauss(-ts * ts / 2, ts))
        tau = (1 + acc(n)) * math.exp(rng.gauss(-ta * ta / 2, ta))
        planner.record_time(bs, n, t)
        planner.record_accept(n, max(1.0, tau))
        tokens += bs * max(1.0, tau)
        seconds += t
    plan = planner.plan().get(batch_bucket(bs))
    return dict(tok_s=tokens / seconds, plan="chain" if plan == CHAIN else plan, steps=steps,
                on_plan=used.get(plan, 0) / steps if plan is not None else 0.0,
                used={("chain" if k == CHAIN else str(k)): v for k, v in sorted(used.items())})


def project(rows: Sequence[dict], block: int = 16, fixed: int = 256) -> dict:
    """Projected committed tokens/s DDTREE / DFLASH per batch size and budget, for each acceptance
    curve of ``CURVES``; (b) the planner's schedule over the measured budgets and chain steps
    (revision 4: a chain step IS DFlash's step, so its ratio is 1 by construction, measured as the
    DFLASH arm); (c) the same planner without chain steps (revision 3); (d) revision 7's online
    planner, simulated over ``AUTO_STEPS`` steps on the measured times (``simulate_auto``)."""
    cost_d = cost_table(rows)
    model = cost_model_from_dict(cost_d)
    floor = block - 1
    budgets = sorted({r["width"] - 1 for r in rows if r["arm"] == "ddtree"})
    ceiling = max(budgets)
    batches = sorted({r["bs"] for r in rows if r["arm"] == "ddtree"})
    out = dict(cost=cost_d, curves={})
    for name, (tree_acc, chain_acc, desc) in CURVES.items():
        def acc(n: int, _t=tree_acc, _c=chain_acc) -> float:
            return _c if n == CHAIN else _t(n)

        sched = best_budget_per_batch(batches, acc, model, [CHAIN] + budgets, floor=floor, ceiling=ceiling)
        trees_only = best_budget_per_batch(batches, acc, model, budgets, floor=floor, ceiling=ceiling)
        per = []
        for bs in batches:
            d_ms = dflash_step_ms(rows, bs)
            d_rate = bs * (1 + chain_acc) / (d_ms / 1e3)
            entry = dict(bs=bs, dflash_ms=d_ms, dflash_tau=1 + chain_acc, dflash_tok_s=d_rate, by_budget={})
            for n in budgets:
                s_ms = model.step_s(bs, n + 1) * 1e3
                rate = bs * (1 + acc(n)) / (s_ms / 1e3)
                entry["by_budget"][str(n)] = dict(step_ms=s_ms, tau=1 + acc(n), tok_s=rate, ratio=rate / d_rate)
            if fixed in budgets:
                entry["fixed"] = dict(budget=fixed, **entry["by_budget"][str(fixed)])
            nb = sched.budget_for(bs)
            if nb == CHAIN:
                entry["schedule"] = dict(budget="chain", step_ms=d_ms, tau=1 + chain_acc, tok_s=d_rate, ratio=1.0)
            else:
                entry["schedule"] = dict(budget=nb, **entry["by_budget"][str(nb)])
            nt = trees_only.budget_for(bs)
            entry["trees_only"] = dict(budget=nt, **entry["by_budget"][str(nt)])
            auto = simulate_auto(model, bs, d_ms / 1e3, acc, floor, ceiling)
            entry["auto"] = dict(auto, ratio=auto["tok_s"] / d_rate)
            per.append(entry)
        goal_all = all(e["schedule"]["ratio"] >= 1.0 for e in per)
        goal_bs1 = next((e["schedule"]["ratio"] for e in per if e["bs"] == 1), float("nan"))
        out["curves"][name] = dict(description=desc, schedule_text=sched.text(),
                                   trees_only_schedule_text=trees_only.text(),
                                   schedule={str(k): v for k, v in sched.entries}, batches=per,
                                   goal_ratio_ge_1_every_batch=goal_all, ratio_bs1=goal_bs1,
                                   goal_ratio_ge_1_2_bs1=bool(goal_bs1 >= 1.2))
    return out


# ---------------------------------------------------------------------------------------------
# Tables
# ---------------------------------------------------------------------------------------------
def _budget_label(n: object) -> str:
    return "chain" if n == "chain" else f"N {n}"


def tables(rows: Sequence[dict], proj: dict, head: str) -> str:
    lines = [head, ""]
    bss = sorted({r["bs"] for r in rows})
    widths = sorted({r["width"] for r in rows if r["arm"] == "ddtree"})

    def first(bs, arm, w):
        return next((r for r in rows if r["bs"] == bs and r["arm"] == arm and r["width"] == w and not r.get("repeat")), None)

    def rep(bs):
        return next((r for r in rows if r["bs"] == bs and r["arm"] == "dflash" and r.get("repeat")), None)

    graphs = all(r.get("reps", 1) > 1 for r in rows)
    how = "median of CUDA-graph replays" if graphs else "EAGER, one run: not a speed figure"
    lines.append(f"Per-step time ({how} of draft + build + verify + post), ms")
    lines.append("")
    lines.append("| bs | DFLASH T 16 (repeat) | " + " | ".join(f"DDTREE T {w} (N {w - 1})" for w in widths) + " |")
    lines.append("|---:|---:|" + "---:|" * len(widths))
    for bs in bss:
        d, dr = first(bs, "dflash", 16), rep(bs)
        dtxt = f"{d['step_ms']:.2f}" + (f" ({dr['step_ms']:.2f})" if dr else "") if d else "-"
        cells = [f"{first(bs, 'ddtree', w)['step_ms']:.2f}" if first(bs, "ddtree", w) else "-" for w in widths]
        lines.append(f"| {bs} | {dtxt} | " + " | ".join(cells) + " |")
    lines.append("")
    lines.append("Phases, ms (draft is shared by both arms)")
    lines.append("")
    lines.append("| bs | arm | T | draft | build | verify | post | step | verify / DFLASH verify | verify floor (x) |")
    lines.append("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for bs in bss:
        d = first(bs, "dflash", 16)
        for r in [x for x in rows if x["bs"] == bs and not x.get("repeat")]:
            rel = r["verify_ms"] / d["verify_ms"] if d else float("nan")
            fl = r.get("verify_floor_ms")
            ftxt = f"{fl:.3f} ({r['verify_ms'] / fl:.2f}x)" if fl else "-"
            lines.append(f"| {bs} | {r['arm'].upper()} | {r['width']} | {r['draft_ms']:.3f} | {r['build_ms']:.3f} | "
                         f"{r['verify_ms']:.3f} | {r['post_ms']:.3f} | {r['step_ms']:.3f} | {rel:.2f}x | {ftxt} |")
    lines.append("")
    lines.append("Whole step relative to DFLASH's (step DDTREE / step DFLASH)")
    lines.append("")
    lines.append("| bs | " + " | ".join(f"T {w}" for w in widths) + " |")
    lines.append("|---:|" + "---:|" * len(widths))
    for bs in bss:
        dms = dflash_step_ms(rows, bs)
        cells = [f"{first(bs, 'ddtree', w)['step_ms'] / dms:.2f}x" if first(bs, "ddtree", w) else "-" for w in widths]
        lines.append(f"| {bs} | " + " | ".join(cells) + " |")
    for name, c in proj["curves"].items():
        lines.append("")
        lines.append(f"Projected committed tokens/s, DDTREE / DFLASH — curve '{name}': {c['description']}")
        lines.append("")
        budgets = sorted(int(k) for k in c["batches"][0]["by_budget"])
        lines.append("| bs | DFLASH tau | DFLASH tok/s | " + " | ".join(f"N {n} (tau)" for n in budgets)
                     + " | (a) fixed 256 | (b) schedule with chain steps: N -> ratio | (c) trees only (r3) "
                     + "| (d) auto (r7), simulated: ratio, plan, steps on it |")
        lines.append("|---:|---:|---:|" + "---:|" * len(budgets) + "---:|---|---|---|")
        for e in c["batches"]:
            cells = [f"{e['by_budget'][str(n)]['ratio']:.3f} ({e['by_budget'][str(n)]['tau']:.2f})" for n in budgets]
            fx = f"{e['fixed']['ratio']:.3f}" if "fixed" in e else "-"
            sc, tr = e["schedule"], e.get("trees_only")
            trt = f"N {tr['budget']} -> {tr['ratio']:.3f}" if tr else "-"
            au = e.get("auto")
            aut = (f"{au['ratio']:.3f}, {_budget_label(au['plan'])}, {100 * au['on_plan']:.0f} %" if au else "-")
            lines.append(f"| {e['bs']} | {e['dflash_tau']:.2f} | {e['dflash_tok_s']:.0f} | " + " | ".join(cells)
                         + f" | {fx} | {_budget_label(sc['budget'])} -> {sc['ratio']:.3f} | {trt} | {aut} |")
        lines.append("")
        lines.append(f"schedule ({name}): \"{c['schedule_text']}\"; goal ratio >= 1.0 at every batch: "
                     f"{'met' if c['goal_ratio_ge_1_every_batch'] else 'NOT met'}; >= 1.2 at batch 1: "
                     f"{'met' if c['goal_ratio_ge_1_2_bs1'] else 'NOT met'} ({c['ratio_bs1']:.3f})")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# Warm-up shards: compile every Triton kernel the run needs, in parallel processes
# ---------------------------------------------------------------------------------------------
def tasks(bss: Sequence[int], widths: Sequence[int], block: int) -> List[Tuple[int, str, int]]:
    t = [(bs, "ddtree", w) for w in sorted(widths, reverse=True) for bs in bss]
    t += [(bs, "dflash", block) for bs in bss]
    return t


def run_warm_shard(args, shape: Shape, log):
    i, n = (int(x) for x in args.warm_shard.split("/"))
    bss = [int(x) for x in args.bs.split(",")]
    widths = [int(x) for x in args.widths.split(",")]
    every = tasks(bss, widths, shape.block)
    per = -(-len(every) // n)
    mine = every[i * per:(i + 1) * per]  # contiguous: one width's batch sizes share compiled kernels
    attn = make_attention(args, shape)
    cuda = torch.cuda.is_available()
    m = Models(shape, "cuda" if cuda else "cpu", attn=attn, ops=Ops(cuda, shape.eps), bs_max=max(bss),
               context=args.context, max_width=max(widths), dtype=torch.bfloat16 if cuda else torch.float32)
    log(f"warm shard {i}/{n}: tasks {mine}")
    for bs, arm, width in mine:
        t0 = time.time()
        b = Batch(m, bs)
        logits = b.draft_fn()
        a = Arm(b, arm, width, logits)
        a.bind_build(a.build())
        a.bind_verify(a.verify())
        a.choice.copy_(a.follow_choice())
        a.post()
        if cuda:
            torch.cuda.synchronize()
        log(f"warm shard {i}/{n}: bs {bs} {arm} T {width} in {time.time() - t0:.1f} s")
        del a, b, logits
        if cuda:
            torch.cuda.empty_cache()


def launch_warm_shards(args, n: int, log_dir: str) -> List[Tuple[subprocess.Popen, str]]:
    procs = []
    base = [sys.executable, os.path.abspath(__file__), "--layers", "1", "--draft-layers", "1",
            "--bs", args.bs, "--widths", args.widths, "--context", str(args.context), "--attn", args.attn,
            "--tree-attn", args.tree_attn, "--chain-attn", args.chain_attn]
    if args.sglang_src:
        base += ["--sglang-src", args.sglang_src]
    for i in range(n):
        path = os.path.join(log_dir, f"warm_shard_{i}.log")
        f = open(path, "w")
        p = subprocess.Popen(base + ["--warm-shard", f"{i}/{n}"], stdout=f, stderr=subprocess.STDOUT)
        procs.append((p, path))
    return procs


# ---------------------------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------------------------
def make_attention(args, shape: Shape) -> Attention:
    scale = shape.head_dim ** -0.5
    if args.attn == "sdpa":
        return Attention("sdpa", scale)
    fn, desc = load_sglang_extend_attention(args.sglang_src)
    from patchsets.ddtree.kernels.ddtree_verify_attention import tree_verify_attention_fwd

    tree_fn = chain_fn = None
    if args.tree_attn == "ddtree":
        tree_fn = tree_verify_attention_fwd
        desc += "; DDTREE's tree verify: ddtree_verify_attention.tree_verify_attention_fwd"
    if args.chain_attn == "ddtree":
        chain_fn = tree_verify_attention_fwd
        desc += ("; the chain's verify (the DFLASH arm: a DDTREE chain step, ddtree r12): "
                 "tree_verify_attention_fwd without a mask (causal)")
    att = Attention("sglang", scale, fn, tree_fn, chain_fn)
    att.desc = desc
    return att


def environment() -> dict:
    env = dict(torch=torch.__version__, triton=getattr(triton, "__version__", None) if HAVE_TRITON else None,
               python=sys.version.split()[0])
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        env.update(device=p.name, sms=p.multi_processor_count, memory_gib=round(p.total_memory / 2**30, 1))
        try:
            env["nvidia_smi"] = subprocess.run(
                ["nvidia-smi", "--query-gpu=name,driver_version,clocks.sm,clocks.mem,clocks.max.sm",
                 "--format=csv,noheader"], capture_output=True, text=True, timeout=20).stdout.strip()
        except Exception:  # noqa: BLE001
            pass
    else:
        env["device"] = "cpu"
    return env


def git_rev() -> str:
    try:
        return subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=10).stdout.strip()
    except Exception:  # noqa: BLE001
        return "?"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--smoke", action="store_true", help="CPU, tiny shapes, eager (no CUDA graphs)")
    ap.add_argument("--bs", default="1,4,16,64")
    ap.add_argument("--widths", default="16,33,65,129,257", help="DDTREE verify widths N + 1")
    ap.add_argument("--context", type=int, default=1024, help="committed KV tokens per request")
    ap.add_argument("--layers", type=int, default=None, help="target layers (default 36)")
    ap.add_argument("--draft-layers", type=int, default=None, help="drafter layers (default 5)")
    ap.add_argument("--attn", choices=("sglang", "sdpa"), default="sglang")
    ap.add_argument("--tree-attn", choices=("sglang", "ddtree"), default="sglang",
                    help="DDTREE's tree-masked verify attention: SGLang's extend kernel (as SGLang's triton "
                         "backend runs it) or DDTree's tree_verify_attention_fwd (--attn sglang only)")
    ap.add_argument("--chain-attn", choices=("sglang", "ddtree"), default="sglang",
                    help="the chain's causal verify attention (the DFLASH arm): SGLang's extend kernel (DFLASH "
                         "as SGLang runs it) or DDTree's kernel without a mask (a DDTREE server's chain step, "
                         "ddtree revision 12 on; --attn sglang only)")
    ap.add_argument("--sglang-src", default=None, help="sglang 0.5.23 wheel or zip of its attention kernels")
    ap.add_argument("--warm-jobs", type=int, default=0, help="compile the Triton kernels first in N processes")
    ap.add_argument("--warm-shard", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--warm-timeout", type=float, default=300.0)
    ap.add_argument("--target-seconds", type=float, default=1.0, help="timed replays per figure ~ this long")
    ap.add_argument("--min-reps", type=int, default=5)
    ap.add_argument("--max-reps", type=int, default=50)
    ap.add_argument("--max-seconds", type=float, default=0.0, help="stop starting configurations after this")
    ap.add_argument("--no-repeat", action="store_true", help="do not measure DFLASH a second time per batch")
    ap.add_argument("--out", default=None, help="JSON of every row, the environment and the projection")
    ap.add_argument("--cost-out", default=None, help="the cost table JSON (VerifyCostModel)")
    ap.add_argument("--schedule-out", default=None, help="the paper curve's schedule (load_schedule JSON)")
    ap.add_argument("--log-dir", default=None, help="warm-shard logs (default: beside --out, or /tmp)")
    ap.add_argument("--project", default=None, help="recompute the projection tables from this JSON (no GPU)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--code", default=None, help="the code revision to record (default: git rev-parse HEAD here)")
    ap.add_argument("--breakdown", action="store_true",
                    help="after the table, time the verify's pieces (and build/post/draft pieces) at --breakdown-bs")
    ap.add_argument("--breakdown-bs", default=None, help="default 1,16,64 (smoke: the --bs list)")
    ap.add_argument("--triton-ops", action="store_true",
                    help="use this file's Triton kernels off CUDA too (with TRITON_INTERPRET=1)")
    ap.add_argument("--check", action="store_true", help="run the correctness checks off CUDA too")
    ap.add_argument("--dtype", choices=("bf16", "fp32"), default=None,
                    help="weights and activations (default bf16; fp32 for --smoke: Triton's CPU interpreter "
                         "gets bf16 wrong)")
    args = ap.parse_args(argv)
    t_start = time.time()

    def log(msg):
        print(f"[{time.time() - t_start:7.1f}s] {msg}", flush=True)

    if args.project:
        with open(args.project, encoding="utf-8") as f:
            data = json.load(f)
        proj = project(data["rows"], block=data["shape"]["block"])
        print(tables(data["rows"], proj, f"Decode step (from {args.project}) — {data['env'].get('device')}"))
        if data.get("breakdown"):
            print("\n" + breakdown_table(data["breakdown"], data["rows"]))
        if args.cost_out:
            write_json(args.cost_out, {**proj["cost"], **data.get("cost_meta", {})})
        if args.schedule_out:
            write_json(args.schedule_out, schedule_doc(proj, data))
        return 0

    shape = SMOKE if args.smoke else QWEN3_8B
    over = {}
    if args.layers is not None:
        over["layers"] = args.layers
    if args.draft_layers is not None:
        over["draft_layers"] = args.draft_layers
    if over:
        shape = Shape(**{**asdict(shape), **over})
    if args.smoke:
        if args.bs == "1,4,16,64":
            args.bs = "1,2"
        if args.widths == "16,33,65,129,257":
            args.widths = "16,33"
        if args.context == 1024:
            args.context = 40
        if args.attn == "sglang" and not os.environ.get("TRITON_INTERPRET"):
            args.attn = "sdpa"
    if args.warm_shard:
        run_warm_shard(args, shape, log)
        return 0
    graphs = torch.cuda.is_available() and not args.smoke
    device = "cuda" if graphs else "cpu"
    bss = [int(x) for x in args.bs.split(",")]
    widths = [int(x) for x in args.widths.split(",")]
    env = environment()
    log(f"env: {env}")
    attn = make_attention(args, shape)
    log(f"attention: {attn.kind} — {getattr(attn, 'desc', 'torch SDPA, dense mask')}")
    procs = []
    if args.warm_jobs > 0 and graphs:
        log_dir = args.log_dir or (os.path.dirname(os.path.abspath(args.out)) if args.out else "/tmp")
        os.makedirs(log_dir, exist_ok=True)
        procs = launch_warm_shards(args, args.warm_jobs, log_dir)
        log(f"warm-up: {len(procs)} shard processes compiling the kernels")
    ops = Ops(graphs or args.triton_ops, shape.eps)
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[args.dtype or ("fp32" if args.smoke else "bf16")]
    m = Models(shape, device, attn=attn, ops=ops, bs_max=max(bss), context=args.context,
               max_width=max(widths), seed=args.seed, dtype=dtype)
    log(f"models built: {m.weight_bytes() / 2**30:.2f} GiB of weights, KV pools "
        f"{(m.Kc.numel() + m.Vc.numel() + m.Kd.numel() + m.Vd.numel()) * m.Kc.element_size() / 2**30:.2f} GiB, "
        f"{dtype}, shape {asdict(shape)}")
    warm_info = []
    if procs:
        t0 = time.time()
        for p, path in procs:
            try:
                rc = p.wait(timeout=max(1.0, args.warm_timeout - (time.time() - t0)))
            except subprocess.TimeoutExpired:
                p.kill()
                rc = "timeout"
            tail = open(path).read().strip().splitlines()[-3:]
            warm_info.append(dict(rc=rc, log=path, tail=tail))
            if rc != 0:
                log(f"warm shard {path}: rc {rc}: {' | '.join(tail)}")
        log(f"warm-up done in {time.time() - t0:.1f} s (rc: {[w['rc'] for w in warm_info]})")
    checks = check_kernels(m, log) if (graphs or args.check) else {}
    ceil = measure_ceilings(log) if graphs else None
    deadline = t_start + args.max_seconds if args.max_seconds > 0 else float("inf")
    rows: List[dict] = []
    meta = dict(date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                code=args.code or git_rev(), command="python3 " + " ".join([os.path.relpath(__file__, REPO)] + sys.argv[1:]),
                env=env, shape=asdict(shape), context=args.context, dtype=str(dtype), attention=getattr(attn, "desc", "torch SDPA"),
                graphs=graphs, checks=checks, warm=warm_info, ceilings=ceil)
    for bs in bss:
        rows += measure_batch(m, bs, widths, graphs=graphs, target_s=args.target_seconds, min_reps=args.min_reps,
                              max_reps=args.max_reps, repeat_dflash=not args.no_repeat, log=log, deadline=deadline,
                              ceil=ceil)
        if args.out:
            write_json(args.out, dict(meta, rows=rows))
    bd_rows: List[dict] = []
    if args.breakdown:
        bd_bs = args.breakdown_bs or ("1,16,64" if graphs else args.bs)
        bd_cfg = BREAKDOWN_CONFIGS if graphs else [("dflash", shape.block)] + [("ddtree", w) for w in widths]
        bd_rows = breakdown(m, [int(x) for x in bd_bs.split(",")], bd_cfg, log, deadline=deadline)
    proj = project(rows, block=shape.block)
    head = (f"Decode step — {env.get('device')} — {meta['date']} — code {meta['code']} — "
            f"{'CUDA-graph replays' if graphs else 'EAGER CPU smoke (not a speed figure)'}; attention: {meta['attention']}")
    print(tables(rows, proj, head), flush=True)
    if bd_rows:
        print("\n" + breakdown_table(bd_rows, rows), flush=True)
    data = dict(meta, rows=rows, projection=proj, breakdown=bd_rows)
    cost_meta = dict(device=env.get("device"), date=meta["date"], command=meta["command"], code=meta["code"],
                     block_size=shape.block, context=args.context, shape=asdict(shape))
    data["cost_meta"] = cost_meta
    if args.out:
        write_json(args.out, data)
    if args.cost_out:
        write_json(args.cost_out, {**proj["cost"], **cost_meta})
    if args.schedule_out:
        write_json(args.schedule_out, schedule_doc(proj, data))
    log(f"done in {time.time() - t_start:.1f} s")
    return 0


def schedule_doc(proj: dict, data: dict) -> dict:
    c = proj["curves"]["paper"]
    return dict(schedule=c["schedule"], curve="paper", curve_description=c["description"],
                schedules_by_curve={k: v["schedule_text"] for k, v in proj["curves"].items()},
                measured_on=data["env"].get("device"), date=data.get("date"), command=data.get("command"))


def write_json(path: str, obj) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=1, default=str)
    os.replace(tmp, path)


if __name__ == "__main__":
    sys.exit(main())
