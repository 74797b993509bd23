"""DDTree test support: draft logits for the tests and benches (one generator, so both mean the
same inputs) and the check that the pruned beam equals the full one where it matters.

Kinds:
- "normal": N(0, 3^2) logits — a flat drafter: the top token of a 151,936-word row has
  probability ~3 %, so the exact tree is shallow (mostly depth 1-2).
- "peaked": "normal" plus, per row, four tokens lifted by ~19 / 17 / 16 / 15 (+-2): the top token
  gets probability ~0.3-0.95 as a trained drafter's does, so trees are deep (up to L).
- "ties": integers in [-2, 2] — heavy ties everywhere (the tie rule is exercised).
"""

from __future__ import annotations

import torch

KINDS = ("normal", "peaked", "ties")


def draft_logits(seed: int, bs: int, L: int, V: int, dtype=torch.float32, kind: str = "normal",
                 device="cpu") -> torch.Tensor:
    """[bs, L, V] logits of ``kind`` (see the module docstring), generated on the CPU from
    ``seed`` and moved to ``device``/``dtype``. Raises ValueError for an unknown kind."""
    g = torch.Generator().manual_seed(seed)
    if kind == "ties":
        x = torch.randint(-2, 3, (bs, L, V), generator=g).float()
    elif kind in ("normal", "peaked"):
        x = torch.randn(bs, L, V, generator=g) * 3
        if kind == "peaked":
            m = min(4, V)
            boost = torch.tensor([19.0, 17.0, 16.0, 15.0])[:m] + 2 * torch.randn(bs, L, m, generator=g)
            idx = torch.randint(0, V, (bs, L, m), generator=g)  # a repeat just adds up
            x.scatter_add_(2, idx, boost)
    else:
        raise ValueError(f"unknown logits kind {kind!r}; use one of {KINDS}")
    return x.to(dtype).to(device)


def assert_prune_beam_matches(full, pruned) -> None:
    """``full`` (``beam_triton`` or ``beam_select_triton``) and ``pruned`` (``beam_prune_triton``)
    outputs (score, valid, parent, rank [bs, L, N]; gtop [bs, N]): each depth's pruned beam is
    its first m valid entries and equals the full beam there bit for bit, the rest is invalid,
    and the valid keys of gtop are the same. Raises AssertionError naming request and depth."""
    bs, L, _ = full[0].shape
    for b in range(bs):
        gf, gp = full[4][b], pruned[4][b]
        vf, vp = (gf >> 30) < (1 << 32), (gp >> 30) < (1 << 32)
        assert torch.equal(gf[vf], gp[vp]), f"request {b}: valid gtop keys differ"
        for d in range(L):
            m = int(pruned[1][b, d].sum())
            assert bool(pruned[1][b, d, :m].all()), f"request {b} depth {d}: beam is not a prefix"
            for name, f, p in zip(("score", "valid", "parent", "rank"), full[:4], pruned[:4]):
                assert torch.equal(f[b, d, :m], p[b, d, :m]), f"request {b} depth {d}: {name} differs"
            fs, ps = full[0][b, d, :m], pruned[0][b, d, :m]  # bit for bit: -0.0 is not +0.0
            assert torch.equal(fs.view(torch.int32), ps.view(torch.int32)), f"request {b} depth {d}: score bits"


def assert_tree_arrays_match(tree) -> None:
    """The retrieve_* arrays and the tree mask of ``tree`` (a ``DDTree``, any device) equal the
    torch path's ``build_tree_arrays`` of its own parents and valid flags. Raises AssertionError
    naming the array."""
    from patchsets.ddtree.modules.ddtree_tree import build_tree_arrays

    want = build_tree_arrays(tree.parents, tree.valid, tree.max_depth)
    names = ("retrieve_index", "retrieve_next_token", "retrieve_next_sibling", "tree_mask")
    for name, w in zip(names, want):
        assert torch.equal(getattr(tree, name), w), f"{name} differs from build_tree_arrays"
