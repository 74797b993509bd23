"""DDTree acceptance: the greedy walk, the sampling walk, and the accepted-path indices.

Source: Ringel & Romano (arXiv 2604.12989), tree verification: walk from the root while the
target's choice at the current node is one of its children. At T > 0 the choice at each node is a
draw from the target under that node's own context; because the draft tree is deterministic this
is lossless without tree rejection sampling (every emitted token is a target sample given exactly
the tokens before it).

All functions are fixed-shape torch ops (the walk is L + 1 vectorised steps), no host sync, and
CUDA-graph capturable; ``greedy_walk_triton`` (``sglang.kernels.ops.speculative.ddtree_walk``,
imported only when used) is the one-launch CUDA version. The result matches SGLang 0.5.23's
``verify_tree_greedy_func`` on our trees (tests/gpu).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from .ddtree_tree import DDTree

__all__ = [
    "Acceptance",
    "AcceptedIndices",
    "greedy_accept",
    "sample_accept",
    "sample_target_choices",
    "accepted_flat_indices",
]


@dataclass
class Acceptance:
    """Result of a walk.

      accept_index  [bs, L+1] int64  labels of the accepted path in order, root first, -1 padded
      accept_length [bs] int64       accepted DRAFT tokens (root not counted; 0..L)
      bonus_token   [bs] int64       the target's choice at the last accepted node
    Tokens committed this step = tokens[accept_index[1 : 1 + accept_length]] then bonus_token.
    """

    accept_index: torch.Tensor
    accept_length: torch.Tensor
    bonus_token: torch.Tensor


@dataclass
class AcceptedIndices:
    """Where the accepted nodes sit in the flattened verify batch (bs * N1 rows).

      flat_index [bs, L+1] int64  b * N1 + accept_index (root first), -1 padded — gather the
                                  target hidden states / KV of the ACCEPTED nodes in path order
      count      [bs] int64       accepted nodes incl. the root (= accept_length + 1)
      contiguous [bs] bool        accepted labels are 0, 1, ..., accept_length (no KV move needed)
      dest_flat  [bs, L+1] int64  b * N1 + position on the path (the compacted slot), -1 padded
    """

    flat_index: torch.Tensor
    count: torch.Tensor
    contiguous: torch.Tensor
    dest_flat: torch.Tensor


def greedy_accept(
    tree: DDTree, target_tokens: torch.Tensor, use_triton: Optional[bool] = None
) -> Acceptance:
    """The greedy tree walk, batched.

    Args:
      tree: the DDTree that was verified.
      target_tokens: [bs, N1] int64, the target's pick after each node (argmax of the verify
        logits at T = 0; any per-node choice, e.g. ``sample_target_choices``, at T > 0).
      use_triton: one-kernel walk on CUDA (None = auto on CUDA).
    Returns:
      Acceptance with L + 1 columns (L = tree.max_depth).
    """
    bs, N1 = tree.tokens.shape
    if target_tokens.shape != (bs, N1):
        raise ValueError(f"target_tokens must be [bs, N1] = [{bs}, {N1}], got {tuple(target_tokens.shape)}")
    dev = tree.tokens.device
    if use_triton is None:
        use_triton = dev.type == "cuda"
    if use_triton:
        from sglang.kernels.ops.speculative.ddtree_walk import greedy_walk_triton

        walk = greedy_walk_triton(tree.tokens, tree.parents, tree.valid, tree.max_depth, target_tokens)
        return Acceptance(*walk)
    L = tree.max_depth
    tgt = target_tokens.to(torch.int64)
    cur = torch.zeros(bs, dtype=torch.int64, device=dev)
    alive = torch.ones(bs, dtype=torch.bool, device=dev)
    lab = torch.arange(N1, device=dev)
    cols = [cur.clone()]
    for _ in range(L):
        t = torch.gather(tgt, 1, cur[:, None])  # [bs, 1]
        match = (tree.parents == cur[:, None]) & (tree.tokens == t) & tree.valid
        has = match.any(-1)
        nxt = torch.where(match, lab, N1).min(-1).values
        alive = alive & has
        cur = torch.where(alive, nxt, cur)
        cols.append(torch.where(alive, cur, -1))
    accept_index = torch.stack(cols, 1)
    accept_length = (accept_index[:, 1:] >= 0).sum(-1)
    bonus = torch.gather(tgt, 1, cur[:, None]).squeeze(1)
    return Acceptance(accept_index, accept_length, bonus)


def sample_target_choices(
    target_probs: torch.Tensor,
    generator: Optional[torch.Generator] = None,
    coins: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """One independent draw per node from the target's distribution at that node.

    target_probs: [bs, N1, V] float (rows sum to 1, temperature/top-p already applied).
    coins: optional [bs, N1] uniforms in [0, 1): inverse-CDF draws (the same coins give the same
      tokens on every tensor-parallel rank); otherwise ``torch.multinomial`` with ``generator``.
    Returns [bs, N1] int64.
    """
    bs, N1, V = target_probs.shape
    flat = target_probs.reshape(bs * N1, V).float()
    if coins is None:
        return torch.multinomial(flat, 1, generator=generator).view(bs, N1)
    cdf = torch.cumsum(flat, dim=-1)
    u = coins.reshape(bs * N1, 1).to(cdf.dtype) * cdf[:, -1:]  # tolerate rows summing to ~1
    tok = (cdf <= u).sum(-1).clamp(max=V - 1)
    return tok.view(bs, N1)


def sample_accept(
    tree: DDTree,
    target_probs: torch.Tensor,
    generator: Optional[torch.Generator] = None,
    use_triton: Optional[bool] = None,
    coins: Optional[torch.Tensor] = None,
) -> Acceptance:
    """The sampling walk at T > 0: draw each node's next token from the target under that node's
    context, then walk greedily on those draws. Equal in law to ``sample_walk_reference`` (only
    the draws at visited nodes matter and they are independent). ``coins``: see
    ``sample_target_choices``."""
    choices = sample_target_choices(target_probs, generator, coins)
    return greedy_accept(tree, choices, use_triton=use_triton)


def accepted_flat_indices(tree: DDTree, acc: Acceptance) -> AcceptedIndices:
    """Indices of the accepted nodes in the flattened verify batch, in path order.

    Use ``flat_index`` to gather the ACCEPTED nodes' target hidden states for the drafter (never
    the first n rows) and, with ``dest_flat``, to move their KV entries to the front of the
    request's verify window (skip when ``contiguous``).
    """
    bs, N1 = tree.tokens.shape
    dev = tree.tokens.device
    ai = acc.accept_index
    ok = ai >= 0
    base = torch.arange(bs, device=dev)[:, None] * N1
    flat = torch.where(ok, base + ai, -1)
    steps = torch.arange(ai.shape[1], device=dev)[None, :]
    dest = torch.where(ok, base + steps, -1)
    contiguous = ((ai == steps) | ~ok).all(-1)
    return AcceptedIndices(flat, acc.accept_length + 1, contiguous, dest)
