"""DDTree's tree-verify attention kernel, compiled, on the GPU.

* against float64 attention under the tree mask at the target's shapes (GQA 32/8, head 128, bf16;
  one and many row blocks; the prefix whole and split across programs), with the chain-mask control;
* against SGLang 0.5.23's own triton ``extend_attention_fwd`` with the same ``custom_mask`` on
  trees from our builder (the sglang package when it imports, else the kernel source from
  ``$DDTREE_SGLANG_KERNELS`` or .gpu/sglang-0.5.23-attention-kernels.zip, loaded as
  bench/decode_step.py loads it — run this file in its own pytest process then);
* without a mask (a chain step's verify): causal, against float64 and SGLang's causal
  ``extend_attention_fwd``;
* inside a CUDA graph: replay with new prefix lengths equals eager (the split count depends on
  shapes only).
"""

from __future__ import annotations

import os
import sys

import pytest
import torch

from patchsets.ddtree.kernels import ddtree_verify_attention as KA
from patchsets.ddtree.modules.ddtree_tree import build_custom_mask, build_ddtree
from tests.support.verify_attention import dense_reference, make_case, rel, run_kernel, to_device

pytestmark = pytest.mark.gpu
DEV = "cuda"
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _sglang_extend_attention():
    try:
        from sglang.kernels.ops.attention.extend_attention import extend_attention_fwd

        return extend_attention_fwd
    except Exception:  # noqa: BLE001 - the package needs many dependencies
        pass
    src = os.environ.get("DDTREE_SGLANG_KERNELS", os.path.join(REPO, ".gpu/sglang-0.5.23-attention-kernels.zip"))
    if not os.path.exists(src):
        pytest.skip("SGLang's extend_attention_fwd: neither the package nor the kernel source is here")
    sys.path.insert(0, os.path.join(REPO, "bench"))
    from decode_step import load_sglang_extend_attention

    return load_sglang_extend_attention(src)[0]


@pytest.mark.parametrize("T", [16, 65, 256])
@pytest.mark.parametrize("splits", [1, 4, 16])
def test_kernel_equals_dense_attention_bf16(T, splits):
    prefix = [37, 0, 1030, 300]
    c = to_device(make_case(T * 7 + splits, prefix, T, 32, 8, 128, dtype=torch.bfloat16), DEV)
    ref = dense_reference(c, 128 ** -0.5)
    out = run_kernel(c, num_kv_splits=splits)
    err = rel(out.cpu(), ref)
    assert err < 8e-3, err
    chain = to_device(make_case(T * 7 + splits, prefix, T, 32, 8, 128, dtype=torch.bfloat16, chain=True), DEV)
    assert rel(out.cpu(), dense_reference(chain, 128 ** -0.5)) > 10 * err
    print(f"DDTREE_ATTN T={T} splits={splits} rel_err={err:.2e}")


@pytest.mark.parametrize("N", [15, 63, 255])
def test_kernel_equals_sglang_extend_attention(N):
    extend_attention_fwd = _sglang_extend_attention()
    torch.manual_seed(N)
    bs, L, V, H, Hkv, D = 3, 15, 512, 32, 8, 128
    x = torch.randn(bs, L, V, device=DEV) * 4
    tree = build_ddtree(x, torch.tensor([1, 2, 3], device=DEV), N, 8,
                        request_budget=torch.tensor([N, N // 2, 3], device=DEV))
    N1 = N + 1
    prefix = torch.tensor([37, 0, 530], device=DEV)
    mask = build_custom_mask(tree, prefix, prefix_lens_sum=int(prefix.sum()))
    mask_indptr = torch.zeros(bs + 1, dtype=torch.int64, device=DEV)
    mask_indptr[1:] = torch.cumsum(N1 * (prefix + N1), 0)
    pool = 2048
    k_buf = torch.randn(pool, Hkv, D, device=DEV, dtype=torch.bfloat16)
    v_buf = torch.randn(pool, Hkv, D, device=DEV, dtype=torch.bfloat16)
    kv_indices = torch.randperm(pool, device=DEV)[: int(prefix.sum())].to(torch.int64)
    kv_indptr = torch.zeros(bs + 1, dtype=torch.int32, device=DEV)
    kv_indptr[1:] = torch.cumsum(prefix, 0).int()
    qo_indptr = torch.arange(0, (bs + 1) * N1, N1, dtype=torch.int32, device=DEV)
    q = torch.randn(bs * N1, H, D, device=DEV, dtype=torch.bfloat16)
    k = torch.randn(bs * N1, Hkv, D, device=DEV, dtype=torch.bfloat16)
    v = torch.randn(bs * N1, Hkv, D, device=DEV, dtype=torch.bfloat16)
    ref, ours = torch.empty_like(q), torch.empty_like(q)
    extend_attention_fwd(q, k, v, ref, k_buf, v_buf, qo_indptr, kv_indptr, kv_indices, mask, True,
                             mask_indptr, N1, 1.0, 1.0, sm_scale=D ** -0.5)
    for splits in (1, 8):
        KA.tree_verify_attention_fwd(q, k, v, ours, k_buf, v_buf, qo_indptr, kv_indptr, kv_indices, mask,
                                     mask_indptr, N1, D ** -0.5, num_kv_splits=splits)
        err = float((ours.float() - ref.float()).norm() / ref.float().norm())
        assert err < 8e-3, (splits, err)
    print(f"SGLANG_DDTREE_ATTN N={N} rel_err_vs_extend_attention={err:.2e}")


@pytest.mark.parametrize("T,splits", [(16, 1), (16, 8), (65, 4)])
def test_causal_kernel_equals_the_chains_attention_and_sglangs(T, splits):
    """No custom_mask (a chain step's verify): float64 attention under the lower-triangular mask,
    and SGLang's extend_attention_fwd run causal without a mask (as the triton backend runs a
    DFlash verify); the control: the tree case's attention is far from it."""
    extend_attention_fwd = _sglang_extend_attention()
    prefix = [37, 0, 1030, 300]
    chain = to_device(make_case(T * 11 + splits, prefix, T, 32, 8, 128, dtype=torch.bfloat16, chain=True), DEV)
    out = run_kernel(chain, causal=True, num_kv_splits=splits)
    err = rel(out.cpu(), dense_reference(chain, 128 ** -0.5))
    assert err < 8e-3, err
    tree = to_device(make_case(T * 11 + splits, prefix, T, 32, 8, 128, dtype=torch.bfloat16), DEV)
    assert rel(out.cpu(), dense_reference(tree, 128 ** -0.5)) > 10 * err
    ref = torch.empty_like(out)
    extend_attention_fwd(chain.q, chain.k, chain.v, ref, chain.kb, chain.vb, chain.qo_indptr, chain.kv_indptr,
                         chain.kv_indices, None, True, None, T, 1.0, 1.0, sm_scale=128 ** -0.5)
    vs = float((out.float() - ref.float()).norm() / ref.float().norm())
    assert vs < 8e-3, vs
    print(f"DDTREE_ATTN_CAUSAL T={T} splits={splits} rel_err={err:.2e} vs_extend_attention={vs:.2e}")


def test_graph_replay_with_new_prefix_lengths():
    T, prefix = 16, [200, 513]
    c = to_device(make_case(5, prefix, T, 32, 8, 128, dtype=torch.bfloat16), DEV)
    o = torch.empty_like(c.q)

    def call():
        KA.tree_verify_attention_fwd(c.q, c.k, c.v, o, c.kb, c.vb, c.qo_indptr, c.kv_indptr, c.kv_indices,
                                     c.custom_mask, c.mask_indptr, T, num_kv_splits=8)

    call()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        call()
    # shorter prefixes in the same buffers: request 1 drops to 100 tokens (its mask rows move)
    short = make_case(5, [200, 100], T, 32, 8, 128, dtype=torch.bfloat16)
    c.kv_indptr.copy_(short.kv_indptr.to(DEV))
    c.mask_indptr.copy_(short.mask_indptr.to(DEV))
    c.custom_mask[: short.custom_mask.numel()].copy_(short.custom_mask.to(DEV))
    g.replay()
    torch.cuda.synchronize()
    replayed = o.clone()
    call()
    torch.cuda.synchronize()
    assert torch.equal(replayed, o)
    c.prefix, c.tree_masks = [200, 100], short.tree_masks
    c.kv_indices = c.kv_indices[:300]
    assert rel(o.cpu(), dense_reference(c, 128 ** -0.5)) < 8e-3
