"""The Triton kernels equal their torch twins, run in Triton's CPU interpreter.

Skipped where Triton is not installed or TRITON_INTERPRET != 1 (CI's CPU torch has no Triton);
tests/gpu runs them compiled. Run: ``TRITON_INTERPRET=1 pytest tests/unit/test_ddtree_kernels.py``.
"""

from __future__ import annotations

import os

import pytest
import torch

pytest.importorskip("triton")
if os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("needs TRITON_INTERPRET=1 to run Triton kernels on CPU tensors", allow_module_level=True)

from patchsets.ddtree.kernels import ddtree_beam as KB  # noqa: E402
from patchsets.ddtree.kernels import ddtree_prep as KP  # noqa: E402
from patchsets.ddtree.kernels import ddtree_verify_inputs as KV  # noqa: E402
from patchsets.ddtree.kernels import ddtree_walk as KW  # noqa: E402

pytestmark = pytest.mark.slow  # the interpreter is slow (~4 min for this file)
from patchsets.ddtree.modules.ddtree_accept import greedy_accept  # noqa: E402
from tests.support.ddtree import KINDS, assert_prune_beam_matches, assert_tree_arrays_match, draft_logits  # noqa: E402
from patchsets.ddtree.modules.ddtree_tree import (  # noqa: E402
    build_custom_mask,
    build_ddtree,
    build_tree_arrays,
)


@pytest.mark.parametrize("seed", range(4))
def test_triton_kernels_equal_torch(seed):
    g = torch.Generator().manual_seed(seed)
    bs, L, V = 3, 1 + seed * 2, 16
    N = [5, 33, 64, 130][seed]
    x = torch.randn(bs, L, V, generator=g) * 2
    t = build_ddtree(x, torch.arange(bs), N, max(1, N // 4),
                     request_budget=torch.tensor([N, N // 2, 1]), use_triton=False)
    for u, v in zip(build_tree_arrays(t.parents, t.valid, L), KV.tree_arrays_triton(t.parents, t.valid, L)):
        assert torch.equal(u, v)
    pl = torch.tensor([3, 0, 5])
    m1 = build_custom_mask(t, pl, use_triton=False)
    m2 = torch.zeros_like(m1)
    KV.custom_mask_triton(t.tree_mask, pl, m2)
    assert torch.equal(m1, m2)
    follow = torch.gather(t.tokens, 1, t.retrieve_next_token.clamp(min=0))
    tgt = torch.where(torch.rand(bs, N + 1, generator=g) < 0.7, follow, torch.randint(0, V, (bs, N + 1), generator=g))
    a, b = greedy_accept(t, tgt, use_triton=False), greedy_accept(t, tgt, use_triton=True)
    walk = KW.greedy_walk_triton(t.tokens, t.parents, t.valid, t.max_depth, tgt)
    for got in ((b.accept_index, b.accept_length, b.bonus_token), walk):
        assert torch.equal(a.accept_index, got[0])
        assert torch.equal(a.accept_length, got[1])
        assert torch.equal(a.bonus_token, got[2])


# Small sizes on purpose: the interpreter runs tl.sort slowly (the GPU run covers N up to 1024).
@pytest.mark.parametrize("seed,L,V,N,K,kind", [
    (0, 1, 16, 5, 5, "normal"), (1, 4, 12, 20, 6, "ties"), (3, 15, 40, 8, 8, "normal"),
    (4, 3, 3, 40, 40, "ties"), (5, 3, 64, 24, 24, "bf16"), (6, 6, 50, 30, 30, "peaked"),
])
def test_triton_tree_path_equals_reference(seed, L, V, N, K, kind):
    from patchsets.ddtree.modules.ddtree_reference import build_tree_reference, reference_labelled
    from patchsets.ddtree.modules.ddtree_tree import _beam_search, candidate_pairs, draft_topk

    g = torch.Generator().manual_seed(seed)
    bs = 3
    if kind == "ties":
        x = torch.randint(-2, 3, (bs, L, V), generator=g).float()
    elif kind == "bf16":
        x = (torch.randn(bs, L, V, generator=g) * 2).to(torch.bfloat16)
    elif kind == "peaked":
        x = draft_logits(seed, bs, L, V, kind="peaked")
    else:
        x = torch.randn(bs, L, V, generator=g) * 3
    rb = torch.tensor([N, N // 2, 0])
    roots = torch.tensor([7, 8, 9])
    lp_t, ids_t, lse_t = draft_topk(x, K, use_triton=True)
    lp_c, ids_c, lse_c = draft_topk(x, K, use_triton=False)
    assert torch.equal(ids_t, ids_c)
    _, ids_k, lse_k = draft_topk(x, K, use_triton=True, prep="chunked")
    assert torch.equal(ids_k, ids_c)
    lp_r, ids_r, lse_r = draft_topk(x, K, use_triton=True, prep="radix")  # bf16: radix select
    assert torch.equal(ids_r, ids_c)
    assert torch.equal(lse_r, lse_k)
    torch.testing.assert_close(lse_k, lse_c, rtol=0, atol=1e-5)
    torch.testing.assert_close(lse_t, lse_c, rtol=0, atol=1e-5)
    # fused beam == torch beam on the same log-probs
    ci, ck = candidate_pairs(N, lp_t.shape[-1], "cpu")
    ref_beam = _beam_search(lp_t, N)
    got_beam = KB.beam_triton(lp_t, N, ci, ck)
    for a, b in zip(ref_beam, got_beam[:4]):
        assert torch.equal(a, b)
    # selection beam == sort beam (gtop included)
    for a, b in zip(got_beam, KB.beam_select_triton(lp_t, N, ci, ck)):
        assert torch.equal(a, b)
    # pruned beam == sort beam on every surviving entry
    assert_prune_beam_matches(got_beam, KB.beam_prune_triton(lp_t, N, ci, ck))
    tree = build_ddtree(x, roots, N, K, request_budget=rb, use_triton=True)
    assert_tree_arrays_match(tree)  # the links written by the label kernel
    for b in range(bs):
        ref = build_tree_reference(x[b], int(rb[b]), K, lse=lse_t[b])
        want = reference_labelled(ref, int(roots[b]), N)
        for f in ("tokens", "parents", "depths", "valid", "scores"):
            assert torch.equal(getattr(tree, f)[b], want[f]), (b, f, getattr(tree, f)[b], want[f])
        assert int(tree.num_nodes[b]) == ref.num_nodes
    for beam in ("select", "prune", "sort"):
        other = build_ddtree(x, roots, N, K, request_budget=rb, use_triton=True, beam=beam)
        for f in ("tokens", "parents", "depths", "valid", "scores", "num_nodes", "retrieve_next_token",
                  "retrieve_next_sibling", "tree_mask"):
            assert torch.equal(getattr(other, f), getattr(tree, f)), (beam, f)
    torch_tree = build_ddtree(x, roots, N, K, request_budget=rb, use_triton=False)
    for f in ("retrieve_next_token", "retrieve_next_sibling", "tree_mask"):
        # same node set up to lse rounding: compare only when the trees agree on parents
        if torch.equal(torch_tree.parents, tree.parents) and torch.equal(torch_tree.tokens, tree.tokens):
            assert torch.equal(getattr(torch_tree, f), getattr(tree, f)), f


from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


@settings(max_examples=8, deadline=None, suppress_health_check=list(HealthCheck))
@given(seed=st.integers(0, 2**31 - 1), L=st.integers(1, 5), V=st.integers(2, 300),
       N=st.integers(1, 90), kf=st.floats(0.05, 1.0), ties=st.booleans())
def test_select_beam_and_radix_prep_property(seed, L, V, N, kf, ties):
    """Property: the selection beam equals the sorting beam (all outputs, gtop included), the
    pruned beam equals it on every surviving entry, and the radix prep gives the torch tie-rule
    ids (bf16, random and heavily tied logits, K <= N)."""
    from patchsets.ddtree.modules.ddtree_tree import candidate_pairs, draft_topk

    g = torch.Generator().manual_seed(seed)
    K = max(1, int(N * kf))
    x = (torch.randint(-2, 3, (2, L, V), generator=g).float() if ties
         else torch.randn(2, L, V, generator=g) * 3).to(torch.bfloat16)
    lp_r, ids_r, _ = draft_topk(x, K, use_triton=True, prep="radix")
    _, ids_c, _ = draft_topk(x, K, use_triton=False)
    assert torch.equal(ids_r, ids_c)
    ci, ck = candidate_pairs(N, lp_r.shape[-1], "cpu")
    full = KB.beam_triton(lp_r, N, ci, ck)
    for a, b in zip(full, KB.beam_select_triton(lp_r, N, ci, ck)):
        assert torch.equal(a, b)
    assert_prune_beam_matches(full, KB.beam_prune_triton(lp_r, N, ci, ck))


# two of the four (dead, bound) pairs, ~45 s each under the CI's interpreter: (True, chain) and
# (False, tight) are left out; test_pruned_beam_property draws chain and tight bounds at random
@pytest.mark.parametrize(("dead", "bound"), [(False, "chain"), (True, "tight")])
def test_score_bound_prunes_without_changing_the_tree(dead, bound):
    """The chain and tight bounds are live (on peaked logits the depth-2 beams get shorter) and
    exact: the beams stay prefixes of the sorting beam, gtop and the tree are unchanged; also
    with a dead depth (a row of -inf lp: nothing deeper) and -inf tails (fewer than K finite
    tokens)."""
    from patchsets.ddtree.modules.ddtree_tree import build_ddtree_from_topk, candidate_pairs, draft_topk

    N = 64
    x = draft_logits(0, 2, 8, 300, kind="peaked")
    lp, ids, _ = draft_topk(x, N, use_triton=False)
    if dead:
        lp[0, 4] = float("-inf")
        lp[1, 1:, 40:] = float("-inf")
    ci, ck = candidate_pairs(N, N, "cpu")
    off = KB.beam_prune_triton(lp, N, ci, ck, bound="none")
    on = KB.beam_prune_triton(lp, N, ci, ck, bound=bound, tight_programs=16)
    full = KB.beam_triton(lp, N, ci, ck)
    assert_prune_beam_matches(full, off)
    assert_prune_beam_matches(full, on)
    assert torch.equal(off[4], on[4])
    m_off, m_on = off[1].sum(-1), on[1].sum(-1)  # [bs, L] beam lengths
    assert bool((m_on <= m_off).all())
    assert bool((m_on[:, 1] < m_off[:, 1]).all()), (m_off.tolist(), m_on.tolist())
    if dead:
        assert int(m_on[0, 4:].sum()) == 0
    want = build_ddtree_from_topk(lp, ids, torch.tensor([1, 2]), N, use_triton=True, beam="sort")
    got = build_ddtree_from_topk(lp, ids, torch.tensor([1, 2]), N, use_triton=True, beam="prune")
    for f in ("tokens", "parents", "depths", "valid", "scores", "num_nodes", "tree_mask"):
        assert torch.equal(getattr(got, f), getattr(want, f)), f


def _prefixes_scoring_at_least(lp: torch.Tensor, t: float) -> int:
    """How many prefixes of one request's lp [L, K] score >= t (float32 sums in depth order)."""
    front, total = torch.zeros(1), 0
    for d in range(lp.shape[0]):
        child = (front[:, None] + lp[d][None, :]).flatten()
        front = child[child >= t]
        total += front.numel()
    return total


@pytest.mark.parametrize("kind", ["peaked", "ties"])
def test_tight_bound_thresholds_are_proven(kind):
    """Every threshold ``tight_bound_triton`` reports has at least N prefixes scoring >= it (so
    it bounds the tree's N-th score), every one it rejects (j > 0) has fewer, and the best one
    is no looser than the chain bound's t_0."""
    from patchsets.ddtree.modules.ddtree_reference import build_tree_reference_from_topk
    from patchsets.ddtree.modules.ddtree_tree import draft_topk

    N = 48
    x = draft_logits(3, 2, 6, 120, kind=kind)
    lp, ids, _ = draft_topk(x, N, use_triton=False)
    tval = KB.tight_bound_triton(lp, N, programs=8)
    assert tval.shape == (2, 8)
    for b in range(2):
        tree = build_tree_reference_from_topk(lp[b], ids[b], N)
        nth = float(tree.scores.min())  # the tree's N-th score
        assert torch.isfinite(tval[b, 0])
        for j in range(8):
            t = float(tval[b, j])
            if t > float("-inf"):
                assert _prefixes_scoring_at_least(lp[b], t) >= N and t <= nth
        assert float(tval[b].max()) >= float(tval[b, 0])


@settings(max_examples=6, deadline=None, suppress_health_check=list(HealthCheck))
@given(seed=st.integers(0, 2**31 - 1), L=st.integers(1, 8), V=st.integers(2, 200),
       N=st.integers(1, 64), kf=st.floats(0.05, 1.0), kind=st.sampled_from(KINDS),
       tiers=st.sampled_from([(64, 256), (1, 2), (2, 8), (4, 16), (16, 4)]),
       wide=st.sampled_from([None, (2, 4), (1, 1), (1, 2), (2, 2)]), gen=st.booleans(),
       gen_wide=st.sampled_from([1, 2, 4]), bound=st.sampled_from(["none", "chain", "tight"]))
def test_pruned_beam_property(seed, L, V, N, kf, kind, tiers, wide, gen, gen_wide, bound):
    """Property: the pruned beam (the heap's early stop) equals the sorting beam on every
    surviving entry and builds the identical tree — flat, peaked (deep trees) and tied logits,
    per-request budgets, K <= N; small sort tiers put a depth's survivors through every tier
    of the merge (the smallest holding them, or NP lanes), and the wide factors send depths with
    more than NP survivors through the wide tiers or, with (1, 1), the selection; gen=True
    generates a depth's survivors per parent, False scans the candidate table (every branch is
    reached at N <= 64: in 50 random cases 132 generated merges, 164 scanned ones, 47
    selections); gen_wide 2 / 4 tightens tau when more than N are generated and selects among
    up to 2 / 4 NP generated lanes (in 30 random cases: 194 generated key sets, 25 of them
    selected, 92 head bounds, 23 scanned merges after tightening); bound "chain" / "tight" starts
    tau at a score bound, which may shorten a depth's beam but never changes gtop or the tree."""
    from patchsets.ddtree.modules.ddtree_tree import build_ddtree_from_topk, candidate_pairs, draft_topk

    K = max(1, int(N * kf))
    x = draft_logits(seed, 3, L, V, kind=kind)
    lp, ids, _ = draft_topk(x, K, use_triton=False)
    ci, ck = candidate_pairs(N, lp.shape[-1], "cpu")
    full = KB.beam_triton(lp, N, ci, ck)
    assert_prune_beam_matches(full, KB.beam_prune_triton(lp, N, ci, ck, tiers=tiers, wide=wide, gen=gen,
                                                         gen_wide=gen_wide, bound=bound, tight_programs=8))
    if (tiers, wide, gen, gen_wide, bound) != ((64, 256), None, True, 2, "chain"):
        assert_prune_beam_matches(full, KB.beam_prune_triton(lp, N, ci, ck))
    rb = torch.tensor([N, max(0, N // 2), 1])
    roots = torch.tensor([4, 5, 6])
    want = build_ddtree_from_topk(lp, ids, roots, N, rb, use_triton=True, beam="sort")
    got = build_ddtree_from_topk(lp, ids, roots, N, rb, use_triton=True, beam="prune")
    for f in ("tokens", "parents", "depths", "valid", "scores", "num_nodes", "tree_mask"):
        assert torch.equal(getattr(got, f), getattr(want, f)), f
    assert_tree_arrays_match(got)


# Radix prep over (row, program) grids: small chunks so that a few hundred columns make many
# chunks and several per program (NCH 19 is prime: P 2, 3, 5 leave a shorter last program).
@pytest.mark.parametrize("seed,R,V,chunk,kind", [
    (0, 2, 300, 16, "normal"),  # NCH 19
    (1, 2, 257, 16, "ties"),  # NCH 17, the last chunk holds one column
    (2, 2, 300, 16, "ties"),  # NCH 19; each value ~60 times per row: the K-th value's run
                              # spans programs and chunks
    (3, 2, 200, 64, "ties"),  # NCH 4
    (4, 2, 150, 16, "inf"),  # 30% -inf; k = V selects them too
])
def test_radix_prep_programs_per_row(seed, R, V, chunk, kind):
    """topk_radix_triton for P = 1, 2, 3, 5 and the default (NCH): ids in the tie-rule order
    (value desc, id asc; torch's stable descending sort), lp == min(x - lse, 0), and lse
    bit-identical across P and k (the same per-chunk partials) and close to torch.logsumexp."""
    g = torch.Generator().manual_seed(seed)
    if kind == "ties":
        x = torch.randint(-2, 3, (R, V), generator=g).float()
    else:
        x = torch.randn(R, V, generator=g) * 3
        if kind == "inf":
            x[torch.rand(R, V, generator=g) < 0.3] = float("-inf")
    x = x.to(torch.bfloat16)
    xf = x.float()
    order = torch.sort(xf, dim=-1, descending=True, stable=True).indices
    lse0 = None
    for k in (1, V // 3, V):
        for P in (None, 1, 2, 3, 5):
            lp, ids, lse = KP.topk_radix_triton(x, k, chunk=chunk, programs_per_row=P)
            assert torch.equal(ids, order[:, :k]), (k, P)
            assert torch.equal(lp, torch.clamp(xf.gather(1, ids) - lse[:, None], max=0.0)), (k, P)
            lse0 = lse if lse0 is None else lse0
            assert torch.equal(lse, lse0), (k, P)
    torch.testing.assert_close(lse0, torch.logsumexp(xf, dim=-1), rtol=0, atol=1e-5)


@pytest.mark.parametrize("case", ["nan_depth", "positive_front", "neg_zero", "nan_logits_row"])
def test_nan_and_out_of_contract_lp_build_the_same_valid_tree_everywhere(case):
    """A NaN lp row (a drafter row of NaN or all -inf logits) drafts nothing and lp > 0 counts as
    0 (``clean_lp``): every Triton beam, the torch path and the CPU heap build the same tree,
    every parent an earlier valid node. Before, NaN ranked first, children came before their
    parents and the label kernel read unwritten scratch (found in review). -0.0 sums keep their
    sign bit in every beam."""
    from patchsets.ddtree.modules.ddtree_reference import build_tree_reference_from_topk, reference_labelled
    from patchsets.ddtree.modules.ddtree_tree import build_ddtree_from_topk, candidate_pairs, draft_topk

    g = torch.Generator().manual_seed(7)
    bs, L, N, K = 2, 4, 20, 10
    if case == "nan_logits_row":
        x = torch.randn(bs, L, 64, generator=g) * 3
        x[0, 2] = float("nan")
        x[1, 1] = float("-inf")
        lp, ids, _ = draft_topk(x, K, use_triton=False)
        assert torch.isnan(lp[0, 2]).all() and torch.isnan(lp[1, 1]).all()
    else:
        lp = -(torch.rand(bs, L, K, generator=g) * 5).sort(dim=-1).values  # non-increasing, <= 0
        ids = torch.arange(K).expand(bs, L, K).contiguous() + 100
        if case == "nan_depth":
            lp[0, 2] = float("nan")
            lp[1, 1, 3:] = float("nan")
        elif case == "positive_front":
            lp[:, 1, :2] = torch.tensor([2.0, 0.5])
        else:
            lp = torch.full((bs, L, K), -0.0)
    roots = torch.tensor([5, 6])
    ci, ck = candidate_pairs(N, K, "cpu")
    full = KB.beam_triton(lp, N, ci, ck)
    for a, b in zip(full, KB.beam_select_triton(lp, N, ci, ck)):
        assert torch.equal(a, b)
    assert_prune_beam_matches(full, KB.beam_prune_triton(lp, N, ci, ck, tiers=(2, 4)))
    want = build_ddtree_from_topk(lp, ids, roots, N, use_triton=False)
    for beam in ("sort", "select", "prune"):
        got = build_ddtree_from_topk(lp, ids, roots, N, use_triton=True, beam=beam)
        for f in ("tokens", "parents", "depths", "valid", "scores", "num_nodes", "tree_mask"):
            assert torch.equal(getattr(got, f), getattr(want, f)), (beam, f)
    for b in range(bs):
        ref = reference_labelled(build_tree_reference_from_topk(lp[b], ids[b], N), int(roots[b]), N)
        for f in ("tokens", "parents", "depths", "valid"):
            assert torch.equal(getattr(want, f)[b], ref[f]), (b, f)
        n = int(want.num_nodes[b])
        par = want.parents[b, 1 : n + 1]
        assert bool(((par >= 0) & (par < torch.arange(1, n + 1))).all())


def test_pruned_beam_tiers_wide_and_warps_must_be_powers_of_two():
    lp = torch.zeros(1, 2, 4)
    ci, ck = torch.zeros(4, dtype=torch.int64), torch.arange(4)
    for bad in ((3, 8), (0, 4), (4, -2)):
        with pytest.raises(ValueError, match="tiers must be two powers of 2"):
            KB.beam_prune_triton(lp, 4, ci, ck, tiers=bad)
        with pytest.raises(ValueError, match="wide must be two powers of 2"):
            KB.beam_prune_triton(lp, 4, ci, ck, wide=bad)
    for bad in (0, 3, -2):
        with pytest.raises(ValueError, match="gen_wide must be a power of 2"):
            KB.beam_prune_triton(lp, 4, ci, ck, gen_wide=bad)
    for bad in (0, 3, 64):
        with pytest.raises(ValueError, match="num_warps must be a power of 2"):
            KB.beam_prune_triton(lp, 4, ci, ck, num_warps=bad)


def test_radix_programs_and_errors():
    """(P, T) from programs_per_row (clamped to [1, NCH], no empty program); bad arguments raise."""
    assert KP._rk_programs(38) == (38, 1)
    assert KP._rk_programs(38, 3) == (3, 13)
    assert KP._rk_programs(19, 4) == (4, 5)
    assert KP._rk_programs(19, 6) == (5, 4)  # T = 4 fills 19 chunks with 5 programs
    assert KP._rk_programs(19, 100) == (19, 1)
    x = torch.zeros(2, 40, dtype=torch.bfloat16)
    for kw in (dict(k=0), dict(k=41), dict(k=3, programs_per_row=0), dict(k=3, chunk=24),
               dict(k=3, chunk=32768), dict(k=3, chunk=8)):
        with pytest.raises(ValueError):
            KP.topk_radix_triton(x, **kw)
    with pytest.raises(ValueError):
        KP.topk_radix_triton(x.float(), 3)


@settings(max_examples=10, deadline=None, suppress_health_check=list(HealthCheck))
@given(seed=st.integers(0, 2**31 - 1), rows=st.integers(1, 4), V=st.integers(1, 400),
       kf=st.floats(0.0, 1.0), kind=st.sampled_from(KINDS), sub=st.sampled_from([1, 8, 64]),
       cap_extra=st.sampled_from([None, 0, 3]), dtype=st.sampled_from([torch.bfloat16, torch.float16]))
def test_bound_prep_property(seed, rows, V, kf, kind, sub, cap_extra, dtype):
    """Property: the bound prep (sub-block maxima bound the K-th value, only candidates sorted,
    overflowing rows redone by the one-launch radix fallback) gives the tie-rule ids and exactly the
    radix prep's lp and lse — flat, peaked and tied bf16 and fp16 logits, -inf entries, small caps
    that force the fallback on some rows; lse as torch.logsumexp's within float32 rounding."""
    k = max(1, min(V, int(round(V * kf))))
    x = draft_logits(seed, 1, rows, V, dtype, kind=kind)[0]
    if seed % 3 == 0:
        x[:, : V // 4] = float("-inf")
    if seed % 5 == 1:  # NaN logits: ord16 ranks +NaN above +inf in both preps
        x.view(-1)[torch.randint(0, x.numel(), (3,), generator=torch.Generator().manual_seed(seed))] = float("nan")
    cap = None if cap_extra is None else k + cap_extra
    lp, ids, lse = KP.topk_bound_triton(x, k, chunk=64, sub_block=sub, cap=cap)
    lp2, ids2, lse2 = KP.topk_radix_triton(x, k, chunk=64)
    if not x.isnan().any():  # torch.sort puts NaN last; the preps rank +NaN first (ord16)
        want = torch.sort(-x.float(), dim=-1, stable=True).indices[:, :k]
        assert torch.equal(ids, want) and torch.equal(ids2, want)
    assert torch.equal(ids, ids2)
    for u, v in ((lp, lp2), (lse, lse2)):
        assert torch.equal(u.isnan(), v.isnan()) and torch.equal(u.nan_to_num(), v.nan_to_num())
    if not x.isnan().any():
        torch.testing.assert_close(lse, torch.logsumexp(x.float(), dim=-1), rtol=0, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_bound_prep_nan_in_a_chunk_whose_float_max_skips_it(dtype):
    """Regression (review): pass B gated chunks on the float chunk max, which skips NaN, so a NaN
    in the top k was missed (wrong ids, or an out-of-bounds read when fewer than k candidates
    were left). Now the gate is the ord16 maximum and a short row goes to the radix fallback."""
    x = (-torch.arange(128.0) / 8).to(dtype)[None].clone()
    x[0, 1] = 0.0
    x[0, 70] = float("nan")
    for k in (1, 2, 5):
        for u, v in zip(KP.topk_bound_triton(x, k, chunk=64, sub_block=64), KP.topk_radix_triton(x, k, chunk=64)):
            assert torch.equal(u.isnan(), v.isnan()) and torch.equal(u.nan_to_num(), v.nan_to_num())
        assert int(KP.topk_bound_triton(x, k, chunk=64, sub_block=64)[1][0, 0]) == 70


def test_bound_prep_errors():
    x = torch.zeros(2, 100, dtype=torch.bfloat16)
    for kw, msg in ((dict(k=0), "1 <= k"), (dict(k=5, chunk=100), "chunk"),
                    (dict(k=5, sub_block=3), "sub_block"), (dict(k=5, cap=4), "cap")):
        with pytest.raises(ValueError, match=msg):
            KP.topk_bound_triton(x, **kw)
    with pytest.raises(ValueError, match="bf16"):
        KP.topk_bound_triton(x.float(), 5)


@pytest.mark.parametrize("seed,rows,V,k,sub,cap,dtype,kind", [
    (1, 3, 300, 32, 16, 256, torch.bfloat16, "ties"),  # heavy ties: the sort-everything branch
    (2, 2, 777, 8, 64, 256, torch.float16, "normal"),
    (3, 3, 400, 5, 8, 5, torch.float32, "peaked"),  # cap = k: candidates overflow often
    (4, 2, 7, 7, 1, 7, torch.float32, "ties"),  # k = V: every element
    (5, 3, 150, 31, 64, 256, torch.bfloat16, "normal"),  # fewer than k sub-blocks: all gathered
    (6, 2, 1, 1, 64, 256, torch.float16, "normal"),
])
def test_small_prep_equals_the_tie_rule_and_the_bound_prep(seed, rows, V, k, sub, cap, dtype, kind):
    """The small-K prep (each logit read once; one program per row gathers the k best sub-blocks
    and sorts their candidates) gives the tie-rule ids (value desc, id asc) on flat, peaked and
    tied logits of every dtype with -inf entries (and a row all -inf), lse within float32
    rounding of torch.logsumexp, and for 16-bit logits the bound prep's lp, ids and lse bit for
    bit."""
    x = draft_logits(seed, 1, rows, V, dtype, kind=kind)[0]
    x[0, : V // 2] = float("-inf")
    if rows > 2:
        x[2] = float("-inf")
    lp, ids, lse = KP.topk_small_triton(x, k, chunk=64, sub_block=sub, cap=cap)
    assert torch.equal(ids, torch.sort(-x.float(), dim=-1, stable=True).indices[:, :k])
    torch.testing.assert_close(lse, torch.logsumexp(x.float(), dim=-1), rtol=0, atol=1e-5)
    fin = lse > float("-inf")
    torch.testing.assert_close(lp[fin], (x.float().gather(1, ids) - lse[:, None]).clamp(max=0)[fin],
                               rtol=0, atol=0)
    if dtype != torch.float32:
        for u, v in zip((lp, ids, lse), KP.topk_bound_triton(x, k, chunk=64, sub_block=64)):
            assert torch.equal(u.isnan(), v.isnan()) and torch.equal(u.nan_to_num(), v.nan_to_num())


@pytest.mark.parametrize("seed", range(4))
def test_kth_sub_block_max_search_from_the_chunk_maxima(seed):
    """The K-th largest sub-block maximum starts its 5-ary search at the smallest chunk maximum
    when the row has at least K chunks (revision 10; 0 before): on rows of 8 chunks x 8
    sub-blocks with empty sub-blocks (-1), empty padding chunks, narrow and full image ranges,
    heavy duplicates and K from 1 to every image, it is the K-th largest image (sorting)."""
    import triton
    import triton.language as tl

    @triton.jit
    def _probe(v_ptr, nch_ptr, k_ptr, out_ptr, SPC: tl.constexpr, NSBP: tl.constexpr):
        row = tl.program_id(0)
        v = tl.load(v_ptr + row * NSBP + tl.arange(0, NSBP))
        t = KP._kth_sub_block_max(v, tl.load(k_ptr + row), tl.load(nch_ptr + row), 65535, SPC, NSBP, 8)
        tl.store(out_ptr + row, t)

    g = torch.Generator().manual_seed(seed)
    rows, spc, nsbp = 48, 8, 64
    v = torch.full((rows, nsbp), -1, dtype=torch.int32)
    nch = torch.randint(1, nsbp // spc + 1, (rows,), generator=g)
    ks = torch.zeros(rows, dtype=torch.int32)
    want = torch.zeros(rows, dtype=torch.int32)
    for r in range(rows):
        span = [3, 300, 65536][r % 3]
        base = int(torch.randint(0, 65536 - span + 1, (1,), generator=g))
        n = int(nch[r]) * spc
        v[r, :n] = base + torch.randint(0, span, (n,), generator=g, dtype=torch.int32)
        empty = torch.rand(n, generator=g) < 0.3
        empty[torch.arange(n) % spc == 0] = False  # a chunk's first sub-block always holds an element
        v[r, :n][empty] = -1
        real = v[r][v[r] >= 0].sort(descending=True).values
        ks[r] = int(torch.randint(1, real.numel() + 1, (1,), generator=g))
        want[r] = real[ks[r] - 1]
    out = torch.zeros(rows, dtype=torch.int32)
    _probe[(rows,)](v, nch.to(torch.int32), ks, out, SPC=spc, NSBP=nsbp)
    assert torch.equal(out, want), (out, want)


def _order_image(x: torch.Tensor) -> torch.Tensor:
    """The order image of every element (int64): _ord16 / _ord32 written in torch."""
    bits, top = (16, 65535) if x.element_size() == 2 else (32, 4294967295)
    u = x.view(torch.int16 if bits == 16 else torch.int32).to(torch.int64) & top
    u = torch.where(u == (top + 1) // 2, 0, u)                      # -0.0 -> +0.0
    return torch.where(u >= (top + 1) // 2, top - u, u + (top + 1) // 2)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_pass_a_sub_block_maxima_are_the_maxima_of_every_elements_image(dtype):
    """Pass A takes the float maximum of a sub-block and maps only it to its order image: equal
    to the maximum of every element's image (what it computed before), with NaN (above +inf),
    +-inf, -0.0 beside +0.0, a sub-block all -inf, a chunk all NaN and a last chunk partly past
    V (-1 for sub-blocks holding no element); the partials' maximum skips NaN."""
    CH, SB = 64, 16
    g = torch.Generator().manual_seed(3)
    x = (torch.randn(3, 200, generator=g) * 4).to(dtype)
    x[0, 5], x[0, 70], x[0, 71] = float("nan"), float("inf"), -0.0
    x[0, 72] = 0.0
    x[1, 16:32] = float("-inf")
    x[1, 64:128] = float("nan")
    x[2, 130:140] = -0.0
    R, V = x.shape
    NCH = -(-V // CH)
    pm = torch.empty(R, NCH)
    ps = torch.empty_like(pm)
    sbm = torch.empty(R, NCH * CH // SB, dtype=torch.int64 if dtype == torch.float32 else torch.int32)
    KP._bd_pass_a[(R, NCH)](x, pm, ps, sbm, NCH, V=V, CH=CH, SB=SB, W32=dtype == torch.float32)
    pad = torch.full((R, NCH * CH - V), float("-inf"), dtype=dtype)
    img = _order_image(torch.cat([x, pad], 1))
    img[:, V:] = -1
    assert torch.equal(sbm.to(torch.int64), img.reshape(R, -1, SB).amax(-1))
    xf = torch.cat([x, pad], 1).float().reshape(R, NCH, CH)
    skip_nan = torch.where(xf.isnan(), float("-inf"), xf).amax(-1)
    want = torch.where(xf.isnan().all(-1), float("nan"), skip_nan)      # NaN only where all are NaN
    torch.testing.assert_close(pm, want, rtol=0, atol=0, equal_nan=True)


def test_small_prep_errors():
    x = torch.zeros(2, 100, dtype=torch.bfloat16)
    for kw, msg in ((dict(k=0), "1 <= k"), (dict(k=33), "1 <= k"), (dict(k=5, chunk=100), "chunk"),
                    (dict(k=5, sub_block=3), "sub_block"), (dict(k=5, cap=4), "cap")):
        with pytest.raises(ValueError, match=msg):
            KP.topk_small_triton(x, **kw)
    with pytest.raises(ValueError, match="bf16/fp16/fp32"):
        KP.topk_small_triton(x.double(), 5)
