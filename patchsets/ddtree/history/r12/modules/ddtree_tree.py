"""Batched DDTree construction on the GPU (or CPU): static shapes, no host sync, graph-capturable.

Source: Ringel & Romano, "Accelerating Speculative Decoding with Block Diffusion Draft Trees"
(arXiv 2604.12989): the tree is the N prefixes of largest draft mass (Prop. 2/3). Instead of the
paper's heap we run a per-depth beam that yields the identical node set and order:

* depth 1: beam_1 = the first min(N, K') ranks of depth 1;
* depth d: beam_d = the best N of {children (i, k) of beam_{d-1}} in the within-depth order
  (score desc, parent order i asc, rank k asc). Because beam entry i's children score
  ``s_i + lp_d[k]`` and both sequences are non-increasing, (i, k) is preceded by every (i', k')
  with i' <= i, k' <= k, so it can only be among the best N if (i + 1)(k + 1) <= N: a static
  candidate set of size sum_i min(K', N // (i + 1)) ~ N H(N) instead of N K';
* the tree = the first n_b (= min(request_budget[b], N)) nodes of the global order
  (score desc, depth asc, order asc) over all beams; per depth this is a prefix of the beam.

The tie rule is the one written down in ``ddtree_reference.py``; ``test_ddtree_tree.py`` proves
``build_ddtree == build_tree_reference`` (node set, parents, labels) on random and tied logits.

Labels: 0 = root (the bonus token); then depth by depth; within a depth grouped by parent (in the
parent's within-depth order) and by rank inside a group: parents come before children and
siblings are contiguous, so ``retrieve_next_sibling[j]`` is ``j + 1`` or -1.

Two implementations with identical results: fixed-shape torch ops (topk/sort/gather/scatter/
cumsum; the CPU path) and Triton kernels in SGLang's kernel tree, by pipeline stage
(``sglang.kernels.ops.speculative``: ``ddtree_prep`` bound / radix top-K prep, ``ddtree_beam`` a
fused beam that stops where the best-first heap stops (or sorts / selects every depth in full),
``ddtree_verify_inputs`` count-based labelling, tree links/mask and the custom mask; imported only
when used, and they import nothing of this module); the variants are picked by ``prefer_prep`` /
``prefer_beam`` from the H200 measurements in bench/RESULTS.md). Neither has an ``.item()`` or a
data-dependent shape; both were
captured in CUDA graphs and replayed equal to eager on an H200 (tests/gpu). Call once eagerly for
a given (N, K, device) before capturing a CUDA graph: that caches the static candidate table on the
device (and compiles the Triton kernels).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Optional, Tuple

import torch

__all__ = [
    "DDTree",
    "build_ddtree",
    "build_ddtree_from_topk",
    "prefer_triton",
    "prefer_prep",
    "prefer_beam",
    "draft_topk",
    "candidate_pairs",
    "build_tree_arrays",
    "build_custom_mask",
    "custom_mask_size",
    "tree_positions",
    "desc_key",
    "clean_lp",
]

# Triton-path variants (bench/RESULTS.md): the prep kernels of ``draft_topk`` and the beam of
# ``build_ddtree_from_topk``; None = pick by the H200 measurements (``prefer_prep``,
# ``prefer_beam``).
DEFAULT_PREP: Optional[str] = None
DEFAULT_BEAM: Optional[str] = None

# Measured crossovers (bench/RESULTS.md, H200 run 2026-11-30 06:50, V = 151,936, L = 15, K = N).
_CHUNKED_PREP_MAX_ROWS = 120  # chunked vs row prep (measured on bf16): 2.3x at 15 rows, 1.15x
                              # at 120, 0.95x at 960
_PREPS = ("row", "chunked", "radix", "bound", "small")  # draft_topk's prep values
SMALL_PREP_MAX_K = 32  # ddtree_prep.SMALL_K_MAX: the largest K of the "small" prep


def prefer_prep(rows: int, dtype: Optional[torch.dtype] = None, k: Optional[int] = None,
                cuda: bool = True) -> str:
    """Triton prep variant for ``rows`` = bs * L logit rows of ``dtype`` and top-K ``k``.

    "small" for K <= 32 (``SMALL_PREP_MAX_K``) and any of bf16 / fp16 / fp32: each logit read
    once, one program per row for the rest (H200, V = 151,936, L = 15, K 8 / 16 / 32, flat and
    peaked logits, bench/RESULTS.md 2026-12-03, one run): bf16 22.5-25.6 us against bound's
    27.7-29.9 at bs 1, 41.3-43.7 against 85.3-87.5 at bs 8, 258-270 against 585-596 at bs 64
    (fp16 alike); fp32 31.9-32.4 / 59.2-61.2 / 352-363 us against chunked's 147-151 / 632-637 and
    row's 3,168-3,174 at bs 64. Otherwise ``_prefer_prep_large_k``. ``cuda`` False (CPU tensors:
    Triton's interpreter, the tests' way to run the kernels) keeps the large-K choice: there the
    small prep's per-row candidate sort takes ~50x the other preps (23 s against 0.5 s for
    [3, 15, 40] logits at K 8), and its own tests cover it.
    """
    if DEFAULT_PREP is not None:
        return DEFAULT_PREP
    if cuda and k is not None and k <= SMALL_PREP_MAX_K:
        return "small"
    return _prefer_prep_large_k(rows, dtype)


def _prefer_prep_large_k(rows: int, dtype: Optional[torch.dtype]) -> str:
    """The prep for K > 32 (and for "small" asked with K > 32).

    "bound" for 16-bit floats (bf16, fp16) at every row count and K: the fastest measured (H200,
    V = 151,936, bench/RESULTS.md 2026-12-01 tenth session, one run each):
    - bf16: at 15 rows 27.6-33.8 us for K <= 512 and 49.4-49.6 us at K 1024, against radix
      46.2-54.1 us; at 120 rows 85-113 us against 210-223; at 960 rows 590-789 us against
      1.54-1.62 ms (and 2.5-2.7 ms for "row" / "chunked", 2026-11-30 06:50 run). Radix won at 15
      rows and K 1024 until the bound prep's final sort ran 16 warps (seventh session); it stays
      available as ``prep="radix"``.
    - fp16 (the same kernels; fp16 used to get the 32-bit choice, "chunked" / "row"): the
      whole tree at peaked bs 1 N 512 131.4 us against 259.8 with "chunked", at peaked bs 64 N 256
      699.7 us against 2,615 with "row".
    32-bit logits: "chunked" (programs over (row, 4096-column chunk)) up to 120 rows, else "row"
    (fp32 peaked N 512 bs 1: 286.7 against 516.5 us; N 256 bs 64: 3,370 against 3,540).
    """
    if dtype in (torch.bfloat16, torch.float16):
        return "bound"
    return "chunked" if rows <= _CHUNKED_PREP_MAX_ROWS else "row"


def prefer_beam(budget: int) -> str:
    """Triton beam variant for budget N: "prune" (the heap's early stop: per depth only the
    candidates still able to enter the global top-N) at every N. H200, V = 151,936, L = 15
    (bench/RESULTS.md, 2026-11-30 third session): prune 9-70 us on flat logits (trees of depth
    <= 4) and 22-413 us on peaked ones (depth 6-15) for N 16-1024, bs 1-64, against 78-694 us for
    "select" and 22-3,479 us for "sort"; at N 16 prune 15.6 / 22.5 us against sort 24.4 / 24.2
    (flat / peaked, bs 1), at N 64 14.9 / 38.6 against 80.6 / 78.6."""
    if DEFAULT_BEAM is not None:
        return DEFAULT_BEAM
    return "prune"


# The low bits of a packed sort key hold a tie-break index; N * L and the candidate count must fit.
_SUB_BITS = 30
_SUB_MASK = (1 << _SUB_BITS) - 1


@dataclass
class DDTree:
    """A batch of DDTree draft trees, flattened with the root (bonus token) at column 0.

    All tensors live on the logits' device; ``N1 = budget + 1``.
      tokens                [bs, N1] int64  token id per node (padding 0)
      parents               [bs, N1] int64  parent label, -1 for the root and for padding
      depths                [bs, N1] int64  0 for the root and padding, 1..L for draft nodes
      valid                 [bs, N1] bool   root and the request's n_b draft nodes
      scores                [bs, N1] float32 log draft mass of the prefix (root 0, padding -inf)
      retrieve_index        [bs, N1] int64  b * N1 + j (flat row of node j in the verify batch)
      retrieve_next_token   [bs, N1] int64  label of the first child, -1 if none
      retrieve_next_sibling [bs, N1] int64  label of the next sibling, -1 if none
      tree_mask             [bs, N1, N1] bool  tree_mask[b, j, i] = i is j or an ancestor of j
                                          (padding rows see only themselves)
      num_nodes             [bs] int64      draft nodes per request (n_b, root not counted)
    These are exactly the arrays (and dtypes) SGLang 0.5.23's ``verify_tree_greedy_func`` reads
    (``candidates`` = tokens, ``retrive_*`` = retrieve_*); walks must be bounded by
    ``max_depth + 1`` accepted entries (root included).
    """

    tokens: torch.Tensor
    parents: torch.Tensor
    depths: torch.Tensor
    valid: torch.Tensor
    scores: torch.Tensor
    retrieve_index: torch.Tensor
    retrieve_next_token: torch.Tensor
    retrieve_next_sibling: torch.Tensor
    tree_mask: torch.Tensor
    num_nodes: torch.Tensor
    budget: int
    topk: int
    max_depth: int

    @property
    def batch_size(self) -> int:
        return self.tokens.shape[0]

    @property
    def num_verify_tokens(self) -> int:
        """Tokens verified per request: budget + 1."""
        return self.budget + 1


def desc_key(score: torch.Tensor, valid: torch.Tensor, sub: torch.Tensor) -> torch.Tensor:
    """Pack (score desc, sub asc) into one int64 that sorts ascending; invalid entries last.

    score: float32; valid: bool; sub: int64 in [0, 2**30) (the tie-break, e.g. a layout index).
    The float32 is mapped to its order-preserving unsigned 32-bit image (with -0.0 folded into
    +0.0), inverted so that a larger score gives a smaller key; invalid adds 2**32.
    """
    f = score.to(torch.float32) + 0.0  # -0.0 -> +0.0
    bits = f.view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    asc = torch.where(bits >= (1 << 31), 0xFFFFFFFF - bits, bits + (1 << 31))
    primary = (0xFFFFFFFF - asc) + torch.where(valid, 0, 1 << 32)
    return (primary << _SUB_BITS) | sub


def clean_lp(lp: torch.Tensor) -> torch.Tensor:
    """Log-probs as every tree builder uses them: NaN -> -inf and > 0 -> 0 (same dtype/shape).

    A drafter row of NaN or all -inf logits gives NaN lp (lse is NaN / -inf): such a depth drafts
    nothing instead of ranking first (NaN sorts above every score and would put children before
    their parents). Positive entries, outside the contract of log-probs, are cut to 0 so that a
    child never outranks its parent. The Triton beams apply the same rule as they load lp
    (``ddtree_beam._clean_lp``), the CPU heap too (``ddtree_reference``)."""
    return torch.where(lp <= 0, lp, torch.where(lp > 0, torch.zeros_like(lp), torch.full_like(lp, float("-inf"))))


@functools.lru_cache(maxsize=64)
def _candidate_pairs_cached(budget: int, k: int, device: str) -> Tuple[torch.Tensor, torch.Tensor]:
    ii, kk = [], []
    for i in range(budget):
        for r in range(min(k, budget // (i + 1))):
            ii.append(i)
            kk.append(r)
    dev = torch.device(device)
    return (
        torch.tensor(ii, dtype=torch.int64).to(dev),
        torch.tensor(kk, dtype=torch.int64).to(dev),
    )


def candidate_pairs(budget: int, k: int, device) -> Tuple[torch.Tensor, torch.Tensor]:
    """Static candidate children (beam index i, rank r) with (i + 1)(r + 1) <= budget, r < k.

    Returns two [C] int64 tensors sorted by (i asc, r asc); C = sum_i min(k, budget // (i + 1))
    (>= budget). Cached per (budget, k, device): build it eagerly before a CUDA-graph capture.
    """
    return _candidate_pairs_cached(int(budget), int(k), str(torch.device(device)))


def _split_topk(x: torch.Tensor, k: int, chunks: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """torch.topk over V in two stages (per-chunk top-k, then top-k of the survivors): more
    blocks in flight when bs * L is small. The values (and every id above the K-th value) are
    exactly those of one topk; which of several ids tied at the K-th value survive is up to
    torch, as for one topk (``exact_ties`` fixes that afterwards)."""
    bs, L, V = x.shape
    cs = -(-V // chunks)
    if cs < k:
        return torch.topk(x, k, dim=-1, largest=True, sorted=True)
    pad = cs * chunks - V
    xp = x if pad == 0 else torch.nn.functional.pad(x, (0, pad), value=float("-inf"))
    v1, i1 = torch.topk(xp.view(bs, L, chunks, cs), k, dim=-1, largest=True, sorted=False)
    i1 = i1 + (torch.arange(chunks, device=x.device) * cs).view(1, 1, chunks, 1)
    v2, j = torch.topk(v1.reshape(bs, L, chunks * k), k, dim=-1, largest=True, sorted=True)
    return v2, torch.gather(i1.reshape(bs, L, chunks * k), -1, j)


def draft_topk(
    draft_logits: torch.Tensor, topk: int, exact_ties: bool = True,
    use_triton: Optional[bool] = None, topk_chunks: int = 1, prep: Optional[str] = None,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-depth top-K' log-probs and ids under the tie rule (logit desc, token id asc).

    Args:
      draft_logits: [bs, L, V] bf16/fp16/fp32.
      topk: K >= 1; K' = min(K, V).
      exact_ties: resolve ties at the K'-th value by the smallest token ids (one extra pass over
        the logits); with False, which of several tied boundary tokens is kept is up to
        ``torch.topk`` (still a valid tree, just not reproducible across devices).
    Returns:
      lp  [bs, L, K'] float32, min(logit - lse, 0), non-increasing along K';
      ids [bs, L, K'] int64;
      lse [bs, L] float32 (torch.logsumexp of the float32 logits; on the Triton path an online
        log-sum-exp kernel, equal up to float32 rounding).
      use_triton: log-sum-exp and the tie fix as Triton kernels (one pass each over the logits,
        no [bs, L, V] temporaries); None = on CUDA.
      topk_chunks: > 1 runs ``torch.topk`` in two stages over that many vocabulary chunks
        (``_split_topk``); same result under ``exact_ties``.
      prep: Triton prep kernels — "row" (one program per row) or "chunked" (programs over
        (row, 4096-column chunk)) beside ``torch.topk``, or "radix" (bf16/fp16 only, else
        "chunked": ``ddtree_prep.topk_radix_triton``, an exact two-byte radix select with no
        ``torch.topk`` and no tie pass), or "bound" (bf16/fp16 only, else "chunked":
        ``ddtree_prep.topk_bound_triton``, sub-block maxima bound the K-th value and only the
        candidates above it are sorted; one looping radix program per row redoes a row with too many),
        or "small" (K' <= 32, bf16/fp16/fp32, else the large-K choice ``_prefer_prep_large_k``:
        ``ddtree_prep.topk_small_triton``, each logit read once, then one program per row gathers
        the K' best sub-blocks and sorts their candidates); same ids, lse equal up to float32
        rounding ("radix", "bound" and "small" on 16-bit logits: bit-identical). None =
        ``prefer_prep(bs * L, dtype, K)`` (the H200 winner, bench/RESULTS.md), as in ``build_ddtree``.
    """
    if draft_logits.dim() != 3:
        raise ValueError(f"draft_logits must be [bs, L, V], got {tuple(draft_logits.shape)}")
    bs, L, V = draft_logits.shape
    k = min(int(topk), V)
    x = draft_logits
    if use_triton is None:
        use_triton = x.device.type == "cuda"
    if prep is None:
        prep = prefer_prep(bs * L, x.dtype, k, cuda=x.is_cuda)
    if prep not in _PREPS:
        raise ValueError(f"prep must be one of {', '.join(map(repr, _PREPS))}, got {prep!r}")
    if prep == "small" and use_triton and topk_chunks <= 1 and k <= SMALL_PREP_MAX_K:
        from sglang.kernels.ops.speculative.ddtree_prep import topk_small_triton

        lp, ids, lse = topk_small_triton(x.reshape(bs * L, V), k)
        return lp.view(bs, L, k), ids.view(bs, L, k), lse.view(bs, L)
    if prep == "small":  # K > 32 (or no Triton): the large-K choice
        prep = _prefer_prep_large_k(bs * L, x.dtype)
    if (prep in ("radix", "bound") and use_triton and topk_chunks <= 1
            and x.dtype in (torch.bfloat16, torch.float16)):
        from sglang.kernels.ops.speculative.ddtree_prep import topk_bound_triton, topk_radix_triton

        fn = topk_bound_triton if prep == "bound" else topk_radix_triton
        lp, ids, lse = fn(x.reshape(bs * L, V), k)
        return lp.view(bs, L, k), ids.view(bs, L, k), lse.view(bs, L)
    if prep in ("radix", "bound"):
        prep = "chunked"  # 32-bit logits: the radix and bound preps handle 16-bit floats only
    if topk_chunks > 1:
        vals, ids = _split_topk(x, k, int(topk_chunks))
    else:
        vals, ids = torch.topk(x, k, dim=-1, largest=True, sorted=True)  # [bs, L, k]
    if use_triton and prep == "chunked":
        from sglang.kernels.ops.speculative.ddtree_prep import prep_chunked_triton

        lse, ids = prep_chunked_triton(x.reshape(bs * L, V), vals.reshape(bs * L, k),
                                       ids.reshape(bs * L, k), exact_ties)
        lse, ids = lse.view(bs, L), ids.view(bs, L, k)
    elif use_triton:
        from sglang.kernels.ops.speculative.ddtree_prep import lse_triton

        lse = lse_triton(x.reshape(bs * L, V)).view(bs, L)
    else:
        lse = torch.logsumexp(x.float(), dim=-1)  # [bs, L]
    if exact_ties and use_triton and prep == "chunked":
        pass  # ties already fixed by prep_chunked_triton
    elif exact_ties and use_triton:
        from sglang.kernels.ops.speculative.ddtree_prep import tie_fix_triton

        ids = tie_fix_triton(x.reshape(bs * L, V), vals.reshape(bs * L, k),
                             ids.reshape(bs * L, k)).view(bs, L, k)
    elif exact_ties:
        thr = vals[..., k - 1 : k]  # [bs, L, 1]
        n_gt = (vals > thr).sum(-1, keepdim=True)  # [bs, L, 1]
        vocab = torch.arange(V, device=x.device, dtype=torch.int32)
        eq_ids = torch.where(x == thr, vocab, V)  # [bs, L, V] int32
        eq_small = torch.topk(eq_ids, k, dim=-1, largest=False, sorted=True).values.long()
        pos = torch.arange(k, device=x.device)
        src = (pos - n_gt).clamp(min=0)  # [bs, L, k]
        ids = torch.where(pos < n_gt, ids, torch.gather(eq_small, -1, src))
    if exact_ties:
        # Order equal-value runs by id: run index (values are sorted desc) * V + id.
        run = torch.cumsum(
            torch.cat(
                [torch.zeros_like(vals[..., :1], dtype=torch.int64),
                 (vals[..., 1:] != vals[..., :-1]).long()],
                dim=-1,
            ),
            dim=-1,
        )
        key = run * V + ids
        ids = torch.sort(key, dim=-1).values - run * V
    lp = torch.clamp(vals.float() - lse[..., None], max=0.0)
    return lp, ids, lse


def _beam_search(lp: torch.Tensor, budget: int):
    """Per-depth beams. lp: [bs, L, K'] float32. Returns per depth (stacked on dim 1, [bs, L, N]):
    score float32, valid bool, parent order int64 (-1 at depth 1), rank int64."""
    bs, L, K = lp.shape
    N = budget
    dev = lp.device
    lp = clean_lp(lp)
    n1 = min(N, K)
    score = torch.full((bs, N), float("-inf"), dtype=torch.float32, device=dev)
    score[:, :n1] = lp[:, 0, :n1]
    valid = torch.zeros((bs, N), dtype=torch.bool, device=dev)
    valid[:, :n1] = True
    rank = torch.arange(N, device=dev).clamp(max=K - 1).expand(bs, N)
    parent = torch.full((bs, N), -1, dtype=torch.int64, device=dev)
    scores, valids, parents, ranks = [score], [valid], [parent], [rank]
    if L > 1:
        ci, ck = candidate_pairs(N, K, dev)
        C = ci.numel()
        sub = torch.arange(C, device=dev)
        for d in range(1, L):
            s = score[:, ci] + lp[:, d, ck]  # [bs, C] float32, one IEEE add per edge
            v = valid[:, ci]
            key = desc_key(s, v, sub)
            top = torch.sort(key, dim=-1).values[:, :N]  # [bs, N]
            c = top & _SUB_MASK
            score = torch.gather(s, 1, c)
            valid = torch.gather(v, 1, c)
            parent = ci[c]
            rank = ck[c]
            scores.append(score)
            valids.append(valid)
            parents.append(parent)
            ranks.append(rank)
    return (
        torch.stack(scores, 1),
        torch.stack(valids, 1),
        torch.stack(parents, 1),
        torch.stack(ranks, 1),
    )


def build_tree_arrays(parents: torch.Tensor, valid: torch.Tensor, max_depth: int):
    """retrieve_* arrays and the ancestor-or-self mask from a labelled tree (torch path).

    Args:
      parents: [bs, N1] int64 (labels; -1 root/padding), parents before children, siblings
        contiguous; valid: [bs, N1] bool; max_depth: L (bounds the ancestor chase).
    Returns:
      (retrieve_index, retrieve_next_token, retrieve_next_sibling) [bs, N1] int64 and
      tree_mask [bs, N1, N1] bool.
    """
    bs, N1 = parents.shape
    dev = parents.device
    lab = torch.arange(N1, device=dev)
    retrieve_index = (torch.arange(bs, device=dev)[:, None] * N1 + lab).contiguous()
    # next sibling: j + 1 if it shares j's parent
    nxt_same = torch.zeros_like(valid)
    nxt_same[:, :-1] = (parents[:, 1:] == parents[:, :-1]) & valid[:, 1:] & valid[:, :-1]
    nxt_same[:, 0] = False
    retrieve_next_sibling = torch.where(nxt_same, lab + 1, -1)
    # first child: a node whose predecessor has another parent
    prev_other = torch.ones_like(valid)
    prev_other[:, 1:] = parents[:, 1:] != parents[:, :-1]
    is_first = valid & prev_other & (parents >= 0)
    dst = torch.where(is_first, parents, N1)  # N1 = dump column
    buf = torch.full((bs, N1 + 1), -1, dtype=torch.int64, device=dev)
    buf.scatter_(1, dst, torch.where(is_first, lab.expand(bs, N1), -1))
    retrieve_next_token = buf[:, :N1].contiguous()
    # ancestor-or-self mask: chase parents max_depth times; dead chases write a dump column
    mask = torch.zeros((bs, N1, N1 + 1), dtype=torch.bool, device=dev)
    cur = lab.expand(bs, N1).clone()
    alive = valid.clone()
    ones = torch.ones((bs, N1, 1), dtype=torch.bool, device=dev)
    for _ in range(max_depth + 1):
        mask.scatter_(2, torch.where(alive, cur, N1).unsqueeze(-1), ones)
        nxt = torch.gather(parents, 1, cur)
        alive = alive & (nxt >= 0)
        cur = torch.where(alive, nxt, cur)
    mask = mask[:, :, :N1]
    # padding rows see only themselves (keeps attention rows non-empty)
    mask = mask | (torch.eye(N1, dtype=torch.bool, device=dev) & ~valid[:, :, None])
    return retrieve_index, retrieve_next_token, retrieve_next_sibling, mask


def prefer_triton(bs: int, budget: int, device) -> bool:
    """Which tree path is faster, from the H200 measurements in bench/RESULTS.md (CUDA graphs,
    V = 151,936, L = 15, K = N, bf16): the Triton path wins at every measured size (2026-11-30
    06:50, radix prep + selection beam: bs 1: 89 us at N 16 .. 775 us at N 1024; bs 64: 2.0-2.8
    ms; 09:12, bound prep + pruned beam: bs 1 N 256-512: 59-82 us flat / 178-286 us peaked
    logits; bs 64: 657-763 / 792-998 us) against the all-torch path (1.2-2.8 ms at bs 1, 6.4-9.4
    ms at bs 64). Budgets above 1024 (not measured) and CPU tensors take torch."""
    if torch.device(device).type != "cuda" or budget > 1024:
        return False
    return True


def build_ddtree(
    draft_logits: torch.Tensor,
    root_tokens: torch.Tensor,
    budget: int,
    topk: int,
    request_budget: Optional[torch.Tensor] = None,
    exact_ties: bool = True,
    use_triton: Optional[bool] = None,
    topk_chunks: Optional[int] = None,
    prep: Optional[str] = None,
    beam: Optional[str] = None,
) -> DDTree:
    """Build the DDTree of every request in the batch.

    Args:
      draft_logits: [bs, L, V] bf16/fp16/fp32, row d-1 = the drafter's logits for depth d.
      root_tokens: [bs] int64, the bonus token each tree hangs from (column 0).
      budget: N >= 1 draft nodes per request (static; verify width is N + 1).
      topk: per-depth cap K >= 1 (K >= N is the paper's exact tree).
      request_budget: optional [bs] int tensor; request b keeps its first min(rb, N) nodes of the
        global order and pads the rest (valid False).
      exact_ties: see ``draft_topk``.
      use_triton: the Triton path (log-sum-exp, tie fix, fused beam, fused labelling, tree
        links/mask kernels). None = ``prefer_triton(bs, budget, device)``, the measured winner
        (bench/RESULTS.md). True on CPU tensors needs TRITON_INTERPRET=1.
      topk_chunks: see ``draft_topk``; None = 1 (on the H200 the two-stage top-K was no faster:
        bench/RESULTS.md).
      prep: Triton prep kernels, see ``draft_topk``; None = ``prefer_prep(bs * L, dtype, topk)``.
      beam: Triton beam, see ``build_ddtree_from_topk``; None = ``prefer_beam(budget)``.
    Returns:
      DDTree (see its docstring). Static shapes; no host synchronisation.
    Raises:
      ValueError on bad shapes or sizes (checked on the host from shapes only).
    """
    if draft_logits.dim() != 3:
        raise ValueError(f"draft_logits must be [bs, L, V], got {tuple(draft_logits.shape)}")
    bs, L, V = draft_logits.shape
    N = int(budget)
    if N < 1 or topk < 1 or L < 1:
        raise ValueError(f"need budget >= 1, topk >= 1, L >= 1; got {N}, {topk}, {L}")
    if N * L >= (1 << _SUB_BITS):
        raise ValueError(f"budget * L = {N} * {L} must stay below 2**{_SUB_BITS}")
    if root_tokens.shape != (bs,):
        raise ValueError(f"root_tokens must be [bs] = [{bs}], got {tuple(root_tokens.shape)}")
    dev = draft_logits.device
    if use_triton is None:
        use_triton = prefer_triton(bs, N, dev)
    if topk_chunks is None:
        topk_chunks = 1
    lp, ids, _ = draft_topk(draft_logits, topk, exact_ties, use_triton=use_triton,
                            topk_chunks=topk_chunks,
                            prep=prefer_prep(bs * L, draft_logits.dtype, min(topk, V), cuda=draft_logits.is_cuda)
                            if prep is None else prep)
    return build_ddtree_from_topk(lp, ids, root_tokens, N, request_budget, use_triton=use_triton,
                                  beam=beam)


def build_ddtree_from_topk(
    lp: torch.Tensor,
    ids: torch.Tensor,
    root_tokens: torch.Tensor,
    budget: int,
    request_budget: Optional[torch.Tensor] = None,
    use_triton: Optional[bool] = None,
    beam: Optional[str] = None,
) -> DDTree:
    """Build the trees from prepared per-depth top-K lists (e.g. merged across TP ranks).

    Args:
      lp: [bs, L, K] float32 log-probs in rank order (non-increasing along K; -inf allowed),
        as ``draft_topk`` returns them; NaN counts as -inf and > 0 as 0 (``clean_lp``: a NaN or
        all -inf logits row drafts nothing); ids: [bs, L, K] int64 global token ids in the same
        order.
      root_tokens, budget, request_budget, use_triton: as in ``build_ddtree``.
      beam: Triton path only — "sort" (``beam_triton``: per depth a full ``tl.sort`` of the
        ~N H(N) candidate keys and a merge sort for the global order) or "select"
        (``beam_select_triton``: a 5-ary threshold search for the N-th key, compaction, a sort of
        the N survivors only; one selection for the global order) or "prune"
        (``beam_prune_triton``: per depth only the candidates that can still be in the global
        top-N, the best-first heap's early stop; a depth with no survivor ends the work).
        Identical trees. None = ``prefer_beam(budget)``. Labels come from per-parent counts (``label_count_triton``).
      DDTree, identical to ``build_ddtree`` on logits whose ``draft_topk`` gives (lp, ids).
    """
    if lp.dim() != 3 or ids.shape != lp.shape:
        raise ValueError(f"lp and ids must both be [bs, L, K]; got {tuple(lp.shape)} and {tuple(ids.shape)}")
    bs, L, K = lp.shape
    N = int(budget)
    if N < 1 or L < 1 or K < 1:
        raise ValueError(f"need budget >= 1, L >= 1, K >= 1; got {N}, {L}, {K}")
    if N * L >= (1 << _SUB_BITS):
        raise ValueError(f"budget * L = {N} * {L} must stay below 2**{_SUB_BITS}")
    if root_tokens.shape != (bs,):
        raise ValueError(f"root_tokens must be [bs] = [{bs}], got {tuple(root_tokens.shape)}")
    dev = lp.device
    N1 = N + 1
    lp = lp.to(torch.float32).contiguous()
    ids = ids.to(torch.int64).contiguous()
    if use_triton is None:
        use_triton = prefer_triton(bs, N, dev)
    if request_budget is None:
        nb = torch.full((bs,), N, dtype=torch.int64, device=dev)
    else:
        nb = request_budget.to(device=dev, dtype=torch.int64).clamp(0, N)
    beam = prefer_beam(N) if beam is None else beam
    if beam not in ("sort", "select", "prune"):
        raise ValueError(f"beam must be 'sort', 'select' or 'prune', got {beam!r}")
    if use_triton:
        from sglang.kernels.ops.speculative.ddtree_beam import beam_prune_triton, beam_select_triton, beam_triton
        from sglang.kernels.ops.speculative.ddtree_verify_inputs import label_count_triton, tree_mask_triton

        ci, ck = candidate_pairs(N, K, dev)
        beam_fn = {"sort": beam_triton, "select": beam_select_triton, "prune": beam_prune_triton}[beam]
        score, bvalid, bparent, brank, gtop = beam_fn(lp, N, ci, ck)
        tokens, parents, depths, valid, scores, num_nodes, ri, rnt, rns = label_count_triton(
            gtop, nb, root_tokens, ids, score, bparent, brank, N, links=True)
        tmask = tree_mask_triton(parents, valid, L)
        return DDTree(tokens=tokens, parents=parents, depths=depths, valid=valid, scores=scores,
                      retrieve_index=ri, retrieve_next_token=rnt, retrieve_next_sibling=rns,
                      tree_mask=tmask, num_nodes=num_nodes, budget=N, topk=K, max_depth=L)
    score, bvalid, bparent, brank = _beam_search(lp, N)  # [bs, L, N]

    # Global order: first n_b of (score desc, depth asc, order asc).
    sub = torch.arange(L * N, device=dev).view(1, L, N)
    gkey = desc_key(score, bvalid, sub.expand(bs, L, N)).view(bs, L * N)
    top = torch.topk(gkey, N, dim=-1, largest=False, sorted=True).values  # [bs, N]
    tau = torch.gather(top, 1, (nb - 1).clamp(min=0)[:, None])  # [bs, 1]
    sel = (gkey <= tau) & (nb[:, None] > 0) & bvalid.view(bs, L * N)
    sel = sel.view(bs, L, N)
    m = sel.sum(-1)  # [bs, L] nodes per depth (a prefix of each beam)
    num_nodes = m.sum(-1)

    # Labels: within a depth sort selected nodes by (parent order, rank).
    big = (N + 1) * (K + 1)
    key2 = torch.where(sel, bparent.clamp(min=0) * (K + 1) + brank, big)
    perm = torch.argsort(key2, dim=-1, stable=True)  # [bs, L, N] order of labels
    pos = torch.empty_like(perm)
    pos.scatter_(2, perm, torch.arange(N, device=dev).expand(bs, L, N))
    offset = 1 + torch.cumsum(m, dim=-1) - m  # [bs, L]
    label = torch.where(sel, offset[..., None] + pos, -1)  # [bs, L, N]
    # parent label
    plab = torch.zeros_like(label)
    if L > 1:
        prev = label[:, :-1, :]  # labels of depth d-1 by order
        plab[:, 1:, :] = torch.gather(prev, 2, bparent[:, 1:, :].clamp(min=0))
    tok = torch.gather(ids, 2, brank.clamp(max=K - 1))  # [bs, L, N]
    depth = torch.arange(1, L + 1, device=dev).view(1, L, 1).expand(bs, L, N)

    dst = torch.where(sel, label, N1).view(bs, L * N)
    def place(src, fill, dtype):
        out = torch.full((bs, N1 + 1), fill, dtype=dtype, device=dev)
        out.scatter_(1, dst, src.reshape(bs, L * N).to(dtype))
        return out[:, :N1].contiguous()

    tokens = place(tok, 0, torch.int64)
    tokens[:, 0] = root_tokens.to(torch.int64)
    parents = place(plab, -1, torch.int64)
    parents[:, 0] = -1
    depths = place(depth, 0, torch.int64)
    valid = place(sel, False, torch.bool)
    valid[:, 0] = True
    scores = place(score, float("-inf"), torch.float32)
    scores[:, 0] = 0.0
    ri, rnt, rns, tmask = build_tree_arrays(parents, valid, L)
    return DDTree(
        tokens=tokens,
        parents=parents,
        depths=depths,
        valid=valid,
        scores=scores,
        retrieve_index=ri,
        retrieve_next_token=rnt,
        retrieve_next_sibling=rns,
        tree_mask=tmask,
        num_nodes=num_nodes,
        budget=N,
        topk=K,
        max_depth=L,
    )


def tree_positions(tree: DDTree, prefix_lens: torch.Tensor) -> torch.Tensor:
    """Verify positions: prefix_lens[b] + depth of node j, flattened to [bs * N1] int64.

    prefix_lens: [bs] int (committed tokens before the root, i.e. the root's position).
    Padding nodes get the root's position. Write it into a static buffer with ``copy_`` under
    CUDA graphs.
    """
    pl = prefix_lens.to(device=tree.depths.device, dtype=torch.int64)
    return (pl[:, None] + tree.depths).reshape(-1)


def custom_mask_size(prefix_lens_sum: int, bs: int, n1: int) -> int:
    """Elements of SGLang's FULL_MASK ``custom_mask``: sum_b n1 * (prefix_len_b + n1)."""
    return prefix_lens_sum * n1 + bs * n1 * n1


def build_custom_mask(
    tree: DDTree,
    prefix_lens: torch.Tensor,
    prefix_lens_sum: Optional[int] = None,
    out: Optional[torch.Tensor] = None,
    use_triton: Optional[bool] = None,
) -> torch.Tensor:
    """SGLang 0.5.23's flat tree-verify ``custom_mask`` (TreeMaskMode.FULL_MASK layout).

    Request b owns ``N1 * (prefix_lens[b] + N1)`` consecutive bools starting at
    ``mask_indptr[b] = sum_{b' < b} N1 * (prefix_lens[b'] + N1)``: row j (query = node j) is
    ``prefix_lens[b]`` Trues (the committed prefix) followed by ``tree_mask[b, j, :]``. This is what
    ``eagle_utils.build_tree_kernel_efficient`` writes and what the triton/flashinfer backends read
    through ``mask_indptr``.

    Args:
      prefix_lens: [bs] int (on the tree's device).
      prefix_lens_sum: host int sum of prefix_lens (avoids a device->host sync); read from the
        tensor (a sync) if None and ``out`` is None.
      out: optional preallocated 1-D bool buffer at least that large; all of it is filled with
        True first (like SGLang's own fill), then the tree blocks are written.
    Returns:
      the flat bool mask (``out`` itself if given, else a new tensor of exactly the size).
    """
    dev = tree.tokens.device
    bs, N1 = tree.tokens.shape
    pl = prefix_lens.to(device=dev, dtype=torch.int64)
    if out is None:
        if prefix_lens_sum is None:
            prefix_lens_sum = int(pl.sum())  # host sync: pass prefix_lens_sum to avoid it
        out = torch.empty(custom_mask_size(prefix_lens_sum, bs, N1), dtype=torch.bool, device=dev)
    if use_triton is None:
        use_triton = dev.type == "cuda"
    if use_triton:
        from sglang.kernels.ops.speculative.ddtree_verify_inputs import custom_mask_triton

        custom_mask_triton(tree.tree_mask, pl, out)
        return out
    row_len = pl + N1  # [bs]
    start = torch.cumsum(N1 * row_len, 0) - N1 * row_len  # [bs]
    j = torch.arange(N1, device=dev)
    row_start = start[:, None] + j[None, :] * row_len[:, None]  # [bs, N1]
    out.fill_(True)  # prefix columns (and, first, the tree block too)
    col = torch.arange(N1, device=dev)
    idx = row_start[..., None] + pl[:, None, None] + col  # [bs, N1, N1]
    out.scatter_(0, idx.reshape(-1), tree.tree_mask.reshape(-1))
    return out
