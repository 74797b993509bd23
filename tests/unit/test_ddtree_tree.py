"""The batched DDTree builder equals the paper's best-first heap (node set, parents, labels,
scores), ties included; its retrieve arrays, masks and positions agree with its parents."""

from __future__ import annotations

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from patchsets.ddtree.modules.ddtree_reference import (
    build_tree_reference,
    reference_labelled,
)
from patchsets.ddtree.modules.ddtree_tree import (
    build_custom_mask,
    build_ddtree,
    candidate_pairs,
    custom_mask_size,
    draft_topk,
    tree_positions,
)

QWEN_VOCAB = 151_936
FIELDS = ("tokens", "parents", "depths", "valid", "scores")


def make_logits(seed: int, bs: int, L: int, V: int, kind: str) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if kind == "normal":
        return torch.randn(bs, L, V, generator=g) * 3
    if kind == "ties":  # few distinct values: ties inside and at the top-K boundary
        return torch.randint(-2, 3, (bs, L, V), generator=g).float()
    if kind == "bf16":
        return (torch.randn(bs, L, V, generator=g) * 2).to(torch.bfloat16)
    if kind == "peaked":  # one dominant token per depth, plus ties in the tail
        x = torch.randint(-3, 0, (bs, L, V), generator=g).float()
        x[..., 0] += 8
        return x
    raise AssertionError(kind)


def assert_tree_equals_reference(x: torch.Tensor, roots: torch.Tensor, N: int, K: int, rb=None):
    tree = build_ddtree(x, roots, N, K, request_budget=rb, use_triton=False)
    _, _, lse = draft_topk(x, K)
    for b in range(x.shape[0]):
        n_b = N if rb is None else max(0, min(int(rb[b]), N))
        ref = build_tree_reference(x[b], n_b, K, lse=lse[b])
        want = reference_labelled(ref, int(roots[b]), N)
        for f in FIELDS:
            got = getattr(tree, f)[b]
            assert torch.equal(got, want[f]), f"request {b} field {f}:\n{got}\n!=\n{want[f]}"
        assert int(tree.num_nodes[b]) == ref.num_nodes
    check_arrays_consistent(tree)
    return tree


def check_arrays_consistent(tree):
    """retrieve_*, tree_mask from first principles (Python loops over the parents)."""
    bs, N1 = tree.tokens.shape
    for b in range(bs):
        par = tree.parents[b].tolist()
        val = tree.valid[b].tolist()
        dep = tree.depths[b].tolist()
        kids = {}
        for j in range(1, N1):
            if val[j]:
                assert 0 <= par[j] < j, "parents must come before children"
                assert dep[j] == dep[par[j]] + 1
                kids.setdefault(par[j], []).append(j)
        for p, ks in kids.items():
            assert ks == list(range(ks[0], ks[0] + len(ks))), "siblings must be contiguous"
            toks = [int(tree.tokens[b, k]) for k in ks]
            assert len(set(toks)) == len(toks), "sibling tokens must differ"
        for j in range(N1):
            ks = kids.get(j, [])
            assert int(tree.retrieve_next_token[b, j]) == (ks[0] if ks and val[j] else -1)
            sib = -1
            if j > 0 and val[j]:
                group = kids[par[j]]
                i = group.index(j)
                sib = group[i + 1] if i + 1 < len(group) else -1
            assert int(tree.retrieve_next_sibling[b, j]) == sib
            assert int(tree.retrieve_index[b, j]) == b * N1 + j
            anc = set()
            if val[j]:
                c = j
                while c >= 0:
                    anc.add(c)
                    c = par[c]
            else:
                anc = {j}
            row = set(torch.nonzero(tree.tree_mask[b, j]).flatten().tolist())
            assert row == anc, f"mask row {j} of request {b}: {sorted(row)} != {sorted(anc)}"


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**31 - 1),
    L=st.integers(1, 15),
    V=st.integers(1, 40),
    N=st.integers(1, 96),
    kfrac=st.floats(0.0, 1.0),
    kind=st.sampled_from(["normal", "ties", "bf16", "peaked"]),
)
def test_batched_equals_heap_small(seed, L, V, N, kfrac, kind):
    K = max(1, int(round(kfrac * N)))
    x = make_logits(seed, 2, L, V, kind)
    assert_tree_equals_reference(x, torch.tensor([5, 7]), N, K)


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**31 - 1),
    N=st.sampled_from([128, 512, 1024]),
    kfrac=st.sampled_from([0.05, 0.5, 1.0]),
    kind=st.sampled_from(["normal", "ties", "peaked"]),
)
def test_batched_equals_heap_large_budget(seed, N, kfrac, kind):
    K = max(1, int(kfrac * N))
    x = make_logits(seed, 1, 15, 64, kind)
    assert_tree_equals_reference(x, torch.tensor([3]), N, K)


@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**31 - 1),
    N=st.sampled_from([16, 256]),
    kind=st.sampled_from(["normal", "bf16"]),
)
def test_batched_equals_heap_qwen_vocab(seed, N, kind):
    x = make_logits(seed, 1, 15, QWEN_VOCAB, kind)
    assert_tree_equals_reference(x, torch.tensor([151_000]), N, N)


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    N=st.integers(1, 40),
    budgets=st.lists(st.integers(-2, 50), min_size=3, max_size=3),
    kind=st.sampled_from(["normal", "ties"]),
)
def test_request_budget_padding(seed, N, budgets, kind):
    x = make_logits(seed, 3, 6, 9, kind)
    rb = torch.tensor(budgets)
    tree = assert_tree_equals_reference(x, torch.tensor([1, 2, 3]), N, N, rb)
    for b, n in enumerate(budgets):
        want = max(0, min(n, N))
        assert int(tree.valid[b].sum()) == 1 + min(want, int(tree.num_nodes[b]))


def test_paper_example_shape_and_static_sizes():
    x = make_logits(0, 4, 15, 100, "normal")
    tree = build_ddtree(x, torch.arange(4), 64, 8, use_triton=False)
    assert tree.tokens.shape == (4, 65) and tree.tree_mask.shape == (4, 65, 65)
    assert tree.num_verify_tokens == 65 and tree.max_depth == 15
    for name in ("tokens", "parents", "depths", "retrieve_index", "retrieve_next_token",
                 "retrieve_next_sibling"):
        assert getattr(tree, name).dtype == torch.int64, name
    assert tree.valid.dtype == torch.bool and tree.scores.dtype == torch.float32


def test_candidate_set_is_the_hyperbola():
    ci, ck = candidate_pairs(16, 16, "cpu")
    pairs = set(zip(ci.tolist(), ck.tolist()))
    assert pairs == {(i, k) for i in range(16) for k in range(16) if (i + 1) * (k + 1) <= 16}
    assert ci.numel() == sum(16 // (i + 1) for i in range(16))  # N * H(N)-ish


def test_custom_mask_layout_matches_sglang_full_mask():
    """Row j of request b = prefix_len[b] Trues then tree_mask[b, j] (eagle_utils FULL_MASK)."""
    x = make_logits(3, 3, 4, 12, "normal")
    tree = build_ddtree(x, torch.tensor([1, 2, 3]), 9, 3, use_triton=False)
    pl = torch.tensor([4, 0, 7])
    flat = build_custom_mask(tree, pl, prefix_lens_sum=11, use_triton=False)
    N1 = 10
    assert flat.numel() == custom_mask_size(11, 3, N1) == 11 * N1 + 3 * N1 * N1
    off = 0
    for b in range(3):
        block = flat[off : off + N1 * (int(pl[b]) + N1)].view(N1, int(pl[b]) + N1)
        assert block[:, : int(pl[b])].all()
        assert torch.equal(block[:, int(pl[b]) :], tree.tree_mask[b])
        off += block.numel()
    # preallocated, larger buffer: same prefix written, the rest stays True
    buf = torch.zeros(flat.numel() + 17, dtype=torch.bool)
    build_custom_mask(tree, pl, out=buf, use_triton=False)
    assert torch.equal(buf[: flat.numel()], flat)


def test_positions_are_prefix_plus_depth():
    x = make_logits(4, 2, 5, 7, "normal")
    tree = build_ddtree(x, torch.tensor([1, 2]), 12, 4, use_triton=False)
    pos = tree_positions(tree, torch.tensor([10, 3]))
    assert pos.shape == (2 * 13,)
    assert torch.equal(pos.view(2, 13), torch.tensor([[10], [3]]) + tree.depths)
    assert int(pos[0]) == 10 and int(pos[13]) == 3


def test_bad_shapes_raise_clear_errors():
    import pytest

    with pytest.raises(ValueError, match=r"\[bs, L, V\]"):
        build_ddtree(torch.zeros(3, 4), torch.zeros(3, dtype=torch.long), 4, 2)
    with pytest.raises(ValueError, match="root_tokens"):
        build_ddtree(torch.zeros(2, 3, 4), torch.zeros(3, dtype=torch.long), 4, 2)
    with pytest.raises(ValueError, match="budget"):
        build_ddtree(torch.zeros(2, 3, 4), torch.zeros(2, dtype=torch.long), 0, 2)


def test_build_from_topk_equals_build_from_logits():
    """The TP entry point: the same tree from (lp, ids) as from the dense logits."""
    from patchsets.ddtree.modules.ddtree_tree import build_ddtree_from_topk

    x = make_logits(8, 3, 6, 30, "ties")
    roots = torch.tensor([1, 2, 3])
    rb = torch.tensor([20, 4, 0])
    lp, ids, _ = draft_topk(x, 7)
    a = build_ddtree(x, roots, 20, 7, request_budget=rb, use_triton=False)
    b = build_ddtree_from_topk(lp, ids, roots, 20, request_budget=rb, use_triton=False)
    for f in FIELDS + ("retrieve_next_token", "retrieve_next_sibling", "tree_mask", "num_nodes"):
        assert torch.equal(getattr(a, f), getattr(b, f)), f


def test_variant_choice_follows_the_h200_measurements():
    """prefer_prep / prefer_beam return the variants bench/RESULTS.md measured fastest: bound prep
    for bf16 and fp16 at every row count and K (radix lost at K 1024 too once the bound prep's
    final sort ran 16 warps; fp16 ran 2-3.7x slower on bf16's old fallback), chunked / row for
    32-bit logits by row count, the small-K prep for K <= 32 at every dtype (2026-12-03: 1.15-2.3x
    the bound prep, 4.6-10.7x the old fp32 default chunked / row), and the pruned beam at every
    budget."""
    from patchsets.ddtree.modules.ddtree_tree import prefer_beam, prefer_prep

    assert prefer_prep(15, torch.bfloat16, 512) == "bound"
    assert prefer_prep(15, torch.bfloat16) == "bound"
    assert prefer_prep(15, torch.bfloat16, 1024) == "bound"
    assert prefer_prep(120, torch.bfloat16, 1024) == "bound"
    assert prefer_prep(960, torch.bfloat16, 256) == "bound"
    assert prefer_prep(15, torch.float32, 1024) == "chunked"
    assert prefer_prep(960, torch.float16, 256) == "bound"
    assert prefer_prep(15, torch.float16, 1024) == "bound"
    assert prefer_prep(960, torch.float32, 256) == "row"
    for rows, dtype in ((15, torch.bfloat16), (960, torch.float16), (120, torch.float32)):
        assert prefer_prep(rows, dtype, 32) == "small" and prefer_prep(rows, dtype, 1) == "small"
        assert prefer_prep(rows, dtype, 33) != "small"
        # CPU tensors (Triton's interpreter, in tests): the large-K choice, ~50x faster there
        assert prefer_prep(rows, dtype, 8, cuda=False) == prefer_prep(rows, dtype, 33)
    assert {prefer_beam(n) for n in (1, 16, 64, 512, 1024)} == {"prune"}
