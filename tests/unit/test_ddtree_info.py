"""CPU tests of the DDTree verify step's tensor logic (``ddtree_info``) against the DDTree core.

What is real here: the core's builder, reference heap and walks; our helpers; a simulated KV pool
(a plain tensor) and a simulated target (a deterministic function of the context) standing in
for the GPU SGLang server that cannot exist on this machine. Tensor-parallel ranks are simulated
with threads that exchange tensors through an all_gather built on a barrier.
"""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from patchsets.ddtree.modules import ddtree_info as D
from patchsets.ddtree.modules import ddtree_tree
from patchsets.ddtree.modules.ddtree_accept import accepted_flat_indices, greedy_accept
from patchsets.ddtree.modules.ddtree_reference import (
    build_tree_reference,
    greedy_walk_reference,
    reference_labelled,
    ref_logprobs,
)
from patchsets.ddtree.modules.ddtree_tree import (
    build_custom_mask,
    build_ddtree,
    custom_mask_size,
    draft_topk,
    tree_positions,
)

SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def logits(seed: int, T: int, V: int, kind: str) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if kind == "normal":
        return torch.randn(T, V, generator=g) * 3
    if kind == "ties":  # few distinct values: ties inside shards and across shard borders
        return torch.randint(-2, 3, (T, V), generator=g).float()
    if kind == "bf16":
        return (torch.randn(T, V, generator=g) * 2).to(torch.bfloat16)
    raise AssertionError(kind)


def shard_bounds(V: int, R: int, uneven: bool):
    """Contiguous shards like SGLang's vocab-parallel LM head (the last may be shorter)."""
    if not uneven:
        per = -(-V // R)
        cuts = [min(V, r * per) for r in range(R + 1)]
    else:
        cuts = [0] + sorted({max(1, min(V - 1, (V * (2 * r + 1)) // (2 * R + 1))) for r in range(1, R)}) + [V]
        while len(cuts) < R + 1:
            cuts.insert(-1, cuts[-2])
    return [(cuts[r], cuts[r + 1]) for r in range(R)]


def simulate_tp(x: torch.Tensor, R: int, k: int, uneven: bool = False):
    """Run vocab_parallel_topk on R thread-ranks; each rank sees only its shard of ``x``."""
    bounds = shard_bounds(x.shape[1], R, uneven)
    slots = [None] * R
    barrier = threading.Barrier(R)
    results, errors = [None] * R, []

    def make_gather(rank):
        def all_gather(t):
            slots[rank] = t.clone()
            barrier.wait()
            out = torch.stack(list(slots), 0)
            barrier.wait()  # nobody overwrites a slot before everyone has read it
            return out
        return all_gather

    def run(rank):
        try:
            lo, hi = bounds[rank]
            results[rank] = D.vocab_parallel_topk(
                x[:, lo:hi], lo, k, world_size=R, all_gather=make_gather(rank)
            )
        except Exception as exc:  # pragma: no cover - surfaced below
            errors.append(exc)
            barrier.abort()

    threads = [threading.Thread(target=run, args=(r,)) for r in range(R)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results


# ------------------------------------------------------------------------------------ sizes
def test_sizes_take_max_of_block_and_budget_plus_one():
    s = D.DDTreeSizes(block_size=16, budget=256, topk=8)
    assert (s.draft_depth, s.verify_width, s.accept_width) == (15, 257, 16)
    # reserve: the in-flight step's commit (<= L + 1 = B) plus the next window
    assert (s.window_width, s.kv_reserve, s.output_stride) == (257, 16 + 257, 16)
    small = D.DDTreeSizes(block_size=16, budget=7, topk=7)
    assert (small.verify_width, small.window_width, small.kv_reserve) == (8, 16, 32)  # = DFlash
    spec = SimpleNamespace(speculative_num_draft_tokens=16, speculative_ddtree_budget=64,
                           speculative_ddtree_topk=None)
    assert D.DDTreeSizes.from_spec(spec) == D.DDTreeSizes(16, 64, 64)
    with pytest.raises(ValueError, match="block"):
        D.DDTreeSizes(1, 4, 4)
    with pytest.raises(ValueError, match="budget"):
        D.DDTreeSizes(16, 0, 4)


# ------------------------------------------------------------------------- tensor-parallel top-K
@pytest.mark.parametrize("kind", ["normal", "ties", "bf16"])
@pytest.mark.parametrize("R,uneven", [(1, False), (2, False), (3, True), (4, False), (5, True)])
def test_tp_topk_equals_dense_on_every_rank(kind, R, uneven):
    T, V, k = 6, 97, 12
    x = logits(R * 7 + len(kind), T, V, kind)
    per_rank = simulate_tp(x, R, k, uneven)
    lp_d, ids_d, lse_d = draft_topk(x.unsqueeze(0), k)
    for r, c in enumerate(per_rank):
        # every rank holds bit-identical results (same tree on every rank)
        assert torch.equal(c.ids, per_rank[0].ids) and torch.equal(c.values, per_rank[0].values)
        assert torch.equal(c.lse, per_rank[0].lse)
    c = per_rank[0]
    # the global ranking equals the dense single-rank one exactly (ties: smaller id first)
    assert torch.equal(c.ids, ids_d[0]), f"R={R}\n{c.ids}\n{ids_d[0]}"
    assert torch.equal(c.values, torch.gather(x.float(), 1, ids_d[0]))
    # lse differs from the dense one only by summation order
    assert torch.allclose(c.lse, lse_d[0], atol=1e-5, rtol=0)
    # given the same lse, the log-probs are the reference's bit for bit
    lp = D.topk_logprobs(c)
    for t in range(T):
        ref_lp, ref_ids = ref_logprobs(x[t : t + 1], k, lse=c.lse[t : t + 1])
        assert torch.equal(lp[t], torch.from_numpy(ref_lp[0]))
        assert torch.equal(c.ids[t], torch.from_numpy(ref_ids[0]))


def test_tp_topk_shard_narrower_than_k_and_k_above_vocab():
    x = logits(3, 4, 10, "ties")
    per_rank = simulate_tp(x, 4, 6, uneven=True)  # some shards hold < 6 tokens
    _, ids_d, _ = draft_topk(x.unsqueeze(0), 6)
    assert torch.equal(per_rank[0].ids, ids_d[0])
    per_rank = simulate_tp(x, 2, 10)  # K = V: the whole vocabulary, no sentinel survives
    _, ids_d, _ = draft_topk(x.unsqueeze(0), 10)
    assert torch.equal(per_rank[1].ids, ids_d[0])
    assert int(per_rank[1].ids.max()) < 10


@SETTINGS
@given(
    seed=st.integers(0, 10_000),
    R=st.integers(1, 4),
    k=st.integers(1, 20),
    V=st.integers(8, 60),
    kind=st.sampled_from(["normal", "ties", "bf16"]),
)
def test_tp_topk_property(seed, R, k, V, kind):
    x = logits(seed, 3, V, kind)
    per_rank = simulate_tp(x, R, k, uneven=bool(seed % 2))
    _, ids_d, _ = draft_topk(x.unsqueeze(0), min(k, V))
    kk = min(k, V)
    for c in per_rank:
        assert torch.equal(c.ids[:, :kk], ids_d[0])


def test_tp_needs_all_gather():
    with pytest.raises(ValueError, match="all_gather"):
        D.vocab_parallel_topk(torch.randn(2, 5), 0, 3, world_size=2)


@pytest.mark.parametrize("R", [2, 3])
def test_tp_tree_equals_dense_tree(R):
    """All ranks build the tree the single-rank computation builds (given the same lse)."""
    if not hasattr(ddtree_tree, "build_ddtree_from_topk"):
        pytest.skip("DDTree core lacks build_ddtree_from_topk (needed for TP > 1 tree building)")
    bs, L, V, N, K = 2, 5, 64, 24, 6
    x = logits(R, bs * L, V, "ties").view(bs, L, V)
    roots = torch.tensor([3, 9])
    sizes = D.DDTreeSizes(L + 1, N, K)
    per_rank = simulate_tp(x.view(bs * L, V), R, K)
    trees = [D.build_tree_from_candidates(c, roots, sizes) for c in per_rank]
    dense = build_ddtree(x, roots, N, K, use_triton=False)
    lse = per_rank[0].lse.view(bs, L)
    for t in trees:
        for f in ("tokens", "parents", "depths", "valid", "retrieve_next_token", "retrieve_next_sibling"):
            assert torch.equal(getattr(t, f), getattr(trees[0], f)), f
            # equal to the dense single-rank build here; in general up to lse rounding
            assert torch.equal(getattr(t, f), getattr(dense, f)), f
        for b in range(bs):  # exact: the paper's heap on the dense logits with the merged lse
            want = reference_labelled(build_tree_reference(x[b], N, K, lse=lse[b]), int(roots[b]), N)
            for f in ("tokens", "parents", "depths", "valid", "scores"):
                assert torch.equal(getattr(t, f)[b], want[f]), (b, f)


# ------------------------------------------------------------------------------ verify input
def random_tree(seed, bs=3, L=6, V=40, N=20, K=5, rb=None):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(bs, L, V, generator=g) * 2
    roots = torch.randint(0, V, (bs,), generator=g)
    return build_ddtree(x, roots, N, K, request_budget=rb, use_triton=False)


def test_positions_are_written_in_place_into_the_static_buffer():
    tree = random_tree(1)
    buf = torch.full((200,), -5, dtype=torch.int64)
    prefix = torch.tensor([3, 0, 11])
    view = D.write_verify_positions(tree, prefix, buf)
    assert view.data_ptr() == buf.data_ptr()
    assert torch.equal(view, tree_positions(tree, prefix))
    assert torch.equal(buf[view.numel():], torch.full((200 - view.numel(),), -5))
    prefix2 = prefix + 4  # a replay writes the same storage again
    D.write_verify_positions(tree, prefix2, buf)
    assert torch.equal(view, tree_positions(tree, prefix2))
    with pytest.raises(ValueError, match="positions buffer"):
        D.write_verify_positions(tree, prefix, torch.zeros(5, dtype=torch.int64))


def test_verify_input_from_tree_carries_tree_arrays_and_full_mask():
    tree = random_tree(2, rb=torch.tensor([20, 7, 1]))
    prefix = torch.tensor([5, 2, 9])
    pos = torch.zeros(100, dtype=torch.int64)
    vi = D.DDTreeVerifyInput.from_tree(tree, prefix, positions_out=pos, prefix_lens_sum=16)
    N1 = tree.tokens.shape[1]
    assert vi.draft_token_num == N1 == vi.num_tokens_per_req == vi.budget + 1
    assert torch.equal(vi.draft_token, tree.tokens.reshape(-1))
    assert vi.positions.data_ptr() == pos.data_ptr()
    for f in ("retrieve_index", "retrieve_next_token", "retrieve_next_sibling"):
        assert getattr(vi, f) is getattr(tree, f)
    assert torch.equal(vi.custom_mask, build_custom_mask(tree, prefix, use_triton=False))
    assert vi.custom_mask.numel() == custom_mask_size(16, 3, N1)
    assert vi.topk == 1 and vi.tree_topk == -1 and vi.max_tree_depth == tree.max_depth + 1
    # into a preallocated mask buffer: the used prefix of that buffer
    mbuf = torch.zeros(custom_mask_size(16, 3, N1) + 50, dtype=torch.bool)
    vi2 = D.DDTreeVerifyInput.from_tree(tree, prefix, positions_out=pos, custom_mask_out=mbuf,
                                        prefix_lens_sum=16)
    assert vi2.custom_mask.data_ptr() == mbuf.data_ptr()
    assert torch.equal(vi2.custom_mask, vi.custom_mask)
    with pytest.raises(ValueError, match="custom mask buffer"):
        D.DDTreeVerifyInput.from_tree(tree, prefix, positions_out=pos, custom_mask_out=mbuf[:10],
                                      prefix_lens_sum=16)


def test_mask_rows_are_prefix_then_ancestors_and_self():
    tree = random_tree(3)
    prefix = torch.tensor([2, 0, 4])
    vi = D.DDTreeVerifyInput.from_tree(tree, prefix, positions_out=torch.zeros(80, dtype=torch.int64),
                                       prefix_lens_sum=6)
    N1 = tree.tokens.shape[1]
    off = 0
    for b in range(3):
        p = int(prefix[b])
        block = vi.custom_mask[off : off + N1 * (p + N1)].view(N1, p + N1)
        off += N1 * (p + N1)
        assert bool(block[:, :p].all())
        for j in range(N1):
            anc = set()
            i = j
            while i >= 0 and bool(tree.valid[b, i]):
                anc.add(i)
                i = int(tree.parents[b, i])
            if not bool(tree.valid[b, j]):
                anc = {j}
            assert {i for i in range(N1) if bool(block[j, p + i])} == anc


def test_capture_input_always_has_a_mask_for_the_target():
    buf = torch.ones(1000, dtype=torch.bool)
    vi = D.DDTreeVerifyInput.create_capture_input(buf, 65, is_draft_worker=False)
    assert vi.custom_mask is buf and vi.draft_token_num == 65 and vi.budget == 64
    with pytest.raises(ValueError, match="custom_mask"):
        D.DDTreeVerifyInput.create_capture_input(None, 65, is_draft_worker=False)
    draft = D.DDTreeVerifyInput.create_capture_input(buf, 16, is_draft_worker=True)
    assert draft.custom_mask is None and draft.draft_token_num == 16
    assert not isinstance(draft, D.DDTreeVerifyInput)
    idle = D.DDTreeVerifyInput.create_idle_input("cpu", 65)
    assert idle.draft_token.numel() == 0 and idle.draft_token_num == 65
    with pytest.raises(ValueError, match="budget"):
        D.DDTreeVerifyInput(draft_token=None, positions=None, draft_token_num=10, budget=64)


# ---------------------------------------------------------------------------- after acceptance
def targets_following_tree(tree, seed, p=0.7):
    """Target picks that follow some child with probability p (long accepted paths)."""
    g = torch.Generator().manual_seed(seed)
    bs, N1 = tree.tokens.shape
    child = tree.retrieve_next_token.clamp(min=0)
    hop = torch.randint(0, 3, (bs, N1), generator=g)
    for _ in range(2):
        sib = torch.gather(tree.retrieve_next_sibling, 1, child)
        child = torch.where((hop > 0) & (sib >= 0), sib, child)
        hop = hop - 1
    follow = torch.gather(tree.tokens, 1, child)
    rnd = torch.randint(0, 40, (bs, N1), generator=g)
    return torch.where(torch.rand(bs, N1, generator=g) < p, follow, rnd)


@pytest.mark.parametrize("seed", range(6))
def test_kv_compaction_moves_the_accepted_path_to_the_front(seed):
    tree = random_tree(seed, bs=4, N=30, K=4, rb=torch.tensor([30, 12, 3, 30]))
    tgt = targets_following_tree(tree, seed)
    acc = greedy_accept(tree, tgt, use_triton=False)
    bs, N1 = tree.tokens.shape
    g = torch.Generator().manual_seed(100 + seed)
    slots = (torch.randperm(500, generator=g)[: bs * N1] + 1).view(bs, N1)  # slot 0 = dummy
    pool = torch.randn(501, 3, generator=g)
    before = pool.clone()
    plan = D.kv_compaction_pairs(acc, slots)
    assert torch.equal(plan.contiguous, accepted_flat_indices(tree, acc).contiguous)
    # (a) SGLang's native move: index_put reads every source before writing
    p1 = pool.clone()
    p1[plan.tgt_loc] = p1[plan.src_loc]
    # (b) SGLang's tiled copy in chunks (cap 256 in 0.5.23, here small), chunk after chunk
    p2 = pool.clone()
    for c in range(0, plan.tgt_loc.numel(), 5):
        p2[plan.tgt_loc[c : c + 5]] = p2[plan.src_loc[c : c + 5]].clone()
    for moved_pool in (p1, p2):
        for b in range(bs):
            n = int(acc.accept_length[b]) + 1
            for j in range(n):
                a = int(acc.accept_index[b, j])
                assert torch.equal(moved_pool[slots[b, j]], before[slots[b, a]]), (b, j, a)
            # rows outside the committed front are either untouched or rejected nodes' slots
        assert torch.equal(moved_pool[0], before[0])
    touched = set(plan.tgt_loc.tolist()) - {0}
    committed_front = {int(slots[b, j]) for b in range(bs) for j in range(int(acc.accept_length[b]) + 1)}
    assert touched <= committed_front


def test_kv_compaction_of_a_contiguous_path_moves_nothing():
    tree = random_tree(7, bs=1, N=6, K=1)  # K = 1: the tree is a chain, labels 0..depth
    acc = greedy_accept(tree, torch.gather(tree.tokens, 1, tree.retrieve_next_token.clamp(min=0)),
                        use_triton=False)
    assert int(acc.accept_length[0]) == 6
    plan = D.kv_compaction_pairs(acc, torch.arange(10, 17).view(1, 7))
    assert not bool(plan.moved.any()) and bool(plan.contiguous.all())
    assert bool((plan.tgt_loc == 0).all()) and bool((plan.src_loc == 0).all())


@pytest.mark.parametrize("seed", range(4))
def test_hidden_rows_are_the_accepted_nodes_in_path_order(seed):
    tree = random_tree(seed, bs=3, N=25, K=5)
    acc = greedy_accept(tree, targets_following_tree(tree, seed, p=0.9), use_triton=False)
    bs, N1 = tree.tokens.shape
    W = 8
    rows = D.accepted_hidden_rows(acc, N1, W)
    hidden = torch.arange(bs * N1, dtype=torch.float32)[:, None] * torch.ones(1, 4)
    got = hidden[rows.reshape(-1)].view(bs, W, 4)
    flat = accepted_flat_indices(tree, acc).flat_index
    for b in range(bs):
        n = int(acc.accept_length[b]) + 1
        assert torch.equal(rows[b, :n], flat[b, :n])
        for j in range(n):
            assert float(got[b, j, 0]) == b * N1 + int(acc.accept_index[b, j])
        assert bool((rows[b, n:] >= b * N1).all()) and bool((rows[b, n:] < (b + 1) * N1).all())
    with pytest.raises(ValueError, match="width"):
        D.accepted_hidden_rows(acc, N1, 2)


def test_hidden_rows_are_not_the_first_rows_when_the_path_branches():
    """The bug one public port had: rows 0..n-1 instead of the accepted nodes' rows."""
    tree = random_tree(11, bs=1, N=12, K=4)
    second = int(tree.retrieve_next_sibling[0, 1])  # depth-1 node that is not label 1
    assert second > 1
    tgt = torch.zeros(1, tree.tokens.shape[1], dtype=torch.int64)
    tgt[0, 0] = tree.tokens[0, second]
    acc = greedy_accept(tree, tgt, use_triton=False)
    rows = D.accepted_hidden_rows(acc, tree.tokens.shape[1], 7)
    assert rows[0, :2].tolist() == [0, second] != [0, 1]


@pytest.mark.parametrize("seed", range(5))
def test_commit_outputs_match_the_reference_walk_and_the_processor_stride(seed):
    tree = random_tree(seed, bs=4, N=18, K=3, rb=torch.tensor([18, 18, 4, 9]))
    tgt = targets_following_tree(tree, seed)
    acc = greedy_accept(tree, tgt, use_triton=False)
    prefix = torch.tensor([10, 20, 30, 40])
    S = tree.max_depth + 1
    out = D.commit_outputs(tree, acc, prefix, S)
    flat = out.out_tokens.reshape(-1)  # next_token_ids as the result processor receives them
    for b in range(4):
        path, bonus = greedy_walk_reference(tree.tokens[b], tree.parents[b], tgt[b], tree.valid[b])
        emitted = [int(tree.tokens[b, j]) for j in path[1:]] + [bonus]
        n = int(out.commit_lens[b])
        assert flat[b * S : b * S + n].tolist() == emitted  # the processor's read
        assert n == len(path) and int(out.new_seq_lens[b]) == int(prefix[b]) + n
    assert out.commit_lens.dtype == torch.int32
    with pytest.raises(ValueError, match="stride"):
        D.commit_outputs(tree, acc, prefix, S - 1)


def test_accept_index_to_sglang_rows():
    tree = random_tree(4, bs=3)
    acc = greedy_accept(tree, targets_following_tree(tree, 4), use_triton=False)
    N1 = tree.tokens.shape[1]
    flat = D.accept_index_to_sglang(acc, N1)
    want = accepted_flat_indices(tree, acc).flat_index
    assert flat.dtype == torch.int32 and torch.equal(flat.long(), want)


def test_draft_commit_positions():
    pos = D.draft_commit_positions(torch.tensor([4, 9]), 3)
    assert pos.tolist() == [4, 5, 6, 9, 10, 11]


# ------------------------------------------------------------- a whole verify step, simulated
def toy_target(context):
    """A deterministic stand-in for the target's greedy choice given the full context."""
    h = 1469598103
    for t in context:
        h = (h * 1099511628211 + int(t) + 7) % (1 << 61)
    return h % 23


@pytest.mark.parametrize("seed", range(3))
def test_simulated_decode_steps_emit_the_targets_greedy_tokens(seed):
    """Draft logits -> tree -> verify input (positions, FULL mask) -> a 'target forward' that only
    sees what the mask and positions show it -> acceptance -> compaction of a simulated KV pool ->
    output rows. The emitted text must be the target's greedy continuation and the compacted KV
    must hold the committed tokens in order at their positions."""
    g = torch.Generator().manual_seed(seed)
    bs, B, V, N, K = 2, 6, 23, 16, 4
    sizes = D.DDTreeSizes(B, N, K)
    L, N1, W = sizes.draft_depth, sizes.verify_width, sizes.window_width
    text = [[int(t) for t in torch.randint(0, V, (3,), generator=g)] for _ in range(bs)]
    kv = {}  # slot -> (token, position), the simulated KV pool
    next_slot = [1000 * (b + 1) for b in range(bs)]
    slot_table = [list(range(next_slot[b], next_slot[b] + len(text[b]))) for b in range(bs)]
    for b in range(bs):
        for p, s in enumerate(slot_table[b]):
            kv[s] = (text[b][p], p)
    bonus = torch.tensor([toy_target(text[b]) for b in range(bs)])
    emitted = [[int(bonus[b])] for b in range(bs)]
    for step in range(6):
        prefix = torch.tensor([len(slot_table[b]) for b in range(bs)])
        # drafter: favours the target's chain with noise
        x = torch.randn(bs, L, V, generator=g)
        for b in range(bs):
            ctx = text[b] + [int(bonus[b])]
            for d in range(L):
                t = toy_target(ctx)
                x[b, d, t] += 3.0 if torch.rand(1, generator=g).item() < 0.8 else 0.0
                ctx = ctx + [t]
        tree = build_ddtree(x, bonus, N, K, use_triton=False)
        pos_buf = torch.zeros(bs * N1, dtype=torch.int64)
        vi = D.DDTreeVerifyInput.from_tree(tree, prefix, positions_out=pos_buf,
                                           prefix_lens_sum=int(prefix.sum()))
        # window slots (reserved ahead, as prepare_for_decode does) and the verify's KV writes
        window = torch.zeros(bs, W, dtype=torch.int64)
        for b in range(bs):
            base = slot_table[b][-1] + 1 if step == 0 else next_slot[b]
            window[b] = torch.arange(base, base + W)
            next_slot[b] = base
            for j in range(N1):
                kv[int(window[b, j])] = (int(tree.tokens[b, j]), int(vi.positions[b * N1 + j]))
        # target forward: each query sees the prefix and the tree keys its mask row allows,
        # in position order
        tgt = torch.zeros(bs, N1, dtype=torch.int64)
        off = 0
        for b in range(bs):
            p = int(prefix[b])
            block = vi.custom_mask[off : off + N1 * (p + N1)].view(N1, p + N1)
            off += N1 * (p + N1)
            for j in range(N1):
                keys = [kv[slot_table[b][i]] for i in range(p) if bool(block[j, i])]
                keys += [kv[int(window[b, i])] for i in range(N1) if bool(block[j, p + i])]
                keys.sort(key=lambda tp: tp[1])
                assert [q for _, q in keys] == list(range(len(keys))), "positions must be dense"
                tgt[b, j] = toy_target([t for t, _ in keys])
        acc = greedy_accept(tree, tgt, use_triton=False)
        out = D.commit_outputs(tree, acc, prefix, sizes.output_stride)
        plan = D.kv_compaction_pairs(acc, window)
        src = [kv.get(int(s)) for s in plan.src_loc]
        for t_, s_ in zip(plan.tgt_loc.tolist(), src):
            if t_ != 0:
                kv[t_] = s_
        rows = D.accepted_hidden_rows(acc, N1, sizes.accept_width)
        for b in range(bs):
            n = int(out.commit_lens[b])
            toks = out.out_tokens[b, :n].tolist()
            committed = [int(bonus[b])] + toks[:-1]  # root + accepted drafts enter the KV
            for j in range(n):
                assert kv[int(window[b, j])] == (committed[j], int(prefix[b]) + j)
                assert int(tree.tokens.view(-1)[rows[b, j]]) == committed[j]
            slot_table[b] += [int(window[b, j]) for j in range(n)]
            next_slot[b] = int(window[b, n])
            text[b] += committed
            emitted[b] += toks
            bonus[b] = toks[-1]
    for b in range(bs):
        ctx = text[b][:3]
        want = []
        for _ in range(len(emitted[b])):
            t = toy_target(ctx)
            want.append(t)
            ctx = ctx + [t]
        assert emitted[b] == want


# ------------------------------------------------------------------- the step's two halves
def test_step_pipeline_halves_equal_the_individual_helpers():
    tree = random_tree(9, bs=3, N=20, K=4, L=5)
    sizes = D.DDTreeSizes(block_size=6, budget=20, topk=4)
    prefix = torch.tensor([7, 1, 12])
    pos = torch.zeros(3 * 21, dtype=torch.int64)
    mask = torch.zeros(custom_mask_size(40, 3, 21), dtype=torch.bool)
    vi = D.prepare_verify_tensors(tree, prefix, positions_out=pos, custom_mask_out=mask,
                                  prefix_lens_sum=40)
    # a host bound above the true sum (20) only adds padding after the last request's block
    exact = build_custom_mask(tree, prefix, use_triton=False)
    assert torch.equal(vi.custom_mask[: exact.numel()], exact)
    assert bool(vi.custom_mask[exact.numel():].all())
    tgt = targets_following_tree(tree, 9)
    window = torch.arange(100, 100 + 3 * sizes.window_width).view(3, -1)
    res = D.finish_verify_tensors(tree, tgt, prefix, window, sizes)
    acc = greedy_accept(tree, tgt, use_triton=False)
    assert torch.equal(res.acceptance.accept_index, acc.accept_index)
    assert torch.equal(res.accept_index_flat, D.accept_index_to_sglang(acc, 21))
    assert torch.equal(res.outputs.out_tokens, D.commit_outputs(tree, acc, prefix, 6).out_tokens)
    assert torch.equal(res.kv_moves.tgt_loc, D.kv_compaction_pairs(acc, window).tgt_loc)
    assert torch.equal(res.hidden_rows, D.accepted_hidden_rows(acc, 21, 6))
    assert torch.equal(res.draft_positions, D.draft_commit_positions(prefix, 6))
    if D.DDTreeDraftInputV2 is None:
        with pytest.raises(RuntimeError, match="SGLang"):
            D.make_ddtree_draft_input(bonus_tokens=torch.zeros(2), new_seq_lens=torch.zeros(2))


# ------------------------------------------------- no host reads, no value-dependent shapes
def test_step_pipeline_runs_under_fake_tensors():
    """FakeTensorMode raises on .item()/.tolist()/bool()/int() of a tensor and on value-dependent
    output shapes (nonzero, boolean-mask indexing): the torch path of the whole decode-step tensor
    pipeline — top-K merge, tree build, verify input, walk, compaction pairs, hidden-row gather,
    outputs — must run under it (the precondition for CUDA-graph capture; tests/gpu captures it)."""
    from torch._subclasses.fake_tensor import DataDependentOutputException, FakeTensorMode

    from patchsets.ddtree.modules.ddtree_tree import build_ddtree_from_topk, candidate_pairs
    from patchsets.ddtree.modules.ddtree_worker import draft_head_topk

    bs, B, V, N, K, H = 3, 6, 40, 20, 5, 8
    L = B - 1
    sizes = D.DDTreeSizes(B, N, K)
    candidate_pairs(N, K, "cpu")  # static table built eagerly, as before a capture
    g = torch.Generator().manual_seed(0)
    real = dict(
        x=torch.randn(bs, L, V, generator=g), roots=torch.randint(0, V, (bs,), generator=g),
        prefix=torch.tensor([5, 9, 2]), pos=torch.zeros(bs * (N + 1), dtype=torch.int64),
        mask=torch.zeros(custom_mask_size(40, bs, N + 1), dtype=torch.bool),
        tgt=torch.randint(0, V, (bs, N + 1), generator=g),
        window=torch.arange(1, 1 + bs * sizes.window_width).view(bs, -1),
        hidden=torch.randn(bs * (N + 1), H, generator=g), pool=torch.randn(200, H, generator=g),
        dh=torch.randn(bs * L, H, generator=g), w=torch.randn(V + 3, H, generator=g),
    )
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    with mode:
        f = {k: mode.from_tensor(v) for k, v in real.items()}
        with pytest.raises(DataDependentOutputException):  # the detector works
            f["prefix"].sum().item()
        cands = draft_head_topk(f["dh"], f["w"], num_org=V, vocab_start=0, k=K, world_size=2,
                                all_gather=lambda t: torch.stack([t, t]), chunk_rows=4)
        tp_tree = build_ddtree_from_topk(D.topk_logprobs(cands).view(bs, L, K), cands.ids.view(bs, L, K),
                                         f["roots"], N, use_triton=False)
        tree = build_ddtree(f["x"], f["roots"], N, K, use_triton=False)
        vi = D.prepare_verify_tensors(tree, f["prefix"], positions_out=f["pos"], custom_mask_out=f["mask"],
                                      prefix_lens_sum=40)
        res = D.finish_verify_tensors(tree, f["tgt"], f["prefix"], f["window"], sizes)
        ctx = f["hidden"][res.hidden_rows.reshape(-1)]
        f["pool"][res.kv_moves.tgt_loc] = f["pool"][res.kv_moves.src_loc]
    assert tp_tree.tokens.shape == tree.tokens.shape == (bs, N + 1)
    assert vi.custom_mask.shape == (custom_mask_size(40, bs, N + 1),)
    assert res.outputs.out_tokens.shape == (bs, B) and ctx.shape == (bs * B, H)
    assert res.kv_moves.tgt_loc.shape == (bs * B,)
