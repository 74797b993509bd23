"""DDTree is lossless, for real: a tiny randomly initialised Llama (transformers) is the target,
the drafter is the target's own greedy-chain logits plus noise, and verification runs the target
over the flattened tree with SGLang's custom_mask layout (turned into the model's 4-D mask) and
depth positions.

* T = 0: DDTree decoding emits exactly the target's greedy tokens; the hidden states gathered at
  ``accepted_flat_indices`` equal those of a plain causal pass over the accepted text.
* T = 1: the emitted tokens' distribution equals the target's (chi-square, fixed seed).
"""

from __future__ import annotations

from typing import List

import pytest
import torch

transformers = pytest.importorskip("transformers")

from patchsets.ddtree.modules.ddtree_accept import (  # noqa: E402
    accepted_flat_indices,
    greedy_accept,
    sample_accept,
)
from patchsets.ddtree.modules.ddtree_tree import (  # noqa: E402
    build_custom_mask,
    build_ddtree,
    tree_positions,
)

pytestmark = pytest.mark.slow


def tiny_target(vocab: int, seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
        initializer_range=0.3,
    )
    torch.manual_seed(seed)
    return LlamaForCausalLM(cfg).eval()


@torch.no_grad()
def last_logits(model, seqs: List[List[int]]) -> torch.Tensor:
    """Logits after the last token of each sequence (right padding + 2-D mask). [bs, V]"""
    T = max(len(s) for s in seqs)
    ids = torch.zeros(len(seqs), T, dtype=torch.long)
    am = torch.zeros(len(seqs), T, dtype=torch.long)
    for b, s in enumerate(seqs):
        ids[b, : len(s)] = torch.tensor(s)
        am[b, : len(s)] = 1
    out = model(ids, attention_mask=am).logits
    last = torch.tensor([len(s) - 1 for s in seqs])
    return out[torch.arange(len(seqs)), last].float()


@torch.no_grad()
def draft_logits(model, seqs: List[List[int]], L: int, noise: float, gen) -> torch.Tensor:
    """Drafter: the target's greedy chain of L steps, logits + Gaussian noise. [bs, L, V]"""
    seqs = [list(s) for s in seqs]
    out = []
    for _ in range(L):
        lg = last_logits(model, seqs)
        out.append(lg + noise * torch.randn(lg.shape, generator=gen))
        for b, t in enumerate(lg.argmax(-1).tolist()):
            seqs[b].append(t)
    return torch.stack(out, 1)


@torch.no_grad()
def verify_tree(model, seqs: List[List[int]], tree, hidden: bool = False):
    """Target over [committed prefix ++ flattened tree]; the root is each sequence's last token.

    The 4-D mask is cut out of SGLang's flat custom_mask, positions come from tree_positions.
    Returns logits (and last hidden states) at the tree rows: [bs, N1, V] (, [bs, N1, H]).
    """
    bs, N1 = tree.tokens.shape
    prefix = [s[:-1] for s in seqs]
    pl = torch.tensor([len(p) for p in prefix])
    flat = build_custom_mask(tree, pl, prefix_lens_sum=int(pl.sum()), use_triton=False)
    pos_tree = tree_positions(tree, pl).view(bs, N1)
    P = int(pl.max())
    T = P + N1
    ids = torch.zeros(bs, T, dtype=torch.long)
    pos = torch.zeros(bs, T, dtype=torch.long)
    mask = torch.zeros(bs, 1, T, T, dtype=torch.bool)
    off = 0
    for b in range(bs):
        p = int(pl[b])
        ids[b, :p] = torch.tensor(prefix[b], dtype=torch.long)
        pos[b, :p] = torch.arange(p)
        mask[b, 0, :p, :p] = torch.tril(torch.ones(p, p, dtype=torch.bool))
        mask[b, 0, torch.arange(p, P), torch.arange(p, P)] = True  # padding rows: self only
        block = flat[off : off + N1 * (p + N1)].view(N1, p + N1)
        off += block.numel()
        mask[b, 0, P:, :p] = block[:, :p]
        mask[b, 0, P:, P:] = block[:, p:]
        ids[b, P:] = tree.tokens[b]
        pos[b, P:] = pos_tree[b]
    out = model(ids, attention_mask=mask, position_ids=pos, output_hidden_states=hidden)
    logits = out.logits[:, P:].float()
    if hidden:
        return logits, out.hidden_states[-1][:, P:]
    return logits


@torch.no_grad()
def greedy_reference(model, seq: List[int], n: int) -> List[int]:
    seq = list(seq)
    for _ in range(n):
        seq.append(int(last_logits(model, [seq])[0].argmax()))
    return seq


def test_greedy_ddtree_emits_the_targets_greedy_tokens():
    V, L, N, K = 24, 5, 14, 4
    model = tiny_target(V, seed=1)
    gen = torch.Generator().manual_seed(7)
    prompts = [[1, 2, 3], [5, 9, 4, 4, 7], [11]]
    want = [greedy_reference(model, p, 30) for p in prompts]
    seqs = [list(p) for p in prompts]
    accepted_total = 0
    steps = 0
    while min(len(s) - len(p) for s, p in zip(seqs, prompts)) < 30:
        dl = draft_logits(model, seqs, L, noise=1.5, gen=gen)
        roots = torch.tensor([s[-1] for s in seqs])
        tree = build_ddtree(dl, roots, N, K, request_budget=torch.tensor([N, 9, N]), use_triton=False)
        logits, hid = verify_tree(model, seqs, tree, hidden=True)
        acc = greedy_accept(tree, logits.argmax(-1), use_triton=False)
        idx = accepted_flat_indices(tree, acc)
        flat_hid = hid.reshape(-1, hid.shape[-1])
        for b in range(len(seqs)):
            n = int(acc.accept_length[b])
            path = acc.accept_index[b, 1 : 1 + n]
            new = tree.tokens[b, path].tolist() + [int(acc.bonus_token[b])]
            # hidden states of the ACCEPTED nodes (path order) == a causal pass over that text
            rows = idx.flat_index[b, : n + 1]
            causal = model(torch.tensor([seqs[b] + new[:-1]]), output_hidden_states=True)
            ref_h = causal.hidden_states[-1][0, len(seqs[b]) - 1 :]
            torch.testing.assert_close(flat_hid[rows], ref_h, rtol=1e-4, atol=1e-4)
            seqs[b].extend(new)
            accepted_total += n
        steps += 1
    for s, w in zip(seqs, want):
        assert s[: len(w)] == w
    assert accepted_total > steps  # the tree is doing work (more than one draft per step)


def chi2_pvalue(counts: torch.Tensor, probs: torch.Tensor) -> float:
    n = counts.sum()
    keep = probs * n >= 5  # pool rare cells
    obs = torch.cat([counts[keep], counts[~keep].sum().reshape(1)]).double()
    exp = torch.cat([probs[keep] * n, (probs[~keep].sum() * n).reshape(1)]).double()
    if exp[-1] < 5:
        obs, exp = obs[:-1], exp[:-1]
    stat = ((obs - exp) ** 2 / exp).sum()
    df = obs.numel() - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2.0, dtype=torch.float64), stat / 2))


@torch.no_grad()
def test_sampling_ddtree_matches_target_distribution():
    V, L, N, K = 10, 4, 12, 4
    model = tiny_target(V, seed=3)
    gen = torch.Generator().manual_seed(11)
    prompt = [1, 2]
    R = 3000
    seqs = [list(prompt) for _ in range(R)]
    emitted: List[List[int]] = [[] for _ in range(R)]
    wrong_t1 = None
    for rnd in range(2):  # two lockstep rounds: >= 2 emitted tokens per request
        dl = draft_logits(model, seqs, L, noise=1.0, gen=gen)
        tree = build_ddtree(dl, torch.tensor([s[-1] for s in seqs]), N, K, use_triton=False)
        probs = torch.softmax(verify_tree(model, seqs, tree), -1)
        if rnd == 0:
            first_tree = tree
        if rnd == 0:  # negative control: rows shifted by one node (an off-by-one bug)
            wrong_t1 = sample_accept(tree, probs.roll(1, dims=1), generator=gen, use_triton=False)
        acc = sample_accept(tree, probs, generator=gen, use_triton=False)
        toks = tree.tokens.gather(1, acc.accept_index.clamp(min=0))
        for b in range(R):
            n = int(acc.accept_length[b])
            new = toks[b, 1 : 1 + n].tolist() + [int(acc.bonus_token[b])]
            seqs[b].extend(new)
            emitted[b].extend(new)
    t1 = torch.tensor([e[0] for e in emitted])
    t2 = torch.tensor([e[1] for e in emitted])
    p1 = torch.softmax(last_logits(model, [prompt]), -1)[0].double()
    p2_given = torch.softmax(last_logits(model, [prompt + [t] for t in range(V)]), -1).double()
    p2 = (p1[:, None] * p2_given).sum(0)
    assert chi2_pvalue(torch.bincount(t1, minlength=V), p1) > 1e-3
    assert chi2_pvalue(torch.bincount(t2, minlength=V), p2) > 1e-3
    # joint (t1, t2) over the well-populated cells
    joint = (p1[:, None] * p2_given).flatten()
    assert chi2_pvalue(torch.bincount(t1 * V + t2, minlength=V * V), joint) > 1e-3
    # the test has power: the off-by-one control is rejected
    bad = torch.where(wrong_t1.accept_length > 0, tree_first_tokens(wrong_t1, first_tree), wrong_t1.bonus_token)
    assert chi2_pvalue(torch.bincount(bad, minlength=V), p1) < 1e-6
    # trees were accepted beyond the root often enough for t2 to come from the tree
    assert sum(len(e) > 2 for e in emitted) > R // 10


def tree_first_tokens(acc, tree):
    return tree.tokens.gather(1, acc.accept_index[:, 1:2].clamp(min=0)).squeeze(1)
