"""DDTree core on CUDA: equality with the CPU reference in bf16 and fp32, Triton == torch paths,
and the whole decode-step tensor pipeline captured in a CUDA graph equal to eager on replay."""

from __future__ import annotations

import pytest
import torch

from patchsets.ddtree.modules.ddtree_accept import accepted_flat_indices, greedy_accept
from patchsets.ddtree.modules.ddtree_reference import build_tree_reference, reference_labelled
from patchsets.ddtree.modules.ddtree_tree import (
    build_custom_mask,
    build_ddtree,
    build_tree_arrays,
    custom_mask_size,
    draft_topk,
    tree_positions,
)

from tests.support.ddtree import assert_prune_beam_matches, assert_tree_arrays_match, draft_logits  # noqa: E402

FIELDS = ("tokens", "parents", "depths", "valid", "scores")
DEV = "cuda"
pytestmark = pytest.mark.gpu


def logits(seed, bs, L, V, dtype, kind="normal"):
    return draft_logits(seed, bs, L, V, dtype, kind=kind)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("V,N,K,kind", [
    (64, 16, 16, "normal"), (64, 200, 50, "ties"), (1000, 512, 512, "normal"),
    (151_936, 256, 256, "normal"), (151_936, 1024, 1024, "normal"), (151_936, 64, 8, "ties"),
    (151_936, 512, 512, "peaked"), (4096, 1024, 1024, "peaked"),
])
def test_cuda_tree_equals_cpu_reference(dtype, V, N, K, kind):
    bs, L = 3, 15
    x = logits(V + N, bs, L, V, dtype, kind)
    rb = torch.tensor([N, N // 3, 1])
    tree = build_ddtree(x.to(DEV), torch.tensor([1, 2, 3], device=DEV), N, K,
                        request_budget=rb.to(DEV), use_triton=True)
    _, ids_gpu, lse_gpu = draft_topk(x.to(DEV), K, use_triton=True)
    _, ids_cpu, _ = draft_topk(x, K)
    assert torch.equal(ids_gpu.cpu(), ids_cpu), "tie rule must give the same top-K ids on both"
    for b in range(bs):
        n_b = int(rb[b])
        ref = build_tree_reference(x[b], n_b, K, lse=lse_gpu[b].cpu())
        want = reference_labelled(ref, b + 1, N)
        for f in FIELDS:
            assert torch.equal(getattr(tree, f)[b].cpu(), want[f]), (b, f)
    # the selection beam (beam="select") and the chunk-parallel prep (prep="chunked") give the
    # reference tree too (each fed the log-sum-exp its own prep computed)
    for prep, beam in (("row", "select"), ("chunked", "select"), ("chunked", "sort"),
                       ("radix", "select"), ("radix", "sort"), ("radix", "prune"), ("chunked", "prune"),
                       ("bound", "prune")):
        t2 = build_ddtree(x.to(DEV), torch.tensor([1, 2, 3], device=DEV), N, K,
                          request_budget=rb.to(DEV), use_triton=True, prep=prep, beam=beam)
        _, ids_v, lse_v = draft_topk(x.to(DEV), K, use_triton=True, prep=prep)
        assert torch.equal(ids_v.cpu(), ids_cpu)
        for b in range(bs):
            want = reference_labelled(build_tree_reference(x[b], int(rb[b]), K, lse=lse_v[b].cpu()),
                                      b + 1, N)
            for f in FIELDS:
                assert torch.equal(getattr(t2, f)[b].cpu(), want[f]), (prep, beam, b, f)
        if prep == "row":
            t0 = build_ddtree(x.to(DEV), torch.tensor([1, 2, 3], device=DEV), N, K,
                              request_budget=rb.to(DEV), use_triton=True, prep="row", beam="sort")
            for f in FIELDS + ("retrieve_next_token", "retrieve_next_sibling", "tree_mask", "num_nodes"):
                assert torch.equal(getattr(t2, f), getattr(t0, f)), (beam, f)
    # and the whole CPU build (its own lse) gives the same tree; the only legitimate difference
    # would be a cross-depth near-tie within the CPU/GPU log-sum-exp rounding (reported, bounded)
    cpu = build_ddtree(x, torch.tensor([1, 2, 3]), N, K, request_budget=rb, use_triton=False)
    _, _, lse_cpu = draft_topk(x, K)
    same = all(torch.equal(getattr(cpu, f), getattr(tree, f).cpu())
               for f in ("tokens", "parents", "valid", "retrieve_next_token",
                         "retrieve_next_sibling", "tree_mask"))
    lse_diff = float((lse_cpu - lse_gpu.cpu()).abs().max())
    print(f"CPU_VS_CUDA dtype={dtype} V={V} N={N} K={K} kind={kind} identical={same} "
          f"max_lse_diff={lse_diff:.2e}")
    assert lse_diff < 1e-4
    if not same:  # differing nodes must sit at the budget boundary within rounding
        for b in range(bs):
            a, c = tree.scores[b].cpu(), cpu.scores[b]
            va, vc = tree.valid[b].cpu(), cpu.valid[b]
            lo = min(a[va].min(), c[vc].min())
            diff = set(zip(tree.tokens[b].cpu().tolist(), tree.depths[b].cpu().tolist())) ^ set(
                zip(cpu.tokens[b].tolist(), cpu.depths[b].tolist()))
            assert not diff or float((a[va].min() - c[vc].min()).abs()) < 1e-4 + 0 * lo


@pytest.mark.parametrize("N", [1, 16, 100, 512, 1024])
def test_triton_paths_equal_torch(N):
    from patchsets.ddtree.kernels import ddtree_beam as KB
    from patchsets.ddtree.kernels import ddtree_verify_inputs as KV
    from patchsets.ddtree.modules.ddtree_tree import _beam_search, candidate_pairs

    bs, L, V = 8, 15, 4096
    x = logits(N, bs, L, V, torch.bfloat16).to(DEV)
    rb = torch.randint(0, N + 1, (bs,), device=DEV)
    # prep: same ids (tie rule), lse equal up to float32 rounding
    lp, ids, lse = draft_topk(x, N, use_triton=True, prep="row")
    lp2, ids2, lse2 = draft_topk(x, N, use_triton=False)
    assert torch.equal(ids, ids2)
    torch.testing.assert_close(lse, lse2, rtol=0, atol=2e-5)
    lp3, ids3, lse3 = draft_topk(x, N, use_triton=True, prep="chunked")
    assert torch.equal(ids3, ids2)
    torch.testing.assert_close(lse3, lse2, rtol=0, atol=2e-5)
    lp4, ids4, lse4 = draft_topk(x, N, use_triton=True, prep="radix")
    assert torch.equal(ids4, ids2)
    torch.testing.assert_close(lse4, lse2, rtol=0, atol=2e-5)
    assert torch.equal(lse4, lse3) and torch.equal(lp4, lp3)
    # fused beam == torch beam on the same log-probs (bit for bit)
    ci, ck = candidate_pairs(N, lp.shape[-1], lp.device)
    for a, b in zip(_beam_search(lp, N), KB.beam_triton(lp, N, ci, ck)[:4]):
        assert torch.equal(a, b)
    # selection beam == sort beam, gtop included; pruned beam == sort beam where it survives
    full = KB.beam_triton(lp, N, ci, ck)
    for a, b in zip(full, KB.beam_select_triton(lp, N, ci, ck)):
        assert torch.equal(a, b)
    assert_prune_beam_matches(full, KB.beam_prune_triton(lp, N, ci, ck))
    xp = logits(N + 7, bs, L, V, torch.bfloat16, "peaked").to(DEV)
    lpp, _, _ = draft_topk(xp, N, use_triton=True)
    full_p = KB.beam_triton(lpp, N, ci, ck)
    for bound in ("none", "chain", "tight"):  # every score bound: same gtop, beams still prefixes
        assert_prune_beam_matches(full_p, KB.beam_prune_triton(lpp, N, ci, ck, bound=bound))
    ts = build_ddtree(x, torch.arange(bs, device=DEV), N, N, request_budget=rb, use_triton=True,
                      beam="select")
    t = build_ddtree(x, torch.arange(bs, device=DEV), N, N, request_budget=rb, use_triton=True)
    t2 = build_ddtree(x, torch.arange(bs, device=DEV), N, N, request_budget=rb, use_triton=False)
    same = torch.equal(t.tokens, t2.tokens) and torch.equal(t.parents, t2.parents)
    print(f"TRITON_VS_TORCH N={N} identical_trees={same}")
    for f in FIELDS + ("retrieve_next_token", "retrieve_next_sibling", "tree_mask", "num_nodes"):
        assert torch.equal(getattr(t, f), getattr(ts, f)), ("select", f)
    if same:
        for f in ("depths", "valid", "retrieve_next_token", "retrieve_next_sibling", "tree_mask",
                  "num_nodes"):
            assert torch.equal(getattr(t, f), getattr(t2, f)), f
    for a, b in zip(build_tree_arrays(t.parents, t.valid, L), KV.tree_arrays_triton(t.parents, t.valid, L)):
        assert torch.equal(a, b)
    assert_tree_arrays_match(t)  # the links the label kernel wrote
    pl = torch.randint(0, 300, (bs,), device=DEV)
    tot = custom_mask_size(int(pl.sum()), bs, N + 1)
    m1 = build_custom_mask(t, pl, out=torch.zeros(tot + 5, dtype=torch.bool, device=DEV), use_triton=False)
    m2 = build_custom_mask(t, pl, out=torch.zeros(tot + 5, dtype=torch.bool, device=DEV), use_triton=True)
    assert torch.equal(m1, m2)
    follow = torch.gather(t.tokens, 1, t.retrieve_next_token.clamp(min=0))
    tgt = torch.where(torch.rand(bs, N + 1, device=DEV) < 0.8, follow,
                      torch.randint(0, V, (bs, N + 1), device=DEV))
    a, b = greedy_accept(t, tgt, use_triton=False), greedy_accept(t, tgt, use_triton=True)
    for f in ("accept_index", "accept_length", "bonus_token"):
        assert torch.equal(getattr(a, f), getattr(b, f)), f


def pipeline(x, roots, rb, prefix_lens, mask_buf, pos_buf, target_logits, N, K, use_triton=None):
    """The decode step's tensor work: tree, verify inputs (mask, positions written in place),
    greedy acceptance, compaction/hand-off indices."""
    tree = build_ddtree(x, roots, N, K, request_budget=rb, use_triton=use_triton)
    build_custom_mask(tree, prefix_lens, out=mask_buf, use_triton=use_triton)
    pos_buf.copy_(tree_positions(tree, prefix_lens))
    # target picks: follow the first child where target_logits[..., 0] > -0.5, else its argmax
    follow = torch.gather(tree.tokens, 1, tree.retrieve_next_token.clamp(min=0))
    target = torch.where(target_logits[..., 0] > -0.5, follow, target_logits.argmax(-1))
    acc = greedy_accept(tree, target, use_triton=use_triton)
    idx = accepted_flat_indices(tree, acc)
    return (tree.tokens, tree.parents, tree.retrieve_next_token, tree.retrieve_next_sibling,
            acc.accept_index, acc.accept_length, acc.bonus_token, idx.flat_index, idx.contiguous)


@pytest.mark.parametrize("use_triton", [True, False])
@pytest.mark.parametrize("bs,N,V", [(1, 512, 151_936), (8, 64, 32_000), (4, 1024, 4096)])
def test_cuda_graph_capture_replay_equals_eager(bs, N, V, use_triton):
    L = 15
    x = torch.empty(bs, L, V, dtype=torch.bfloat16, device=DEV)
    roots = torch.empty(bs, dtype=torch.int64, device=DEV)
    rb = torch.empty(bs, dtype=torch.int64, device=DEV)
    pl = torch.empty(bs, dtype=torch.int64, device=DEV)
    tl_ = torch.empty(bs, N + 1, 64, device=DEV)
    mask_buf = torch.zeros(custom_mask_size(bs * 200, bs, N + 1), dtype=torch.bool, device=DEV)
    pos_buf = torch.zeros(bs * (N + 1), dtype=torch.int64, device=DEV)

    def fill(seed):
        g = torch.Generator(device=DEV).manual_seed(seed)
        if seed % 2:
            x.copy_(torch.randn(bs, L, V, generator=g, device=DEV) * 3)
        else:  # deep trees: the pruned beam works through many depths
            x.copy_(draft_logits(seed, bs, L, V, kind="peaked"))
        roots.copy_(torch.randint(0, V, (bs,), generator=g, device=DEV))
        rb.copy_(torch.randint(1, N + 1, (bs,), generator=g, device=DEV))
        pl.copy_(torch.randint(0, 200, (bs,), generator=g, device=DEV))
        tl_.copy_(torch.randn(bs, N + 1, 64, generator=g, device=DEV))

    fill(0)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):  # warm-up: Triton compiles, candidate tables cached
            pipeline(x, roots, rb, pl, mask_buf, pos_buf, tl_, N, N, use_triton)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = pipeline(x, roots, rb, pl, mask_buf, pos_buf, tl_, N, N, use_triton)
    for seed in (1, 2, 3):
        fill(seed)
        graph.replay()
        torch.cuda.synchronize()
        got = [o.clone() for o in outs]
        got_mask, got_pos = mask_buf.clone(), pos_buf.clone()
        mask_buf.zero_()
        eager = pipeline(x, roots, rb, pl, mask_buf, pos_buf, tl_, N, N, use_triton)
        for a, b in zip(got, eager):
            assert torch.equal(a, b)
        assert torch.equal(got_mask, mask_buf) and torch.equal(got_pos, pos_buf)


@pytest.mark.parametrize("prep", ["chunked", "radix"])
@pytest.mark.parametrize("bs,N", [(1, 512), (64, 256), (3, 1024)])
def test_select_chunked_graph_replay_equals_eager(bs, N, prep):
    """build_ddtree(prep=chunked|radix, beam=select|sort) in one CUDA graph: replays equal eager,
    and select equals sort (same prep, so the same lse) on fresh inputs (bf16, V = 151,936)."""
    L, V = 15, 151_936
    x = torch.empty(bs, L, V, dtype=torch.bfloat16, device=DEV)
    roots = torch.zeros(bs, dtype=torch.int64, device=DEV)
    rb = torch.empty(bs, dtype=torch.int64, device=DEV)

    def run():
        out = []
        for beam in ("select", "sort", "prune"):
            t = build_ddtree(x, roots, N, N, request_budget=rb, use_triton=True, prep=prep, beam=beam)
            out += [getattr(t, f) for f in FIELDS + ("retrieve_next_token", "tree_mask", "num_nodes")]
        return out

    def fill(seed):
        g = torch.Generator(device=DEV).manual_seed(seed)
        x.copy_(torch.randn(bs, L, V, generator=g, device=DEV) * 3)
        rb.copy_(torch.randint(1, N + 1, (bs,), generator=g, device=DEV))

    fill(0)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            run()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = run()
    for seed in (1, 2):
        fill(seed)
        graph.replay()
        torch.cuda.synchronize()
        got = [o.clone() for o in outs]
        for a, b in zip(got, run()):
            assert torch.equal(a, b)
        old = build_ddtree(x, roots, N, N, request_budget=rb, use_triton=True, prep=prep,
                           beam="sort")
        for a, f in zip(got, 3 * (FIELDS + ("retrieve_next_token", "tree_mask", "num_nodes"))):
            assert torch.equal(a, getattr(old, f)), f


@pytest.mark.parametrize("kind", ["normal", "peaked", "ties"])
def test_bound_prep_equals_radix_at_scale(kind):
    """prep="bound" (sub-block maxima bound, candidates only; overflowing rows redone by the one-launch
    radix fallback) == prep="radix" bit for bit at bs 64 x L 15 rows of V = 151,936 (ties overflow
    the candidate cap and take the fallback), and the trees built from both are identical."""
    from patchsets.ddtree.kernels import ddtree_prep as KP

    x = logits(11, 64, 15, 151_936, torch.bfloat16, kind).to(DEV).reshape(960, 151_936)
    for k in (16, 256, 1024):
        a, b = KP.topk_bound_triton(x, k), KP.topk_radix_triton(x, k)
        for u, v, name in zip(a, b, ("lp", "ids", "lse")):
            assert torch.equal(u, v), (kind, k, name)
    x3 = x.view(64, 15, 151_936)[:8]
    roots = torch.arange(8, device=DEV)
    t1 = build_ddtree(x3, roots, 512, 512, use_triton=True, prep="bound", beam="prune")
    t2 = build_ddtree(x3, roots, 512, 512, use_triton=True, prep="radix", beam="sort")
    for f in FIELDS + ("retrieve_next_token", "retrieve_next_sibling", "tree_mask", "num_nodes"):
        assert torch.equal(getattr(t1, f), getattr(t2, f)), (kind, f)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=["bf16", "fp16", "fp32"])
@pytest.mark.parametrize("kind", ["normal", "peaked", "ties"])
def test_small_prep_equals_bound_and_torch_at_scale(dtype, kind):
    """prep="small" (K <= 32: each logit read once, one program per row gathers the K best
    sub-blocks) at V = 151,936, K = 1..32, 60 rows with -inf entries (a row all -inf, a row with 5
    finite logits, a row with every other logit -inf): the torch twin's ids exactly and its lp /
    lse within float32 rounding (lp but on the all -inf row); for bf16 / fp16 the bound prep's lp,
    ids and lse bit for bit."""
    from patchsets.ddtree.kernels import ddtree_prep as KP

    V = 151_936
    x = logits(17, 4, 15, V, dtype, kind).to(DEV).reshape(60, V)
    x[0] = float("-inf")
    x[1, : V - 5] = float("-inf")
    x[2, ::2] = float("-inf")
    x3 = x.view(4, 15, V)
    for k in range(1, 33):
        lp, ids, lse = KP.topk_small_triton(x, k)
        tlp, tids, tlse = draft_topk(x3, k, use_triton=False)
        assert torch.equal(ids, tids.reshape(60, k)), (kind, k)
        torch.testing.assert_close(lse, tlse.reshape(60), rtol=0, atol=2e-5, equal_nan=True)
        # row 0 (all -inf, lse -inf): lp = min(NaN, 0) is 0 in Triton (as in the bound prep), NaN in torch
        torch.testing.assert_close(lp[1:], tlp.reshape(60, k)[1:], rtol=0, atol=5e-5, equal_nan=True)
        if dtype != torch.float32:
            for u, v, name in zip((lp, ids, lse), KP.topk_bound_triton(x, k), ("lp", "ids", "lse")):
                assert torch.equal(u.isnan(), v.isnan()) and torch.equal(u.nan_to_num(), v.nan_to_num()), (kind, k, name)


@pytest.mark.parametrize("kind", ["normal", "peaked", "ties"])
def test_default_prep_trees_at_small_budgets(kind):
    """At N <= 32 the default prep is "small": bs 4 x L 15 bf16 trees (N 16 and 32) equal those
    built with prep="bound", every array."""
    x = logits(19, 4, 15, 151_936, torch.bfloat16, kind).to(DEV)
    roots = torch.arange(4, device=DEV)
    for N in (16, 32):
        t1 = build_ddtree(x, roots, N, N, use_triton=True)
        t2 = build_ddtree(x, roots, N, N, use_triton=True, prep="bound", beam="prune")
        for f in FIELDS + ("retrieve_next_token", "retrieve_next_sibling", "tree_mask", "num_nodes"):
            assert torch.equal(getattr(t1, f), getattr(t2, f)), (kind, N, f)
