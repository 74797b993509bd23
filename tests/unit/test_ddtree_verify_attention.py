"""DDTree's tree-verify attention kernel equals dense attention, in Triton's CPU interpreter.

Each case builds a batch of trees (random parents, every node after its parent), SGLang's flat
FULL_MASK ``custom_mask`` through ``ddtree_tree.build_custom_mask``, a KV pool with each request's
prefix at scattered slots, and compares ``tree_verify_attention_fwd`` with softmax attention in
float64 over [prefix, tree tokens] under the tree mask. Controls: the same inputs under a chain
(causal) mask differ far beyond the tolerance, so a kernel that ignored the tree would fail. Without
a mask the kernel is causal (a chain step's verify), checked against the chain's attention.
tests/gpu/test_gpu_sglang_kernels.py compares it with SGLang's own ``extend_attention_fwd``.
Run: ``TRITON_INTERPRET=1 pytest tests/unit/test_ddtree_verify_attention.py``.
"""

from __future__ import annotations

import os

import pytest
import torch

pytest.importorskip("triton")
if os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("needs TRITON_INTERPRET=1 to run Triton kernels on CPU tensors", allow_module_level=True)

from patchsets.ddtree.kernels import ddtree_verify_attention as KA  # noqa: E402
from patchsets.ddtree.modules.ddtree_tree import build_custom_mask  # noqa: E402
from tests.support.verify_attention import TreeStub, dense_reference, make_case, rel, run_kernel  # noqa: E402


@pytest.mark.parametrize("prefix,T,hq,hkv,splits", [
    ([37, 0, 130], 16, 8, 2, 1),  # GQA 4: 64 rows; a request with no prefix
    ([37, 0, 130], 16, 8, 2, 4),  # the prefix split four ways (flash-decoding) and merged
    ([5], 9, 4, 4, 2),  # MHA, a width that is no power of two, more splits than prefix blocks
    ([70, 3], 40, 4, 1, 2),  # 160 rows: two row blocks; MQA
    ([12, 5], 10, 6, 2, 2),  # GQA 3: no power of two, so each row reads its own mask row (no FOLD_G)
])
def test_kernel_equals_dense_attention(prefix, T, hq, hkv, splits):
    d = 16
    c = make_case(len(prefix) * 100 + T, prefix, T, hq, hkv, d)
    ref = dense_reference(c, d ** -0.5)
    out = run_kernel(c, num_kv_splits=splits, block_n=16)
    assert rel(out, ref) < 1e-5
    # The control: the same tokens under a chain mask are far from the tree's attention.
    chain = make_case(len(prefix) * 100 + T, prefix, T, hq, hkv, d, chain=True)
    assert rel(out, dense_reference(chain, d ** -0.5)) > 1e-2


@pytest.mark.parametrize("prefix,T,hq,hkv,splits", [
    ([37, 0, 130], 16, 8, 2, 1),
    ([37, 0, 130], 16, 8, 2, 4),
    ([70, 3], 40, 4, 1, 2),  # two row blocks
])
def test_causal_kernel_without_a_mask_equals_the_chains_attention(prefix, T, hq, hkv, splits):
    """No custom_mask: the tree part is causal (a chain step's verify, DFlash's own step in the
    DDTREE worker) and equals float64 attention under the lower-triangular mask and the kernel run
    with that mask spelled out; the control: a tree's attention is far from it."""
    d = 16
    chain = make_case(len(prefix) * 100 + T, prefix, T, hq, hkv, d, chain=True)
    out = run_kernel(chain, causal=True, num_kv_splits=splits, block_n=16)
    assert rel(out, dense_reference(chain, d ** -0.5)) < 1e-5
    assert rel(out, run_kernel(chain, num_kv_splits=splits, block_n=16)) < 1e-6
    tree = make_case(len(prefix) * 100 + T, prefix, T, hq, hkv, d)
    assert rel(out, dense_reference(tree, d ** -0.5)) > 1e-2
    with pytest.raises(ValueError, match="mask_indptr"):
        KA.tree_verify_attention_fwd(chain.q, chain.k, chain.v, out, chain.kb, chain.vb, chain.qo_indptr,
                                     chain.kv_indptr, chain.kv_indices, chain.custom_mask, None, T)


def test_half_precision_and_every_split_agree():
    """fp16 (the interpreter's tl.dot takes bf16 operands as raw integers, so bf16 is checked on
    the GPU: tests/gpu/test_gpu_sglang_kernels.py)."""
    c = make_case(7, [50, 17], 16, 8, 2, 32, dtype=torch.float16)
    ref = dense_reference(c, 0.3)
    outs = [run_kernel(c, sm_scale=0.3, num_kv_splits=s, block_n=16) for s in (1, 2, 8)]
    for o in outs:
        assert o.dtype == torch.float16 and rel(o, ref) < 2e-3
    assert rel(outs[0], outs[2]) < 1e-2


def test_ancestors_first_bound_equals_full_scan():
    c = make_case(11, [20, 9], 40, 4, 1, 16)
    a = run_kernel(c, num_kv_splits=1, block_n=16, ancestors_first=True)
    b = run_kernel(c, num_kv_splits=1, block_n=16, ancestors_first=False)
    assert rel(a, b) < 1e-6


def test_full_scan_serves_a_mask_in_any_order():
    """A tree whose nodes are not in topological order (a child before its parent): only the
    full scan is right; the ancestors-first bound misses keys (the control)."""
    c = make_case(3, [12], 40, 4, 1, 16)
    T = c.T
    rev = torch.flip(torch.eye(T, dtype=torch.bool), [1])  # node t -> position T-1-t
    m = (rev.float() @ c.tree_masks[0].float() @ rev.float()).bool()
    c.tree_masks[0] = m
    c.custom_mask = build_custom_mask(TreeStub(torch.zeros(1, T, dtype=torch.long), m[None]),
                                      torch.tensor([12]), use_triton=False)
    ref = dense_reference(c, 0.25)
    assert rel(run_kernel(c, sm_scale=0.25, block_n=16, ancestors_first=False), ref) < 1e-5
    assert rel(run_kernel(c, sm_scale=0.25, block_n=16, ancestors_first=True), ref) > 1e-3


def test_splits_follow_the_batch_not_the_prefix():
    assert KA.tree_verify_kv_splits(64, 8, 1, 132) == 1
    assert KA.tree_verify_kv_splits(1, 8, 1, 132) == 16
    assert KA.tree_verify_kv_splits(4, 8, 1, 132) == 16
    assert KA.tree_verify_kv_splits(16, 8, 1, 132) == 4
    assert KA.tree_verify_kv_splits(16, 8, 2, 132) == 2
    assert KA.tree_verify_kv_splits(16, 8, 3, 132) == 1


def test_unsupported_calls_are_refused():
    c = make_case(1, [4], 4, 4, 2, 16)
    assert not KA.tree_verify_attention_supports(c.q, c.kb, logit_cap=30.0)
    assert not KA.tree_verify_attention_supports(c.q, c.kb, sliding_window_size=128)
    assert not KA.tree_verify_attention_supports(c.q, c.kb.to(torch.float16))
    assert not KA.tree_verify_attention_supports(c.q[:, :3], c.kb)  # 3 heads over 2 KV heads
    assert KA.tree_verify_attention_supports(c.q, c.kb)
    o = torch.empty(c.q.shape[0], c.q.shape[1], c.v.shape[2], dtype=torch.float32)
    with pytest.raises(ValueError, match="extend_attention_fwd"):
        KA.tree_verify_attention_fwd(c.q, c.k, c.v, o, c.kb.half(), c.vb.half(), c.qo_indptr, c.kv_indptr,
                                     c.kv_indices, c.custom_mask, c.mask_indptr, c.T)


def test_the_backend_hook_runs_tree_verifies_and_declines_the_rest():
    """``ddtree_verify_fwd``: SGLang's triton backend calls it with ``extend_attention_fwd``'s
    arguments (and keywords like ``max_bs``); True and the kernel's output for a tree verify, False
    and nothing written for every call it must leave to ``extend_attention_fwd``."""
    c = make_case(21, [30, 7], 16, 8, 2, 16)
    want = run_kernel(c, sm_scale=0.25)

    def hook(mask, causal=True, indptr=c.mask_indptr, **kw):
        o = torch.full((c.q.shape[0], c.q.shape[1], c.v.shape[2]), 7.0)
        ran = KA.ddtree_verify_fwd(c.q, c.k, c.v, o, c.kb, c.vb, c.qo_indptr, c.kv_indptr, c.kv_indices,
                                   mask, causal, indptr, c.T, 1.0, 1.0, 0.25, **kw)
        return ran, o

    ran, o = hook(c.custom_mask, max_bs=8, sliding_window_size=-1, sinks=None, window_kv_offsets=None,
                  xai_temperature_len=-1, logit_cap=0.0)
    assert ran and torch.equal(o, want)
    # a chain step (DFlash's own, in the DDTREE worker): causal, no custom_mask -> the causal kernel
    ran, o = hook(None, indptr=None, max_bs=8)
    assert ran and torch.equal(o, run_kernel(c, causal=True, sm_scale=0.25))
    for mask, kw in [(None, {"causal": False}),  # no mask and not causal: not a verify it serves
                     (c.custom_mask, {"indptr": None}),
                     (c.custom_mask, {"logit_cap": 30.0}),
                     (c.custom_mask, {"sliding_window_size": 64}),
                     (c.custom_mask, {"window_kv_offsets": torch.zeros(2, dtype=torch.int64)}),
                     (c.custom_mask, {"xai_temperature_len": 128}),
                     (c.custom_mask, {"sinks": torch.zeros(8)})]:
        ran, o = hook(mask, **kw)
        assert not ran and bool((o == 7.0).all()), kw


def test_launch_knobs_by_shape():
    """The H200 sweeps' best per row (bs 1-64 x T 16-65, GQA 4 over 8 KV heads)."""
    def knobs(bs, T):
        bm, mb = KA.tree_verify_row_blocks(T, 4)
        return KA.tree_verify_launch(bm, mb, bs * mb * 8)

    assert [knobs(bs, 16) for bs in (1, 16, 64)] == [(32, 4, 2, 16), (32, 4, 2, 16), (64, 4, 3, 16)]
    assert [knobs(bs, 33) for bs in (1, 16, 64)] == [(32, 8, 2, 16), (32, 8, 2, 16), (32, 4, 2, 32)]
    assert [knobs(bs, 65) for bs in (1, 4, 16, 64)] == [(32, 8, 2, 16), (32, 8, 2, 16), (128, 8, 2, 32),
                                                        (32, 4, 2, 32)]
