"""SGLang 0.5.23's own kernels on trees from our builder (issue 4's H200 proofs).

* ``verify_tree_greedy_triton`` and ``verify_tree_greedy_func`` (the JIT CUDA path real hosts
  use) accept exactly what our reference walk accepts, on >= 10,000 random trees, budgets 16-1024.
* SGLang's triton extend/verify attention kernel, fed our ``custom_mask`` (FULL_MASK layout) and
  ``mask_indptr``, equals a dense PyTorch attention with the same mask on random q/k/v.

Needs the sglang 0.5.23 wheel unzipped onto PYTHONPATH (tests/gpu/run_gpu_tests.sh does that).
"""

from __future__ import annotations

import os

import pytest
import torch

from patchsets.ddtree.modules.ddtree_accept import greedy_accept
from patchsets.ddtree.modules.ddtree_reference import greedy_walk_reference
from patchsets.ddtree.modules.ddtree_tree import build_custom_mask, build_ddtree, tree_positions

spec_tree = pytest.importorskip("sglang.kernels.ops.speculative.spec_tree")
DEV = "cuda"
pytestmark = pytest.mark.gpu
NUM_TREES = int(os.environ.get("DDTREE_SGLANG_TREES", "10240"))
BUDGETS = [16, 32, 64, 128, 256, 512, 1024]


def random_batch(seed, bs, N, L=15, V=256):
    g = torch.Generator(device=DEV).manual_seed(seed)
    x = (torch.randn(bs, L, V, generator=g, device=DEV) * torch.rand(bs, L, 1, generator=g, device=DEV) * 6)
    rb = torch.randint(1, N + 1, (bs,), generator=g, device=DEV)
    rb[: bs // 2] = N
    tree = build_ddtree(x.to(torch.bfloat16), torch.randint(0, V, (bs,), generator=g, device=DEV),
                        N, N, request_budget=rb)
    # target picks: a child's token (first or a later sibling) with prob p per request, else random
    N1 = N + 1
    child = tree.retrieve_next_token.clamp(min=0)
    hop = torch.randint(0, 3, (bs, N1), generator=g, device=DEV)
    for _ in range(2):
        sib = torch.gather(tree.retrieve_next_sibling, 1, child)
        child = torch.where((hop > 0) & (sib >= 0), sib, child)
        hop = hop - 1
    follow = torch.gather(tree.tokens, 1, child)
    p = 0.5 + 0.5 * torch.rand(bs, 1, generator=g, device=DEV)
    tgt = torch.where(torch.rand(bs, N1, generator=g, device=DEV) < p, follow,
                      torch.randint(0, V, (bs, N1), generator=g, device=DEV))
    return tree, tgt


def run_sglang(fn, tree, tgt):
    bs, N1 = tree.tokens.shape
    L1 = tree.max_depth + 1
    predicts = torch.full((bs * N1,), -7, dtype=torch.int32, device=DEV)
    accept_index = torch.full((bs, L1), -1, dtype=torch.int32, device=DEV)
    accept_num = torch.full((bs,), -7, dtype=torch.int32, device=DEV)
    kw = dict(
        predicts=predicts, accept_index=accept_index, accept_token_num=accept_num,
        candidates=tree.tokens, retrieve_index=tree.retrieve_index,
        retrieve_next_token=tree.retrieve_next_token,
        retrieve_next_sibling=tree.retrieve_next_sibling, target_predict=tgt.to(torch.int64),
    )
    fn(**kw)
    return predicts, accept_index, accept_num


def test_sglang_tree_verify_accepts_what_our_walk_accepts():
    per = max(1, NUM_TREES // len(BUDGETS))
    total = 0
    stats = {}
    for N in BUDGETS:
        bs = 64
        done = 0
        seed = N
        accepted = 0
        while done < per:
            tree, tgt = random_batch(seed, bs, N)
            seed += 1000
            ours = greedy_accept(tree, tgt)  # Triton walk on CUDA
            ours_t = greedy_accept(tree, tgt, use_triton=False)
            assert torch.equal(ours.accept_index, ours_t.accept_index)
            N1 = N + 1
            base = (torch.arange(bs, device=DEV) * N1)[:, None]
            want_idx = torch.where(ours.accept_index >= 0, base + ours.accept_index, -1).int()
            for name, fn in (("triton", spec_tree.verify_tree_greedy_triton),
                             ("jit_cuda", spec_tree.verify_tree_greedy_func)):
                pred, aidx, anum = run_sglang(fn, tree, tgt)
                assert torch.equal(aidx, want_idx), name
                assert torch.equal(anum.long(), ours.accept_length), name
                last = torch.gather(want_idx.long(), 1, ours.accept_length[:, None]).squeeze(1)
                assert torch.equal(pred[last].long(), ours.bonus_token), name
            # the Python reference walk on every tree
            tok, par, val, tg = (tree.tokens.cpu(), tree.parents.cpu(), tree.valid.cpu(), tgt.cpu())
            ai = ours.accept_index.cpu()
            bonus = ours.bonus_token.cpu()
            for b in range(bs):
                path, bon = greedy_walk_reference(tok[b], par[b], tg[b], val[b])
                n = len(path) - 1
                assert ai[b, : n + 1].tolist() == path and bool((ai[b, n + 1 :] == -1).all())
                assert int(bonus[b]) == bon
                accepted += n
            done += bs
        total += done
        stats[N] = accepted / done
    print(f"SGLANG_VERIFY trees={total} mean_accept_by_budget={stats}")
    assert total >= NUM_TREES - len(BUDGETS) * 64


def dense_attention(q, k, v, mask, scale):
    """q [T, H, D], k/v [S, Hkv, D], mask [T, S] bool -> [T, H, D] (fp32 math)."""
    H, Hkv = q.shape[1], k.shape[1]
    k = k.repeat_interleave(H // Hkv, dim=1).float()
    v = v.repeat_interleave(H // Hkv, dim=1).float()
    s = torch.einsum("thd,shd->hts", q.float(), k) * scale
    s = s.masked_fill(~mask[None], float("-inf"))
    return torch.einsum("hts,shd->thd", torch.softmax(s, -1), v)


@pytest.mark.parametrize("N", [15, 63, 255])
@pytest.mark.parametrize("skip_prefix_mask", [True, False])
def test_sglang_triton_extend_attention_with_our_mask(N, skip_prefix_mask):
    from sglang.kernels.ops.attention.extend_attention import extend_attention_fwd

    torch.manual_seed(N)
    bs, L, V, H, Hkv, D = 3, 15, 512, 8, 2, 128
    x = torch.randn(bs, L, V, device=DEV) * 4
    tree = build_ddtree(x, torch.tensor([1, 2, 3], device=DEV), N, 8,
                        request_budget=torch.tensor([N, N // 2, 3], device=DEV))
    N1 = N + 1
    prefix = torch.tensor([37, 0, 130], device=DEV)
    pl_sum = int(prefix.sum())
    mask = build_custom_mask(tree, prefix, prefix_lens_sum=pl_sum)
    mask_indptr = torch.zeros(bs + 1, dtype=torch.int64, device=DEV)
    mask_indptr[1:] = torch.cumsum(N1 * (prefix + N1), 0)
    # KV pool: prefix tokens at scattered slots
    pool = 1024
    k_buf = torch.randn(pool, Hkv, D, device=DEV, dtype=torch.bfloat16)
    v_buf = torch.randn(pool, Hkv, D, device=DEV, dtype=torch.bfloat16)
    perm = torch.randperm(pool, device=DEV)[:pl_sum]
    kv_indices = perm.to(torch.int64)
    kv_indptr = torch.zeros(bs + 1, dtype=torch.int32, device=DEV)
    kv_indptr[1:] = torch.cumsum(prefix, 0).int()
    qo_indptr = torch.arange(0, (bs + 1) * N1, N1, dtype=torch.int32, device=DEV)
    T = bs * N1
    q = torch.randn(T, H, D, device=DEV, dtype=torch.bfloat16)
    k = torch.randn(T, Hkv, D, device=DEV, dtype=torch.bfloat16)
    v = torch.randn(T, Hkv, D, device=DEV, dtype=torch.bfloat16)
    o = torch.empty_like(q)
    scale = D ** -0.5
    extend_attention_fwd(q, k, v, o, k_buf, v_buf, qo_indptr, kv_indptr, kv_indices, mask, True,
                         mask_indptr, N1, 1.0, 1.0, sm_scale=scale,
                         skip_prefix_custom_mask=skip_prefix_mask)
    positions = tree_positions(tree, prefix)
    assert positions.shape == (T,)
    errs = []
    for b in range(bs):
        p = int(prefix[b])
        idx = kv_indices[int(kv_indptr[b]) : int(kv_indptr[b + 1])]
        kk = torch.cat([k_buf[idx], k[b * N1 : (b + 1) * N1]])
        vv = torch.cat([v_buf[idx], v[b * N1 : (b + 1) * N1]])
        m = torch.cat([torch.ones(N1, p, dtype=torch.bool, device=DEV), tree.tree_mask[b]], 1)
        ref = dense_attention(q[b * N1 : (b + 1) * N1], kk, vv, m, scale)
        got = o[b * N1 : (b + 1) * N1].float()
        rel = (got - ref).norm() / ref.norm()
        errs.append(float(rel))
        assert rel < 2e-2, (b, float(rel))
        # the mask matters: a chain (causal) mask gives a different answer when the tree branches
        if int(tree.num_nodes[b]) > int(tree.depths[b].max()):
            causal = torch.cat([torch.ones(N1, p, dtype=torch.bool, device=DEV),
                                torch.tril(torch.ones(N1, N1, dtype=torch.bool, device=DEV))], 1)
            wrong = dense_attention(q[b * N1 : (b + 1) * N1], kk, vv, causal, scale)
            assert (wrong - ref).norm() / ref.norm() > 10 * rel
    print(f"SGLANG_ATTN N={N} skip_prefix_mask={skip_prefix_mask} rel_err={errs}")
