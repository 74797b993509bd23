"""Inputs and a float64 reference for DDTree's tree-verify attention kernel
(tests/unit/test_ddtree_verify_attention.py under the interpreter, tests/gpu on the GPU)."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import List

import torch

from patchsets.ddtree.kernels import ddtree_verify_attention as KA
from patchsets.ddtree.modules.ddtree_tree import build_custom_mask


@dataclass
class TreeStub:  # what build_custom_mask reads
    tokens: torch.Tensor
    tree_mask: torch.Tensor


@dataclass
class Case:
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    kb: torch.Tensor
    vb: torch.Tensor
    qo_indptr: torch.Tensor
    kv_indptr: torch.Tensor
    kv_indices: torch.Tensor
    custom_mask: torch.Tensor
    mask_indptr: torch.Tensor
    tree_masks: List[torch.Tensor]  # [T, T] bool per request
    prefix: List[int]
    T: int


def ancestor_mask(parents: torch.Tensor) -> torch.Tensor:
    """[T, T] bool ancestor-or-self mask of a tree given parents[j] < j (parents[0] = -1)."""
    T = parents.numel()
    m = torch.eye(T, dtype=torch.bool)
    for j in range(1, T):
        m[j] |= m[int(parents[j])]
    return m


def make_case(seed: int, prefix: List[int], T: int, hq: int, hkv: int, d: int, dtype=torch.float32,
              chain: bool = False) -> Case:
    g = torch.Generator().manual_seed(seed)
    bs = len(prefix)
    masks = []
    for _ in range(bs):
        par = torch.tensor([-1] + [int(torch.randint(0, j, (1,), generator=g)) for j in range(1, T)])
        masks.append(torch.tril(torch.ones(T, T, dtype=torch.bool)) if chain else ancestor_mask(par))
    tree = TreeStub(tokens=torch.zeros(bs, T, dtype=torch.long), tree_mask=torch.stack(masks))
    pl = torch.tensor(prefix, dtype=torch.int64)
    custom_mask = build_custom_mask(tree, pl, use_triton=False)
    sizes = T * (pl + T)
    mask_indptr = torch.cat([torch.zeros(1, dtype=torch.int64), torch.cumsum(sizes, 0)])
    slots = 3 * sum(prefix) + 7
    perm = torch.randperm(slots, generator=g)
    kv_indices = perm[: sum(prefix)].to(torch.int64)
    kv_indptr = torch.cat([torch.zeros(1, dtype=torch.int64), torch.cumsum(pl, 0)]).to(torch.int32)
    qo_indptr = (torch.arange(bs + 1, dtype=torch.int32) * T)

    def rnd(*shape):
        return (torch.randn(*shape, generator=g) * 1.5).to(dtype)

    return Case(rnd(bs * T, hq, d), rnd(bs * T, hkv, d), rnd(bs * T, hkv, d), rnd(slots, hkv, d),
                rnd(slots, hkv, d), qo_indptr, kv_indptr, kv_indices, custom_mask, mask_indptr,
                masks, prefix, T)


def dense_reference(c: Case, scale: float) -> torch.Tensor:
    """Float64 softmax attention of every tree token over [its prefix, its visible tree tokens]
    (computed on the CPU)."""
    c = to_device(c, "cpu")
    hq, hkv = c.q.shape[1], c.k.shape[1]
    out = torch.empty(c.q.shape[0], hq, c.v.shape[2], dtype=torch.float64)
    for b, P in enumerate(c.prefix):
        s0, s1 = int(c.qo_indptr[b]), int(c.qo_indptr[b + 1])
        idx = c.kv_indices[int(c.kv_indptr[b]): int(c.kv_indptr[b + 1])]
        keys = torch.cat([c.kb[idx], c.k[s0:s1]]).double().repeat_interleave(hq // hkv, 1)  # [P+T, hq, d]
        vals = torch.cat([c.vb[idx], c.v[s0:s1]]).double().repeat_interleave(hq // hkv, 1)
        q = c.q[s0:s1].double()  # [T, hq, d]
        att = torch.einsum("thd,nhd->htn", q, keys) * scale
        seen = torch.cat([torch.ones(c.T, P, dtype=torch.bool), c.tree_masks[b]], 1)  # [T, P+T]
        att = att.masked_fill(~seen[None], float("-inf")).softmax(-1)
        out[s0:s1] = torch.einsum("htn,nhd->thd", att, vals)
    return out


def run_kernel(c: Case, *, causal: bool = False, **kw) -> torch.Tensor:
    """The kernel's output for the case; ``causal``: without the case's mask (a chain's verify)."""
    o = torch.empty(c.q.shape[0], c.q.shape[1], c.v.shape[2], dtype=c.q.dtype, device=c.q.device)
    mask, indptr = (None, None) if causal else (c.custom_mask, c.mask_indptr)
    KA.tree_verify_attention_fwd(c.q, c.k, c.v, o, c.kb, c.vb, c.qo_indptr, c.kv_indptr, c.kv_indices,
                                 mask, indptr, c.T, **kw)
    return o


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


def to_device(c: Case, device: str) -> Case:
    """The case's tensors on ``device`` (the tree masks stay on the CPU for the reference)."""
    kw = {f.name: getattr(c, f.name) for f in fields(c)}
    for k, v in kw.items():
        if isinstance(v, torch.Tensor):
            kw[k] = v.to(device)
    return Case(**kw)
