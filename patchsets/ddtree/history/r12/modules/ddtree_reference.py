"""CPU reference for DDTree: the paper's best-first heap and the reference walks.

Source: Ringel & Romano, "Accelerating Speculative Decoding with Block Diffusion Draft Trees"
(arXiv 2604.12989), Prop. 3 (best-first search returns the N prefixes of largest mass). Written
from the paper; plain Python + torch, one request at a time, meant to be read and to be the oracle
that the batched builder in ``ddtree_tree.py`` is tested against.

Ranking and tie rule (every implementation follows it exactly)
---------------------------------------------------------------
* Per depth d (1..L) the draft logits ``x_d`` are upcast to float32 and
  ``lse_d = logsumexp(x_d)`` (float32). A token's log-prob is
  ``lp_d[v] = min(float32(x_d[v] - lse_d), 0)``.
* Token rank within a depth: by (logit desc, token id asc); only ranks ``< K' = min(topk, V)``
  exist. Ranking by the logit (the input) rather than by ``lp`` is the same order except that
  rounding in ``x - lse`` can merge two logits into one log-prob; the logit order is then the
  finer one, and ``lp`` stays non-increasing in rank.
* Score of a node (log mass of its prefix): float32 accumulation from the root,
  ``score(child) = float32(score(parent) + lp_d[rank])``, ``score(root) = 0``. float32 (not
  float64) so that a GPU key (score, tie-break) packs into one int64; every implementation does
  the same single IEEE addition per edge, so scores agree bit for bit given the same ``lse``.
* Order within a depth: (score desc, parent's order within depth d-1 asc, rank asc).
* Global order: (score desc, depth asc, order within depth asc). The tree is the first
  ``budget`` nodes of the global order (fewer when fewer prefixes exist).

The heap key ``(-score, depth, parent_order, rank)`` grows along both edges the search
follows (next sibling: same parent, score <=, rank + 1; first child: depth + 1, score <=), and
every node is reached from the seed by a chain of such edges with exactly one predecessor, so
popping the heap yields the nodes exactly in the global order above.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import numpy as np
import torch

from .ddtree_tree import clean_lp

__all__ = [
    "RefTree",
    "build_tree_reference",
    "build_tree_reference_from_topk",
    "reference_labelled",
    "greedy_walk_reference",
    "greedy_walk_reftree",
    "sample_walk_reference",
    "ref_logprobs",
]


@dataclass
class RefTree:
    """One request's best-first tree, nodes in global (pop) order; the root is implicit.

    Fields (N = number of nodes <= budget):
      tokens  [N] int64  token id of each node
      parents [N] int64  index (into these arrays) of the parent, -1 = the root
      depths  [N] int64  1..L
      scores  [N] float32 log mass of the prefix (see module docstring)
      ranks   [N] int64  the token's rank within its depth's top-K
      orders  [N] int64  the node's order within its depth (0 = best at that depth)
    """

    tokens: torch.Tensor
    parents: torch.Tensor
    depths: torch.Tensor
    scores: torch.Tensor
    ranks: torch.Tensor
    orders: torch.Tensor

    @property
    def num_nodes(self) -> int:
        return int(self.tokens.numel())


def ref_logprobs(
    draft_logits: torch.Tensor, topk: int, lse: Optional[torch.Tensor] = None
) -> Tuple[np.ndarray, np.ndarray]:
    """Per-depth top-K' log-probs and token ids under the tie rule, by a full stable sort.

    Args:
      draft_logits: [L, V] any float dtype (upcast to float32).
      topk: K >= 1; K' = min(K, V) ranks are kept.
      lse: optional [L] float32 log-sum-exp per depth (pass the one a GPU computed to compare
        bit for bit across devices); computed with ``torch.logsumexp`` on float32 otherwise.
    Returns:
      (lp [L, K'] float32 ndarray, ids [L, K'] int64 ndarray), each row in rank order.
    """
    if draft_logits.dim() != 2:
        raise ValueError(f"draft_logits must be [L, V], got shape {tuple(draft_logits.shape)}")
    if topk < 1:
        raise ValueError(f"topk must be >= 1, got {topk}")
    x = draft_logits.detach().to("cpu", torch.float32)
    L, V = x.shape
    k = min(topk, V)
    if lse is None:
        lse = torch.logsumexp(x, dim=-1)
    lse = lse.detach().to("cpu", torch.float32).reshape(L)
    # Stable sort: ascending token id first (the natural order), then logit descending.
    order = torch.sort(x, dim=-1, descending=True, stable=True).indices[:, :k]
    vals = torch.gather(x, 1, order)
    lp = torch.clamp((vals - lse[:, None]), max=0.0)
    return lp.numpy().astype(np.float32), order.numpy().astype(np.int64)


def build_tree_reference(
    draft_logits: torch.Tensor,
    budget: int,
    topk: int,
    lse: Optional[torch.Tensor] = None,
) -> RefTree:
    """The N highest-mass prefixes by best-first search (paper, Prop. 3).

    Args:
      draft_logits: [L, V] one request's draft logits (depth d = row d-1).
      budget: N >= 0, the number of draft nodes (the root/bonus token is not counted).
      topk: per-depth cap K >= 1 (``topk >= budget`` reproduces the paper's exact tree).
      lse: optional [L] float32 log-sum-exp to use instead of computing it (see ``ref_logprobs``).
    Returns:
      RefTree with min(budget, number of prefixes) nodes in global order.
    Raises:
      ValueError on a bad shape or a negative budget.
    """
    if budget < 0:
        raise ValueError(f"budget must be >= 0, got {budget}")
    lp, ids = ref_logprobs(draft_logits, topk, lse)
    return build_tree_reference_from_topk(lp, ids, budget)


def build_tree_reference_from_topk(lp, ids, budget: int) -> RefTree:
    """The heap on prepared per-depth top-K lists.

    Args:
      lp: [L, K'] float32 (ndarray or tensor) log-probs in rank order (non-increasing); NaN
        counts as -inf and > 0 as 0 (``ddtree_tree.clean_lp``);
      ids: [L, K'] int64 token ids in rank order; budget: N >= 0.
    Returns:
      RefTree (see ``build_tree_reference``).
    """
    lp = clean_lp(torch.as_tensor(lp, dtype=torch.float32).cpu()).numpy()  # NaN -> -inf, > 0 -> 0
    ids = np.asarray(ids.cpu() if isinstance(ids, torch.Tensor) else ids, dtype=np.int64)
    L, K = lp.shape
    f32 = np.float32
    # heap entry: (-score, depth, parent_order, rank, parent_index, score_f32)
    heap: List[tuple] = []
    if L > 0 and budget > 0:
        s = f32(f32(0.0) + lp[0, 0])
        heap.append((-float(s), 1, -1, 0, -1, s))
    tokens, parents, depths, scores, ranks, orders = [], [], [], [], [], []
    count_at_depth = [0] * (L + 1)
    while heap and len(tokens) < budget:
        neg, d, porder, r, pidx, s = heapq.heappop(heap)
        idx = len(tokens)
        order = count_at_depth[d]
        count_at_depth[d] += 1
        tokens.append(int(ids[d - 1, r]))
        parents.append(pidx)
        depths.append(d)
        scores.append(s)
        ranks.append(r)
        orders.append(order)
        if r + 1 < K:  # next sibling
            base = f32(0.0) if pidx < 0 else scores[pidx]
            s2 = f32(base + lp[d - 1, r + 1])
            heapq.heappush(heap, (-float(s2), d, porder, r + 1, pidx, s2))
        if d < L:  # first child
            s3 = f32(s + lp[d, 0])
            heapq.heappush(heap, (-float(s3), d + 1, order, 0, idx, s3))
    as_long = lambda v: torch.tensor(v, dtype=torch.int64)
    return RefTree(
        tokens=as_long(tokens),
        parents=as_long(parents),
        depths=as_long(depths),
        scores=torch.tensor(np.array(scores, dtype=np.float32)),
        ranks=as_long(ranks),
        orders=as_long(orders),
    )


def reference_labelled(tree: RefTree, root_token: int, budget: int) -> dict:
    """Relabel a RefTree the way ``ddtree_tree.build_ddtree`` does, padded to budget + 1.

    Label 0 is the root; then depth by depth; within a depth nodes are grouped by their parent's
    order within the previous depth (asc) and, inside a group, by rank (asc) — parents before
    children, siblings contiguous.

    Returns a dict of [budget + 1] tensors: tokens (int64, padding 0), parents (int64, -1 for
    root/padding), depths (int64, 0 for root/padding), valid (bool), scores (float32, root 0,
    padding -inf).
    """
    n = tree.num_nodes
    keys = []
    for j in range(n):
        p = int(tree.parents[j])
        porder = -1 if p < 0 else int(tree.orders[p])
        keys.append((int(tree.depths[j]), porder, int(tree.ranks[j]), j))
    keys.sort()
    new = {}
    for lab, (_, _, _, j) in enumerate(keys, start=1):
        new[j] = lab
    N1 = budget + 1
    tokens = torch.zeros(N1, dtype=torch.int64)
    parents = torch.full((N1,), -1, dtype=torch.int64)
    depths = torch.zeros(N1, dtype=torch.int64)
    valid = torch.zeros(N1, dtype=torch.bool)
    scores = torch.full((N1,), float("-inf"), dtype=torch.float32)
    tokens[0] = root_token
    valid[0] = True
    scores[0] = 0.0
    for j, lab in new.items():
        tokens[lab] = tree.tokens[j]
        p = int(tree.parents[j])
        parents[lab] = 0 if p < 0 else new[p]
        depths[lab] = tree.depths[j]
        valid[lab] = True
        scores[lab] = tree.scores[j]
    return dict(tokens=tokens, parents=parents, depths=depths, valid=valid, scores=scores)


def _children(tokens: Sequence[int], parents: Sequence[int], valid: Sequence[bool]):
    kids = {}
    for j in range(1, len(tokens)):
        if valid[j]:
            kids.setdefault(int(parents[j]), {})[int(tokens[j])] = j
    return kids


def greedy_walk_reference(
    tokens: torch.Tensor,
    parents: torch.Tensor,
    target_choice: torch.Tensor,
    valid: Optional[torch.Tensor] = None,
) -> Tuple[List[int], int]:
    """The greedy tree walk for one request on a labelled tree (node 0 = root).

    Args:
      tokens, parents: [N+1] int64 (parents[0] = -1); valid: [N+1] bool (all True if None).
      target_choice: [N+1] int64, the target's next-token pick at each node (argmax at T = 0,
        a per-node sample at T > 0).
    Returns:
      (accepted node labels including the root, in path order; the bonus token = the target's
      pick at the last accepted node). The number of accepted draft tokens is len(path) - 1.
    """
    tok = [int(t) for t in tokens.tolist()]
    par = [int(p) for p in parents.tolist()]
    val = [True] * len(tok) if valid is None else [bool(v) for v in valid.tolist()]
    choice = [int(c) for c in target_choice.tolist()]
    kids = _children(tok, par, val)
    path = [0]
    cur = 0
    while True:
        nxt = kids.get(cur, {}).get(choice[cur])
        if nxt is None:
            return path, choice[cur]
        path.append(nxt)
        cur = nxt


def greedy_walk_reftree(
    tree: RefTree, root_token: int, target_choice: torch.Tensor
) -> Tuple[List[int], int]:
    """The greedy walk on a RefTree in its own (global pop) order.

    target_choice: [N+1] int64 — index 0 is the root, index i + 1 is RefTree node i.
    Returns (accepted RefTree node indices in path order, root excluded; the bonus token).
    """
    n = tree.num_nodes
    tokens = torch.cat([torch.tensor([int(root_token)]), tree.tokens])
    parents = torch.cat([torch.tensor([-1]), tree.parents + 1])
    parents[1:][tree.parents < 0] = 0
    path, bonus = greedy_walk_reference(tokens, parents, target_choice[: n + 1])
    return [p - 1 for p in path[1:]], bonus


def sample_walk_reference(
    tokens: torch.Tensor,
    parents: torch.Tensor,
    target_probs: torch.Tensor,
    generator: Optional[torch.Generator] = None,
    valid: Optional[torch.Tensor] = None,
) -> Tuple[List[int], int]:
    """The sampling walk at T > 0 for one request: at each visited node draw the next token from
    the target's distribution at that node; step into the child carrying it, else stop and emit
    it as the bonus. Lossless for a deterministic tree: every emitted token is a draw from the
    target under exactly its own context.

    Args:
      target_probs: [N+1, V] float, rows sum to 1 (row j = target's distribution after node j).
    Returns:
      (accepted node labels incl. root, bonus token).
    """
    tok = [int(t) for t in tokens.tolist()]
    par = [int(p) for p in parents.tolist()]
    val = [True] * len(tok) if valid is None else [bool(v) for v in valid.tolist()]
    kids = _children(tok, par, val)
    path = [0]
    cur = 0
    while True:
        x = int(torch.multinomial(target_probs[cur].float(), 1, generator=generator))
        nxt = kids.get(cur, {}).get(x)
        if nxt is None:
            return path, x
        path.append(nxt)
        cur = nxt
