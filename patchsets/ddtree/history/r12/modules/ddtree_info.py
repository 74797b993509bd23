"""DDTree verify input and the tensor logic of one DDTree verify step inside SGLang (0.5.21 - 0.5.23).

Installed as ``sglang/srt/speculative/ddtree_info.py`` by the ddtree patchset (revision 2). The
tree itself comes from the DDTree core (``ddtree_tree.build_ddtree``); this module turns it into
what SGLang's spec-v2 target verify consumes and turns the verify result back into what the
scheduler and the DFlash drafter consume:

* ``DDTreeSizes``: every width of a DDTree step, from the block size B and the node budget N —
  verify width N + 1, the KV window max(B, N + 1), the over-allocation reserve 2 x window, the
  output stride B (= L + 1, L = B - 1 the draft depth).
* ``vocab_parallel_topk``: per-position top-K of the draft logits when the target's LM head is
  sharded over tensor-parallel ranks — each rank takes its own top-K and log-sum-exp, ranks
  exchange (logit, global id) pairs and the lse (never the dense [bs, L, V] logits), and every
  rank merges them the same way, so every rank builds the same tree. Collectives are injectable.
* ``DDTreeVerifyInput``: the verify ``SpecInput`` (a ``DFlashVerifyInput`` carrying a tree
  ``custom_mask``, depth positions, ``retrieve_*`` arrays and ``draft_token_num = N + 1``).
* ``sglang_greedy_accept``: SGLang's ``verify_tree_greedy_func`` on our tree, returned in the
  core's ``Acceptance`` form (the two must agree; the core's ``greedy_accept`` is the default).
* ``kv_compaction_pairs``, ``accepted_hidden_rows``, ``commit_outputs``: moving the accepted
  path's KV to the front of the window, picking the ACCEPTED nodes' target hidden states in path
  order for the drafter, and the output rows with the stride the result processor reads.

Everything except ``DDTreeVerifyInput``'s SGLang methods is plain torch: fixed shapes, no
``.item()``/``.tolist()``/``.cpu()``, so it can sit inside a captured CUDA graph. SGLang is
imported lazily / behind a guard: with torch alone (unit tests) the helpers import and run, and
``DDTreeVerifyInput`` falls back to a field-compatible stand-in base (``SGLANG_AVAILABLE`` says
which one is in use).

Source of the algorithm: Ringel & Romano, "Accelerating Speculative Decoding with Block Diffusion
Draft Trees" (arXiv 2604.12989); SGLang 0.5.23's tree-verify conventions (``retrieve_*``,
FULL_MASK ``custom_mask``, accept_index of flat node rows) read from its wheel.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch

__all__ = [
    "SGLANG_AVAILABLE",
    "DDTreeSizes",
    "TopKCandidates",
    "local_topk_candidates",
    "merge_topk_candidates",
    "vocab_parallel_topk",
    "gather_topk_candidates",
    "topk_logprobs",
    "build_tree_from_logits",
    "build_tree_from_candidates",
    "write_verify_positions",
    "DDTreeVerifyInput",
    "TreeVerifyResult",
    "sglang_greedy_accept",
    "accept_index_to_sglang",
    "KVMovePlan",
    "kv_compaction_pairs",
    "accepted_hidden_rows",
    "draft_commit_positions",
    "CommitOutputs",
    "commit_outputs",
    "StepResult",
    "prepare_verify_tensors",
    "finish_verify_tensors",
    "DDTreeDraftInputV2",
    "make_ddtree_draft_input",
]

# ---------------------------------------------------------------------------------------------
# SGLang guard: the base class and the capture-mode enum come from SGLang when it imports.
# ---------------------------------------------------------------------------------------------
try:  # pragma: no cover - exercised only where SGLang's import-time deps are installed
    from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode as _CaptureHiddenMode
    from sglang.srt.speculative.dflash_info import DFlashVerifyInput as _VerifyBase

    SGLANG_AVAILABLE = True
except ImportError:  # torch-only environments (CI unit tests)
    SGLANG_AVAILABLE = False
    _CaptureHiddenMode = None

    @dataclass
    class _VerifyBase:  # type: ignore[no-redef]
        """Field-compatible stand-in for ``DFlashVerifyInput`` when SGLang cannot be imported.

        It carries the same fields (so the DDTree fields and constructors can be tested on a
        torch-only machine) but none of SGLang's methods: ``prepare_for_verify`` and
        ``generate_attn_arg_prefill`` exist only on the real base.
        """

        draft_token: Optional[torch.Tensor]
        positions: Optional[torch.Tensor]
        draft_token_num: int
        topk: int = 1
        custom_mask: Optional[torch.Tensor] = None
        capture_hidden_mode: Any = "FULL"
        num_tokens_per_req: int = -1
        ragged_verify_layout: Any = None
        live_seq_lens_cpu: Optional[torch.Tensor] = None
        candidate_max_seq_len_upper_bound: Optional[int] = None
        kv_loc_plan: Any = None
        kv_loc_cols: Any = None

        def __post_init__(self):
            if self.num_tokens_per_req == -1:
                self.num_tokens_per_req = int(self.draft_token_num)
            self.num_tokens_for_logprob_per_req = int(self.draft_token_num)


def _capture_mode(name: str) -> Any:
    return getattr(_CaptureHiddenMode, name) if _CaptureHiddenMode is not None else name


# ---------------------------------------------------------------------------------------------
# Sizes
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class DDTreeSizes:
    """Every width of a DDTree decode step, derived from the drafter's block and the budget.

    Fields:
      block_size: B, DFlash's ``speculative_num_draft_tokens`` — the drafter's block (root +
        B - 1 mask positions); the draft forward always runs B tokens per request.
      budget: N, draft nodes per tree (root not counted).
      topk: per-depth cap K (``topk >= budget`` is the paper's exact tree).
    Raises ValueError for B < 2, N < 1 or K < 1.
    """

    block_size: int
    budget: int
    topk: int

    def __post_init__(self):
        if self.block_size < 2:
            raise ValueError(f"DDTREE needs a draft block of >= 2 tokens, got block_size={self.block_size}")
        if self.budget < 1 or self.topk < 1:
            raise ValueError(f"DDTREE needs budget >= 1 and topk >= 1, got {self.budget}, {self.topk}")

    @property
    def draft_depth(self) -> int:
        """L = B - 1: the drafter's positions, the tree's maximum depth."""
        return self.block_size - 1

    @property
    def verify_width(self) -> int:
        """Tokens verified per request: N + 1 (root included)."""
        return self.budget + 1

    @property
    def accept_width(self) -> int:
        """Columns of an accept index: L + 1 (root and at most L accepted drafts)."""
        return self.block_size

    @property
    def window_width(self) -> int:
        """KV slots one step writes per request: max(B, N + 1) (draft block and verify)."""
        return max(self.block_size, self.budget + 1)

    @property
    def kv_reserve(self) -> int:
        """KV slots reserved ahead per request in ``prepare_for_decode``: B + max(B, N + 1).

        DFlash reserves 2 x B from the host's committed length, which lags one step under the
        overlap scheduler: B for the step in flight (it commits at most L + 1 = B tokens) plus B
        for the next step's window. DDTree commits at most B tokens too, but its next window is
        max(B, N + 1)."""
        return self.block_size + self.window_width

    @property
    def output_stride(self) -> int:
        """Row width of the flattened ``next_token_ids``: L + 1 >= any commit length."""
        return self.block_size

    @classmethod
    def from_spec(cls, spec: Any) -> "DDTreeSizes":
        """From SGLang's spec bag / ServerArgs (fields ``speculative_num_draft_tokens``,
        ``speculative_ddtree_budget``, ``speculative_ddtree_topk``; topk None = budget)."""
        block = int(spec.speculative_num_draft_tokens)
        budget = int(spec.speculative_ddtree_budget)
        topk = getattr(spec, "speculative_ddtree_topk", None)
        return cls(block, budget, budget if topk is None else int(topk))


# ---------------------------------------------------------------------------------------------
# Per-position top-K, tensor-parallel safe
# ---------------------------------------------------------------------------------------------
@dataclass
class TopKCandidates:
    """Per-position top-K under the core's tie rule (logit desc, token id asc).

      values [T, K] float32  the logits (upcast), non-increasing along K; -inf = no token
      ids    [T, K] int64    GLOBAL vocabulary ids
      lse    [T]    float32  log-sum-exp of the position's logits over the (whole) vocabulary
    """

    values: torch.Tensor
    ids: torch.Tensor
    lse: torch.Tensor


_ID_SENTINEL = (1 << 30) - 1  # padding id: sorts after every real id (< 2**30, see desc_key)


def local_topk_candidates(local_logits: torch.Tensor, vocab_start: int, k: int) -> TopKCandidates:
    """One rank's top-K candidates and its log-sum-exp.

    Args:
      local_logits: [T, V_local] bf16/fp16/fp32, this rank's contiguous vocabulary shard
        ``[vocab_start, vocab_start + V_local)`` WITHOUT shard padding rows (slice the LM head's
        ``weight[:num_org_elements]`` like DFlash does).
      vocab_start: global id of the shard's first column.
      k: K >= 1. A shard narrower than K is padded with (-inf, sentinel id).
    Returns:
      TopKCandidates with [T, K] values/ids (global ids) and the shard's lse [T].
    Selection follows the core's ``draft_topk`` (exact ties: the smallest ids win at the K-th
    value); the values are the logits themselves so that shards can be merged by logit.
    """
    from .ddtree_tree import draft_topk

    if local_logits.dim() != 2:
        raise ValueError(f"local_logits must be [T, V_local], got {tuple(local_logits.shape)}")
    T, V = local_logits.shape
    kk = min(int(k), V)
    _, idx, lse = draft_topk(local_logits.unsqueeze(0), kk, exact_ties=True)
    idx = idx[0]  # [T, kk] local ids in (logit desc, id asc) order
    vals = torch.gather(local_logits, 1, idx).float()
    ids = idx + int(vocab_start)
    if kk < k:
        pad = k - kk
        vals = torch.cat([vals, vals.new_full((T, pad), float("-inf"))], dim=1)
        ids = torch.cat([ids, ids.new_full((T, pad), _ID_SENTINEL)], dim=1)
    return TopKCandidates(vals, ids, lse[0])


def merge_topk_candidates(
    values: torch.Tensor, ids: torch.Tensor, lse: torch.Tensor, k: int
) -> TopKCandidates:
    """Merge the gathered candidates of R ranks into the global top-K.

    Args:
      values: [R, T, K] float32, ids: [R, T, K] int64 (global), lse: [R, T] float32 — rank r's
        ``local_topk_candidates`` stacked in rank order.
      k: K.
    Returns:
      TopKCandidates [T, K] in (logit desc, id asc) order and the global lse = logsumexp_r lse_r.
    Deterministic and identical on every rank that holds the same gathered tensors.
    """
    from .ddtree_tree import desc_key

    R, T, K = values.shape
    v = values.permute(1, 0, 2).reshape(T, R * K)
    i = ids.permute(1, 0, 2).reshape(T, R * K)
    real = i != _ID_SENTINEL
    key = desc_key(v, real & (v > float("-inf")), torch.where(real, i, _ID_SENTINEL))
    order = torch.argsort(key, dim=1)[:, :k]
    vals = torch.gather(v, 1, order)
    gids = torch.gather(i, 1, order)
    glse = torch.logsumexp(lse.float(), dim=0)
    return TopKCandidates(vals, gids, glse)


def vocab_parallel_topk(
    local_logits: torch.Tensor,
    vocab_start: int,
    k: int,
    *,
    world_size: int = 1,
    all_gather: Optional[Callable[[torch.Tensor], torch.Tensor]] = None,
) -> TopKCandidates:
    """Per-position top-K of logits whose vocabulary is split over tensor-parallel ranks.

    Args:
      local_logits: [T, V_local] this rank's shard (see ``local_topk_candidates``).
      vocab_start: global id of the shard's first column.
      k: K.
      world_size, all_gather: see ``gather_topk_candidates``.
    Returns:
      TopKCandidates [T, K], the same on every rank, equal to the single-rank dense result
      (ids and values exactly; lse up to floating-point summation order).
    """
    local = local_topk_candidates(local_logits, vocab_start, k)
    return gather_topk_candidates(local, k, world_size=world_size, all_gather=all_gather)


def gather_topk_candidates(
    local: TopKCandidates,
    k: int,
    *,
    world_size: int = 1,
    all_gather: Optional[Callable[[torch.Tensor], torch.Tensor]] = None,
) -> TopKCandidates:
    """Exchange every rank's local candidates and merge them (identically on every rank).

    Args:
      local: this rank's ``local_topk_candidates`` ([T, K]); k: K.
      world_size: number of ranks R (1: ``local`` is returned as is).
      all_gather: ``f(x [*s]) -> [R, *s]`` gathering ``x`` from every rank in rank order (for
        SGLang: ``tp_group.all_gather_into_tensor``). Two calls per step (fp32 [T, K + 1]
        values + lse, int64 [T, K] ids) — never the dense logits.
    Raises ValueError when world_size > 1 without all_gather, or when it returns another rank
    count.
    """
    if world_size == 1:
        return local
    if all_gather is None:
        raise ValueError("vocab_parallel_topk: world_size > 1 needs an all_gather function")
    packed = torch.cat([local.values, local.lse[:, None]], dim=1).contiguous()  # [T, K+1]
    g_f = all_gather(packed)  # [R, T, K+1]
    g_i = all_gather(local.ids.contiguous())  # [R, T, K]
    if g_f.shape[0] != world_size or g_i.shape[0] != world_size:
        raise ValueError(
            f"all_gather returned {g_f.shape[0]}/{g_i.shape[0]} ranks, expected world_size={world_size}"
        )
    return merge_topk_candidates(g_f[:, :, :k], g_i, g_f[:, :, k], k)


def topk_logprobs(c: TopKCandidates) -> torch.Tensor:
    """The core's per-depth log-probs from candidates: min(logit - lse, 0), float32 [T, K]."""
    return torch.clamp(c.values - c.lse[:, None], max=0.0)


def build_tree_from_logits(
    draft_logits: torch.Tensor,
    root_tokens: torch.Tensor,
    sizes: DDTreeSizes,
    request_budget: Optional[torch.Tensor] = None,
):
    """Single-rank path: the core's ``build_ddtree`` on dense draft logits [bs, L, V]."""
    from .ddtree_tree import build_ddtree

    return build_ddtree(draft_logits, root_tokens, sizes.budget, sizes.topk, request_budget=request_budget)


def build_tree_from_candidates(
    cands: TopKCandidates,
    root_tokens: torch.Tensor,
    sizes: DDTreeSizes,
    request_budget: Optional[torch.Tensor] = None,
):
    """Tensor-parallel path: the tree from merged candidates ([bs * L, K] rows, depth-major per
    request), through the core's ``build_ddtree_from_topk(lp [bs, L, K], ids [bs, L, K],
    root_tokens, budget, request_budget=None)`` — no dense logits are gathered.
    """
    from .ddtree_tree import build_ddtree_from_topk as fn

    bs = root_tokens.shape[0]
    L = sizes.draft_depth
    lp = topk_logprobs(cands).view(bs, L, -1)
    ids = cands.ids.view(bs, L, -1)
    return fn(lp, ids, root_tokens, sizes.budget, request_budget=request_budget)


# ---------------------------------------------------------------------------------------------
# Verify input
# ---------------------------------------------------------------------------------------------
def write_verify_positions(tree, prefix_lens: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """Depth positions, written in place: out[b * N1 + j] = prefix_lens[b] + depth[b, j].

    Args:
      tree: a core ``DDTree`` ([bs, N1] depths; root and padding depth 0).
      prefix_lens: [bs] int, committed tokens before the root (the root's position).
      out: 1-D int64 buffer with at least bs * N1 elements (the static positions buffer).
    Returns:
      the written view out[: bs * N1] (same storage: replays of a captured graph see new values).
    """
    bs, N1 = tree.depths.shape
    if out.dim() != 1 or out.numel() < bs * N1 or out.dtype != torch.int64:
        raise ValueError(
            f"positions buffer must be 1-D int64 with >= bs * N1 = {bs} * {N1} = {bs * N1} "
            f"elements, got {tuple(out.shape)} {out.dtype}"
        )
    view = out[: bs * N1]
    torch.add(prefix_lens.to(torch.int64)[:, None], tree.depths, out=view.view(bs, N1))
    return view


@dataclass
class DDTreeVerifyInput(_VerifyBase):
    """Target-verify input of one DDTree step (``ForwardMode.TARGET_VERIFY``).

    A ``DFlashVerifyInput`` (spec_input_type ``DFLASH_VERIFY``, so every backend branch that
    takes DFlash's verify — ``generate_attn_arg_prefill``, the triton/flashinfer metadata paths
    — takes this one) that carries a tree instead of a chain:

      draft_token    [bs * N1] int64   tree tokens, root first per request
      positions      [bs * N1] int64   prefix + depth (a view of a static buffer)
      custom_mask    flat bool         FULL_MASK layout (see ``ddtree_tree.build_custom_mask``);
                                       never None for a target verify, at capture too
      retrieve_index / retrieve_next_token / retrieve_next_sibling  [bs, N1] int64
      draft_token_num = N1 = budget + 1
      topk           stays 1: it is read only by backends gated on ``topk > 1`` (EAGLE's
                     flashinfer host plan); the tree is described by the mask, and backends that
                     would verify a chain from the server's ``speculative_eagle_topk`` are refused
                     by ``DDTreeWorker`` instead.
    """

    retrieve_index: Optional[torch.Tensor] = None
    retrieve_next_token: Optional[torch.Tensor] = None
    retrieve_next_sibling: Optional[torch.Tensor] = None
    budget: int = 0
    max_depth: int = 0

    def __post_init__(self):
        super().__post_init__()
        if self.budget and int(self.draft_token_num) != self.budget + 1:
            raise ValueError(
                f"DDTreeVerifyInput: draft_token_num must be budget + 1 = {self.budget} + 1, "
                f"got {self.draft_token_num}"
            )

    # EagleVerifyInput's tree-shape properties, for code that asks a verify input about its tree.
    @property
    def max_tree_depth(self) -> int:
        """Longest root-to-leaf chain incl. the root: L + 1 (the accept_index width)."""
        return self.max_depth + 1

    @property
    def tree_topk(self) -> int:
        """-1: an irregular tree (no fixed branching per level)."""
        return -1

    @classmethod
    def from_tree(
        cls,
        tree,
        prefix_lens: torch.Tensor,
        *,
        positions_out: torch.Tensor,
        custom_mask_out: Optional[torch.Tensor] = None,
        prefix_lens_sum: Optional[int] = None,
        kv_loc_plan: Any = None,
        kv_loc_cols: Any = None,
        use_triton: Optional[bool] = None,
    ) -> "DDTreeVerifyInput":
        """Build the verify input of a tree: positions into ``positions_out`` (in place), the
        FULL_MASK custom mask into ``custom_mask_out`` (or a new tensor), and the retrieve arrays.

        Args:
          tree: core ``DDTree``; prefix_lens: [bs] committed lengths (device).
          positions_out: static 1-D int64 buffer (>= bs * N1).
          custom_mask_out: optional 1-D bool buffer >= ``custom_mask_size``; its used prefix is
            returned as ``custom_mask``.
          prefix_lens_sum: host upper bound of sum(prefix_lens) (no device->host sync); needed
            when ``custom_mask_out`` is given or to size a new mask without a sync.
          kv_loc_plan, kv_loc_cols: the step's ``KVLocPlan`` and the verify's columns of it
            (SGLang 0.5.22 on); None leaves the base's fields at their defaults (0.5.21 has none).
        """
        from .ddtree_tree import build_custom_mask, custom_mask_size

        bs, N1 = tree.tokens.shape
        positions = write_verify_positions(tree, prefix_lens, positions_out)
        mask = None
        if custom_mask_out is not None:
            if prefix_lens_sum is None:
                raise ValueError("from_tree: custom_mask_out needs the host prefix_lens_sum bound")
            size = custom_mask_size(int(prefix_lens_sum), bs, N1)
            if custom_mask_out.numel() < size:
                raise ValueError(
                    f"custom mask buffer holds {custom_mask_out.numel()} elements, the batch needs "
                    f"{prefix_lens_sum} * {N1} + {bs} * {N1}^2 = {size}"
                )
            mask = build_custom_mask(tree, prefix_lens, out=custom_mask_out[:size], use_triton=use_triton)
        else:
            mask = build_custom_mask(tree, prefix_lens, prefix_lens_sum=prefix_lens_sum, use_triton=use_triton)
        # SGLang 0.5.21's DFlashVerifyInput has no KV-location plan fields (no plans there)
        planned = {} if kv_loc_plan is None else {"kv_loc_plan": kv_loc_plan, "kv_loc_cols": kv_loc_cols}
        return cls(
            draft_token=tree.tokens.reshape(-1),
            positions=positions,
            draft_token_num=N1,
            custom_mask=mask,
            capture_hidden_mode=_capture_mode("FULL"),
            **planned,
            retrieve_index=tree.retrieve_index,
            retrieve_next_token=tree.retrieve_next_token,
            retrieve_next_sibling=tree.retrieve_next_sibling,
            budget=N1 - 1,
            max_depth=int(tree.max_depth),
        )

    @classmethod
    def create_capture_input(
        cls, custom_mask: Optional[torch.Tensor], num_tokens_per_req: int, is_draft_worker: bool
    ) -> Any:
        """The dummy verify input a CUDA-graph capture (or warm-up) of a DDTREE runner uses.

        Target runner: width N1 and the runner's own mask buffer, so the captured attention
        metadata has a custom mask (a graph captured without one ignores the tree mask on
        replay). Draft runner: DFlash's block verify, unchanged (no mask, no hidden capture).
        Raises ValueError for a target capture without a mask buffer.
        """
        if is_draft_worker:
            return _VerifyBase(
                draft_token=None,
                positions=None,
                draft_token_num=int(num_tokens_per_req),
                custom_mask=None,
                capture_hidden_mode=_capture_mode("NULL"),
            )
        if custom_mask is None:
            raise ValueError("DDTREE target verify must be captured with a custom_mask buffer")
        return cls(
            draft_token=None,
            positions=None,
            draft_token_num=int(num_tokens_per_req),
            custom_mask=custom_mask,
            capture_hidden_mode=_capture_mode("FULL"),
            budget=int(num_tokens_per_req) - 1,
        )

    @classmethod
    def create_idle_input(cls, device: torch.device | str, num_tokens_per_req: int) -> "DDTreeVerifyInput":
        """An empty verify input (an idle DP rank's verify forward)."""
        return cls(
            draft_token=torch.empty((0,), dtype=torch.long, device=device),
            positions=torch.empty((0,), dtype=torch.int64, device=device),
            draft_token_num=int(num_tokens_per_req),
            custom_mask=torch.empty((0,), dtype=torch.bool, device=device),
            capture_hidden_mode=_capture_mode("FULL"),
            budget=int(num_tokens_per_req) - 1,
        )


# ---------------------------------------------------------------------------------------------
# Acceptance through SGLang's kernel
# ---------------------------------------------------------------------------------------------
@dataclass
class TreeVerifyResult:
    """Acceptance in both conventions.

      acceptance          core ``Acceptance`` (local labels, int64)
      accept_index_flat   [bs, L+1] int32  SGLang's: flat verify rows b * N1 + label, -1 padded
      predicts            [bs * N1] int32  SGLang's: the target's pick written at accepted rows
                                           (and the bonus at the last one); other rows undefined
    """

    acceptance: Any
    accept_index_flat: torch.Tensor
    predicts: torch.Tensor


def _default_verify_fn():
    try:  # SGLang 0.5.23
        from sglang.kernels.ops.speculative.spec_tree import verify_tree_greedy_func
    except ImportError:  # SGLang 0.5.22 keeps it beside EAGLE's utilities
        from sglang.srt.speculative.eagle_utils import verify_tree_greedy_func

    return verify_tree_greedy_func


def sglang_greedy_accept(
    tree, target_predict: torch.Tensor, verify_fn: Optional[Callable[..., Any]] = None
) -> TreeVerifyResult:
    """SGLang's greedy tree verify on a DDTree, converted to the core's ``Acceptance``.

    Args:
      tree: core ``DDTree``.
      target_predict: [bs, N1] int, the target's argmax after each node.
      verify_fn: SGLang's ``verify_tree_greedy_func`` signature (keyword arguments predicts,
        accept_index, accept_token_num, candidates, retrieve_index, retrieve_next_token,
        retrieve_next_sibling, target_predict); default: imported from SGLang
        (``sglang.kernels.ops.speculative.spec_tree`` in 0.5.23, ``sglang.srt.speculative.eagle_utils``
        in 0.5.22). ``verify_tree_greedy_triton`` fits too.
    Dtypes follow the JIT CUDA kernel's checks (tree.cuh): candidates/retrieve_*/target_predict
    int64 [bs, N1]; accept_index int32 [bs, L+1] (pre-filled -1); accept_token_num int32 [bs];
    predicts int32 [bs * N1].
    """
    from .ddtree_accept import Acceptance

    bs, N1 = tree.tokens.shape
    if target_predict.shape != (bs, N1):
        raise ValueError(f"target_predict must be [bs, N1] = [{bs}, {N1}], got {tuple(target_predict.shape)}")
    dev = tree.tokens.device
    L1 = int(tree.max_depth) + 1
    predicts = torch.zeros((bs * N1,), dtype=torch.int32, device=dev)
    accept_index = torch.full((bs, L1), -1, dtype=torch.int32, device=dev)
    accept_num = torch.zeros((bs,), dtype=torch.int32, device=dev)
    tp = target_predict.to(torch.int64).contiguous()
    fn = verify_fn or _default_verify_fn()
    fn(
        predicts=predicts,
        accept_index=accept_index,
        accept_token_num=accept_num,
        candidates=tree.tokens.contiguous(),
        retrieve_index=tree.retrieve_index.contiguous(),
        retrieve_next_token=tree.retrieve_next_token.contiguous(),
        retrieve_next_sibling=tree.retrieve_next_sibling.contiguous(),
        target_predict=tp,
    )
    base = torch.arange(bs, device=dev)[:, None] * N1
    flat = accept_index.to(torch.int64)
    local = torch.where(flat >= 0, flat - base, -1)
    length = accept_num.to(torch.int64)
    last = torch.gather(local, 1, length[:, None]).clamp(min=0)
    bonus = torch.gather(tp, 1, last).squeeze(1)
    return TreeVerifyResult(Acceptance(local, length, bonus), accept_index, predicts)


def accept_index_to_sglang(acc, num_verify_tokens: int) -> torch.Tensor:
    """The core's local accept_index [bs, L+1] as SGLang's flat rows (b * N1 + label, -1 kept),
    int32 — what ``compute_spec_logprobs(..., accept_index=)`` and the hidden-state/KV helpers
    of EAGLE read."""
    ai = acc.accept_index
    bs = ai.shape[0]
    base = torch.arange(bs, device=ai.device)[:, None] * int(num_verify_tokens)
    return torch.where(ai >= 0, ai + base, -1).to(torch.int32)


# ---------------------------------------------------------------------------------------------
# After acceptance: KV compaction, hidden states for the drafter, output rows
# ---------------------------------------------------------------------------------------------
@dataclass
class KVMovePlan:
    """Target-KV moves that put the accepted path at the front of each request's window.

      tgt_loc [bs * (L+1)] int64  destination slots (pool ids), pairs in path order per request
      src_loc [bs * (L+1)] int64  source slots
      moved   [bs, L+1]    bool   the pair really moves a row (src != tgt, on the path)
      contiguous [bs]      bool   nothing moves for this request (its path is 0, 1, ..., a)
    Pairs that do not move are redirected to ``dummy_loc`` -> ``dummy_loc`` (SGLang's pool slot 0
    is the padding slot every pool keeps for dummy writes), so the pair count stays static.
    Pairs of one request are in path order: a pair reads slot window[a_j] with a_j >= j and
    writes window[j]; every later write to window[a_j] belongs to pair a_j > j, so a move that
    reads all sources of a chunk before writing (SGLang's tiled copy, or index_put) and processes
    chunks in order never reads an overwritten row.
    """

    tgt_loc: torch.Tensor
    src_loc: torch.Tensor
    moved: torch.Tensor
    contiguous: torch.Tensor


def kv_compaction_pairs(acc, window_loc: torch.Tensor, dummy_loc: int = 0) -> KVMovePlan:
    """Move pairs for the accepted path's KV (EAGLE's tree compaction, for DDTree labels).

    Args:
      acc: core ``Acceptance`` ([bs, L+1] local labels, root first, -1 padded).
      window_loc: [bs, W] int64 pool slot of each verify-window position (W >= N1; column j =
        the slot node j's KV was written to).
      dummy_loc: slot used for no-op pairs.
    Returns:
      KVMovePlan (static shapes; feed ``tgt_loc``/``src_loc`` to ``kvcache.move_kv_cache``).
    """
    ai = acc.accept_index
    bs, L1 = ai.shape
    if window_loc.dim() != 2 or window_loc.shape[0] != bs:
        raise ValueError(f"window_loc must be [bs, W] with bs = {bs}, got {tuple(window_loc.shape)}")
    on_path = ai >= 0
    steps = torch.arange(L1, device=ai.device)[None, :].expand(bs, L1)
    win = window_loc.to(torch.int64)
    src = torch.gather(win, 1, ai.clamp(min=0))
    tgt = torch.gather(win, 1, steps.clamp(max=win.shape[1] - 1))
    moved = on_path & (src != tgt)
    src = torch.where(moved, src, dummy_loc)
    tgt = torch.where(moved, tgt, dummy_loc)
    return KVMovePlan(tgt.reshape(-1), src.reshape(-1), moved, ~moved.any(-1))


def accepted_hidden_rows(acc, num_verify_tokens: int, width: int) -> torch.Tensor:
    """Row indices (into the verify batch's [bs * N1, H] hidden states) of the ACCEPTED nodes in
    path order, root first, padded to ``width`` columns with the request's root row.

    Args:
      acc: core ``Acceptance``; num_verify_tokens: N1; width: W >= L + 1 (the drafter's block).
    Returns:
      [bs, W] int64. ``hidden[rows.reshape(-1)]`` is the drafter's context for the committed
      tokens; only the first ``accept_length + 1`` rows of each request are committed (the
      prefix-valid KV writer ignores the rest).
    """
    ai = acc.accept_index
    bs, L1 = ai.shape
    if width < L1:
        raise ValueError(f"width must be >= L + 1 = {L1}, got {width}")
    base = torch.arange(bs, device=ai.device)[:, None] * int(num_verify_tokens)
    rows = base + ai.clamp(min=0)
    if width > L1:
        rows = torch.cat([rows, base.expand(bs, width - L1)], dim=1)
    return rows.contiguous()


def draft_commit_positions(prefix_lens: torch.Tensor, width: int) -> torch.Tensor:
    """Positions of the committed tokens after compaction: prefix_lens[b] + j, [bs * W] int64
    (path position j holds the node of depth j)."""
    ar = torch.arange(int(width), device=prefix_lens.device, dtype=torch.int64)
    return (prefix_lens.to(torch.int64)[:, None] + ar[None, :]).reshape(-1)


@dataclass
class CommitOutputs:
    """What a DDTree step hands the scheduler (DFlash's layout, one row per request).

      out_tokens   [bs, S] int64  accepted draft tokens in path order, then the bonus; 0 after
      commit_lens  [bs] int32     accept_length + 1 (tokens committed = KV entries kept)
      new_seq_lens [bs] int64     prefix_lens + commit_lens
    ``out_tokens.reshape(-1)`` is ``next_token_ids``; ``S`` goes to the result's
    ``speculative_output_stride`` (the processor reads row b at b * S, ``commit_lens[b]`` long).
    """

    out_tokens: torch.Tensor
    commit_lens: torch.Tensor
    new_seq_lens: torch.Tensor


def commit_outputs(tree, acc, prefix_lens: torch.Tensor, stride: int) -> CommitOutputs:
    """Lay the accepted path and bonus out for the result processor.

    Args:
      tree: core ``DDTree``; acc: its ``Acceptance``; prefix_lens: [bs] committed lengths.
      stride: S >= L + 1 (``DDTreeSizes.output_stride``).
    """
    ai = acc.accept_index
    bs, L1 = ai.shape
    if stride < L1:
        raise ValueError(f"stride must be >= L + 1 = {L1}, got {stride}")
    drafts = torch.gather(tree.tokens, 1, ai[:, 1:].clamp(min=0))  # [bs, L]
    out = torch.zeros((bs, int(stride)), dtype=torch.int64, device=ai.device)
    out[:, : L1 - 1] = torch.where(ai[:, 1:] >= 0, drafts, 0)
    out.scatter_(1, acc.accept_length.to(torch.int64)[:, None], acc.bonus_token.to(torch.int64)[:, None])
    commit = (acc.accept_length + 1).to(torch.int32)
    return CommitOutputs(out, commit, prefix_lens.to(torch.int64) + commit.to(torch.int64))


# ---------------------------------------------------------------------------------------------
# The decode step's tensor pipeline (what DDTreeWorker runs around the target forward)
# ---------------------------------------------------------------------------------------------
@dataclass
class StepResult:
    """Everything a DDTree step derives from one target verify (all fixed-shape tensors).

      acceptance         core ``Acceptance``
      accept_index_flat  [bs, L+1] int32  SGLang's flat accept rows (logprobs, EAGLE helpers)
      outputs            ``CommitOutputs`` (next_token_ids rows, commit_lens, new_seq_lens)
      kv_moves           ``KVMovePlan`` for the target pool
      hidden_rows        [bs, B] int64 rows of the verify hidden states for the drafter
      draft_positions    [bs * B] int64 positions of those rows (prefix + path position)
    """

    acceptance: Any
    accept_index_flat: torch.Tensor
    outputs: CommitOutputs
    kv_moves: KVMovePlan
    hidden_rows: torch.Tensor
    draft_positions: torch.Tensor


def prepare_verify_tensors(
    tree,
    prefix_lens: torch.Tensor,
    *,
    positions_out: torch.Tensor,
    custom_mask_out: Optional[torch.Tensor],
    prefix_lens_sum: int,
    kv_loc_plan: Any = None,
    kv_loc_cols: Any = None,
) -> DDTreeVerifyInput:
    """Tree -> verify input (positions written in place, FULL mask into ``custom_mask_out``).

    Fixed shapes for a fixed (bs, N, host ``prefix_lens_sum`` bound): capturable in a CUDA graph
    when ``custom_mask_out`` is a static buffer and the bound is held fixed.
    """
    return DDTreeVerifyInput.from_tree(
        tree,
        prefix_lens,
        positions_out=positions_out,
        custom_mask_out=custom_mask_out,
        prefix_lens_sum=prefix_lens_sum,
        kv_loc_plan=kv_loc_plan,
        kv_loc_cols=kv_loc_cols,
    )


def finish_verify_tensors(
    tree,
    target_choice: torch.Tensor,
    prefix_lens: torch.Tensor,
    window_loc: torch.Tensor,
    sizes: DDTreeSizes,
    *,
    verify_fn: Optional[Callable[..., Any]] = None,
    dummy_loc: int = 0,
) -> StepResult:
    """Acceptance and everything after it, for one step.

    Args:
      tree: the verified core ``DDTree``.
      target_choice: [bs, N1] int64, the target's argmax (T = 0) or per-node draw (T > 0).
      prefix_lens: [bs] committed lengths before the step.
      window_loc: [bs, >= N1] int64 target-pool slots of the verify window.
      sizes: the step's ``DDTreeSizes``.
      verify_fn: None -> the core's ``greedy_accept`` walk; else SGLang's
        ``verify_tree_greedy_func`` (see ``sglang_greedy_accept``) — they accept the same path.
    """
    from .ddtree_accept import greedy_accept

    N1 = sizes.verify_width
    if verify_fn is None:
        acc = greedy_accept(tree, target_choice)
        flat = accept_index_to_sglang(acc, N1)
    else:
        res = sglang_greedy_accept(tree, target_choice, verify_fn=verify_fn)
        acc, flat = res.acceptance, res.accept_index_flat
    outputs = commit_outputs(tree, acc, prefix_lens, sizes.output_stride)
    moves = kv_compaction_pairs(acc, window_loc, dummy_loc=dummy_loc)
    rows = accepted_hidden_rows(acc, N1, sizes.block_size)
    positions = draft_commit_positions(prefix_lens, sizes.block_size)
    return StepResult(acc, flat, outputs, moves, rows, positions)


# ---------------------------------------------------------------------------------------------
# Draft state carried between steps (SGLang only)
# ---------------------------------------------------------------------------------------------
DDTreeDraftInputV2: Any = None
if SGLANG_AVAILABLE:  # pragma: no cover - needs SGLang's import-time deps
    try:
        from sglang.srt.speculative.dflash_info_v2 import DFlashDraftInputV2 as _DraftBase
    except ImportError:  # pragma: no cover
        _DraftBase = None

    if _DraftBase is not None:

        @dataclass
        class DDTreeDraftInputV2(_DraftBase):  # type: ignore[no-redef]
            """DFlash's spec-v2 draft state with DDTree's KV reservation.

            ``prepare_for_decode`` reserves ``decode_reserve_tokens(block)`` slots ahead per
            request; revision 2 of the patchset turns DFlash's literal ``2 * block_size`` into
            that method, and DDTree answers ``DDTreeSizes.kv_reserve`` = B + max(B, N + 1).
            """

            def decode_reserve_tokens(self, block_size: int) -> int:
                from sglang.srt.runtime_context import get_spec

                sizes = DDTreeSizes.from_spec(get_spec())
                if int(block_size) != sizes.block_size:
                    raise ValueError(
                        f"DDTREE block size changed under the draft input: {block_size} != {sizes.block_size}"
                    )
                return sizes.kv_reserve


def make_ddtree_draft_input(*, bonus_tokens: torch.Tensor, new_seq_lens: torch.Tensor):
    """A ``DDTreeDraftInputV2`` like DFlash's ``make_draft_input_v2`` (SGLang only).

    Raises RuntimeError where SGLang's draft input cannot be imported.
    """
    if DDTreeDraftInputV2 is None:
        raise RuntimeError("DDTreeDraftInputV2 needs SGLang (sglang.srt.speculative.dflash_info_v2)")
    bs = int(new_seq_lens.numel())
    device = bonus_tokens.device
    return DDTreeDraftInputV2(
        topk_p=torch.empty((bs, 0), device=device, dtype=torch.float32),
        topk_index=torch.empty((bs, 0), device=device, dtype=torch.int64),
        bonus_tokens=bonus_tokens.to(dtype=torch.int64),
        new_seq_lens=new_seq_lens.to(dtype=torch.int64),
        hidden_states=torch.empty((bs, 0), device=device, dtype=torch.float16),
    )
