"""The batched greedy/sampling walks equal the reference walks; accepted-path indices."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from patchsets.ddtree.modules.ddtree_accept import (
    accepted_flat_indices,
    greedy_accept,
    sample_accept,
)
from patchsets.ddtree.modules.ddtree_reference import greedy_walk_reference, sample_walk_reference
from patchsets.ddtree.modules.ddtree_tree import build_ddtree


def random_tree(seed, bs, L, V, N, K, rb=None):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(bs, L, V, generator=g) * 3
    return build_ddtree(x, torch.randint(0, V, (bs,), generator=g), N, K, request_budget=rb,
                        use_triton=False), g


def targets_that_follow(tree, g, p_follow):
    """Per node: with prob p_follow the token of its first child (or some child), else random."""
    bs, N1 = tree.tokens.shape
    V = int(tree.tokens.max()) + 2
    child = tree.retrieve_next_token.clamp(min=0)
    follow = torch.gather(tree.tokens, 1, child)
    # sometimes pick the second child to exercise sibling search
    sib = torch.gather(tree.retrieve_next_sibling, 1, child)
    follow2 = torch.where(sib >= 0, torch.gather(tree.tokens, 1, sib.clamp(min=0)), follow)
    pick2 = torch.rand(bs, N1, generator=g) < 0.3
    follow = torch.where(pick2, follow2, follow)
    rnd = torch.randint(0, V, (bs, N1), generator=g)
    return torch.where(torch.rand(bs, N1, generator=g) < p_follow, follow, rnd)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), L=st.integers(1, 15), N=st.integers(1, 80),
       p=st.floats(0.0, 1.0))
def test_greedy_walk_equals_reference(seed, L, N, p):
    bs = 3
    tree, g = random_tree(seed, bs, L, 6, N, max(1, N // 3), rb=torch.tensor([N, N // 2, 1]))
    tgt = targets_that_follow(tree, g, p)
    acc = greedy_accept(tree, tgt, use_triton=False)
    assert acc.accept_index.shape == (bs, L + 1)
    for b in range(bs):
        path, bonus = greedy_walk_reference(tree.tokens[b], tree.parents[b], tgt[b], tree.valid[b])
        n = len(path) - 1
        assert int(acc.accept_length[b]) == n
        assert acc.accept_index[b, : n + 1].tolist() == path
        assert (acc.accept_index[b, n + 1 :] == -1).all()
        assert int(acc.bonus_token[b]) == bonus


def test_accepted_flat_indices_and_contiguity():
    tree, g = random_tree(5, 2, 4, 5, 10, 3)
    tgt = targets_that_follow(tree, g, 1.0)
    acc = greedy_accept(tree, tgt, use_triton=False)
    idx = accepted_flat_indices(tree, acc)
    N1 = 11
    for b in range(2):
        n = int(acc.accept_length[b])
        assert idx.flat_index[b, : n + 1].tolist() == [b * N1 + int(i) for i in acc.accept_index[b, : n + 1]]
        assert idx.dest_flat[b, : n + 1].tolist() == [b * N1 + i for i in range(n + 1)]
        assert bool(idx.contiguous[b]) == (acc.accept_index[b, : n + 1].tolist() == list(range(n + 1)))
        assert int(idx.count[b]) == n + 1
    # a root-only acceptance is always contiguous
    none = greedy_accept(tree, torch.full_like(tgt, 10**6), use_triton=False)
    assert accepted_flat_indices(tree, none).contiguous.all()


def test_sampling_walk_matches_reference_in_law():
    """Same tree and target probs: the batched sampler and the node-by-node reference walk give
    the same distribution of accept lengths (they use different random streams)."""
    tree, g = random_tree(9, 1, 3, 4, 8, 4)
    N1 = 9
    V = 4
    probs = torch.softmax(torch.randn(1, N1, V, generator=g) * 2, -1)
    R = 4000
    big = tree.__class__(**{**tree.__dict__})
    for f in ("tokens", "parents", "depths", "valid", "scores", "retrieve_index",
              "retrieve_next_token", "retrieve_next_sibling", "tree_mask", "num_nodes"):
        t = getattr(tree, f)
        setattr(big, f, t.expand(R, *t.shape[1:]).contiguous())
    acc = sample_accept(big, probs.expand(R, N1, V), generator=torch.Generator().manual_seed(1),
                        use_triton=False)
    got = torch.bincount(acc.accept_length, minlength=4).double() / R
    gr = torch.Generator().manual_seed(2)
    ref = torch.zeros(4, dtype=torch.float64)
    for _ in range(R):
        path, _ = sample_walk_reference(tree.tokens[0], tree.parents[0], probs[0], gr, tree.valid[0])
        ref[len(path) - 1] += 1
    ref /= R
    assert (got - ref).abs().max() < 0.04, (got, ref)


def test_reftree_walk_agrees_with_the_labelled_walk():
    from patchsets.ddtree.modules.ddtree_reference import (
        build_tree_reference,
        greedy_walk_reftree,
        reference_labelled,
    )

    g = torch.Generator().manual_seed(4)
    x = torch.randn(5, 7, generator=g) * 2
    ref = build_tree_reference(x, 12, 4)
    lab = reference_labelled(ref, 3, 12)
    # target choice per RefTree node: its first child's token (walks as deep as the tree goes)
    choice = torch.full((13,), 99, dtype=torch.long)
    for j in range(ref.num_nodes - 1, -1, -1):
        p = int(ref.parents[j])
        choice[p + 1] = ref.tokens[j]
    path, bonus = greedy_walk_reftree(ref, 3, choice)
    assert len(path) >= 2 and bonus == 99
    # the same walk in the builder's labels: nodes are identified by their token prefix
    def prefixes(tokens, parents, offset):
        out = {}
        for j in range(len(tokens)):
            path, c = [], j
            while c >= 0:
                path.append(int(tokens[c]))
                c = int(parents[c]) - offset if int(parents[c]) >= 0 else -1
            out[tuple(reversed(path))] = j
        return out

    ref_pre = prefixes(ref.tokens.tolist(), ref.parents.tolist(), 0)
    lab_pre = prefixes(lab["tokens"][1 : 1 + ref.num_nodes].tolist(),
                       [int(p) - 1 if int(p) > 0 else -1 for p in lab["parents"][1 : 1 + ref.num_nodes]], 0)
    lchoice = torch.full((13,), 99, dtype=torch.long)
    lchoice[0] = choice[0]
    for pre, j in ref_pre.items():
        lchoice[lab_pre[pre] + 1] = choice[j + 1]
    lpath, lbonus = greedy_walk_reference(lab["tokens"], lab["parents"], lchoice, lab["valid"])
    assert [int(lab["tokens"][k]) for k in lpath[1:]] == [int(ref.tokens[j]) for j in path]
    assert lbonus == bonus


def test_coin_sampling_is_the_inverse_cdf():
    from patchsets.ddtree.modules.ddtree_accept import sample_target_choices

    g = torch.Generator().manual_seed(3)
    probs = torch.softmax(torch.randn(2, 5, 7, generator=g), -1)
    coins = torch.rand(2, 5, generator=g)
    got = sample_target_choices(probs, coins=coins)
    for b in range(2):
        for j in range(5):
            c = torch.cumsum(probs[b, j].double(), 0)
            want = int((c <= coins[b, j].double() * c[-1]).sum().clamp(max=6))
            assert int(got[b, j]) == want
    # in law: many coins reproduce the distribution
    R = 20000
    p = probs[0, 0]
    toks = sample_target_choices(p.expand(1, R, 7), coins=torch.rand(1, R, generator=g))
    freq = torch.bincount(toks.flatten(), minlength=7).double() / R
    assert (freq - p.double()).abs().max() < 0.02
