"""DDTreeWorker: DDTree speculative decoding on SGLang's DFlash spec-v2 worker (0.5.21 - 0.5.23).

Installed as ``sglang/srt/speculative/ddtree_worker.py`` by the ddtree patchset (revision 4);
``SpeculativeAlgorithm.create_worker`` returns ``DDTreeWorker`` for ``DDTREE``.

What it keeps from ``DFlashWorkerV2`` (inherited, unchanged): construction of the DFlash draft
runner and its CUDA graphs, target prefill with aux hidden-state capture and the prompt's draft-KV
materialisation, the idle path, and the draft-KV hand-off writer
(``_append_target_hidden_to_draft_kv_by_loc``). What it replaces: the decode step after the
draft forward. Per step and request (B = block size, L = B - 1, N = budget, N1 = N + 1,
W = max(B, N1)):

1. window: W reserved KV slots after the committed prefix (``DDTreeDraftInputV2`` reserves
   B + W ahead); one ``KVLocPlan`` over them where SGLang plans KV locations (0.5.22 on; 0.5.21
   writes the window's ``req_to_token`` slots directly, as its DFlash step does); the draft block
   writes columns [0, B), the verify columns [0, N1).
2. draft: DFlash's block forward ([bonus, MASK x L]); its hidden states at positions 1..L go
   through the target's LM head (per TP rank: its vocabulary shard) to per-depth top-K
   (``ddtree_info.vocab_parallel_topk``) and the DDTree core builds the tree.
3. verify: ``DDTreeVerifyInput`` (N1 tokens, depth positions in a static buffer, FULL_MASK tree
   mask) through ``DFlashVerifyInput.prepare_for_verify`` and the target forward.
4. accept: target argmax (or one draw per node at T > 0), broadcast from TP rank 0 like DFlash,
   then the greedy walk (the core's, or SGLang's ``verify_tree_greedy_func``: same result).
5. commit: the accepted path's target KV moved to the window front (no-op pairs when
   contiguous), the ACCEPTED nodes' hidden states in path order into the draft KV, outputs laid
   out [bs, B] with ``speculative_output_stride = B``.

Budget by batch (``--speculative-ddtree-budget-schedule``, ``ddtree_budget.py``): each decode step
takes its budget from the running batch size; where the schedule says ``chain`` the step is
DFlash's own (inherited ``forward_batch_generation``), so that batch size costs what DFLASH costs.
Each narrower tree budget the schedule (or ``auto``) can give verifies on a target attention
backend of its own, built for its width, and — where the server captures CUDA graphs — on decode
graphs captured at that width, narrowest first within --speculative-ddtree-graph-memory GiB
(``VerifyWidthState``, swapped in around the verify as SGLang's adaptive EAGLE swaps its
``SpecRuntimeState``); a width over the bound, and a chain step, verifies eagerly.
With ``auto`` the budget of each step comes from ``AutoBudgetPlanner``, fed by this worker: the
host time between consecutive decode steps (the previous step's cost; a prefill or idle call in
between voids the interval) and the tokens each step committed per request (its result's
``accept_lens`` once the scheduler has copied them to the host: no device sync here).

Refused at start-up (ValueError, naming the way out). SGLang 0.5.23 builds this worker before the
memory pools, the attention backends and the CUDA graphs (``Scheduler.init_model_worker``), so each
check runs where what it reads exists. At construction: DP attention, drafts whose proposals are
not per-position distributions of the target LM head (selector, LiLiCorr, Domino), quantised or
LoRA-extended LM heads, and missing revision-2 hooks. In ``init_attention_backends``: target verify
backends other than triton / flashinfer (the rest decide "tree or chain" from
``speculative_eagle_topk`` = 1 and would verify a chain) and triton's chain-only split-KV verify
kernels. In ``init_cuda_graphs``: target decode graphs captured at another width than budget + 1.
Hybrid recurrent targets stay behind revision 1's ``--speculative-ddtree-allow-hybrid-unsafe`` gate.

The worker follows the DFlashWorkerV2 it runs on by feature detection, never by version string:
the draft TP scope (0.5.23: a draft parallel layout; 0.5.22: a bool; 0.5.21: the worker's own
``draft_tp_context`` taking the draft group), KV-location plans (0.5.22 on), the deferred
verify-logits gather (0.5.23), DP attention's name (``attn_dp_enabled`` / ``enable_dp_attention``),
the compact draft's host bound (0.5.21 passes the device lengths) and the T > 0 target probs
(``build_speculative_verify_target_probs``, 0.5.21's ``build_dflash_verify_target_probs``).

The pure checks and the draft-head top-K below import with torch alone (CPU unit tests); the
worker class needs SGLang. Revision 3 runs inside a live SGLang 0.5.23 server on the CPU (the
project's ``tests/live/``: greedy tokens equal the target's); what only a GPU host can prove is
listed in the patchset README.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import inspect
import logging
import time
from dataclasses import dataclass
from typing import Any, Callable, Deque, Dict, Iterator, List, Optional, Tuple

import torch

from .ddtree_budget import (
    CHAIN,
    AutoBudgetPlanner,
    BudgetSchedule,
    GraphWidthPlan,
    batch_bucket,
    is_auto,
    load_schedule,
    plan_graph_widths,
)
from .ddtree_info import (
    DDTreeSizes,
    TopKCandidates,
    build_tree_from_candidates,
    build_tree_from_logits,
    finish_verify_tensors,
    gather_topk_candidates,
    local_topk_candidates,
    make_ddtree_draft_input,
    prepare_verify_tensors,
)

logger = logging.getLogger(__name__)

__all__ = [
    "SUPPORTED_VERIFY_BACKENDS",
    "SGLANG_WORKER_AVAILABLE",
    "attn_dp_enabled",
    "check_verify_backend",
    "check_parallel_layout",
    "check_draft_head",
    "check_lm_head",
    "check_captured_verify_width",
    "check_widths_beside_graphs",
    "replays_only_its_width",
    "VerifyWidthState",
    "build_verify_width_state",
    "draft_head_topk",
    "draft_head_logits",
    "DDTreeWorker",
]

# Target attention backends (class name -> --attention-backend name) whose TARGET_VERIFY path
# reads ``spec_info.custom_mask`` whatever ``speculative_eagle_topk`` says.
SUPPORTED_VERIFY_BACKENDS = {"TritonAttnBackend": "triton", "FlashInferAttnBackend": "flashinfer"}


def check_verify_backend(backend_name: str, *, chain_only_kernel: bool = False) -> None:
    """Refuse a target verify backend that would silently verify a chain.

    Args:
      backend_name: class name of the backend that runs TARGET_VERIFY (wrappers resolved).
      chain_only_kernel: the backend picked a verify kernel that is exact only for a causal
        chain (triton's split-KV / shared-KV verify on gfx95, enabled by
        SGLANG_ENABLE_SPLITKV_VERIFY when speculative_eagle_topk == 1).
    Raises:
      ValueError naming the supported backends.
    """
    supported = " or ".join(f"--attention-backend {v}" for v in SUPPORTED_VERIFY_BACKENDS.values())
    if backend_name not in SUPPORTED_VERIFY_BACKENDS:
        raise ValueError(
            f"DDTREE cannot verify a draft tree with the {backend_name} target attention backend: "
            "it decides tree or chain from speculative_eagle_topk (1 for DDTREE, as for DFLASH) "
            f"and would verify a chain. Serve with {supported} (their verify reads the tree's "
            "custom_mask)."
        )
    if chain_only_kernel:
        raise ValueError(
            f"DDTREE cannot use {backend_name}'s split-KV/shared-KV verify kernel: it is exact "
            "only for a causal chain. Unset SGLANG_ENABLE_SPLITKV_VERIFY."
        )


def check_parallel_layout(*, attn_dp_enabled: bool) -> None:
    """Refuse DP attention (an idle DP rank's verify width must match the active ranks' N + 1,
    which this revision does not arrange). Raises ValueError."""
    if attn_dp_enabled:
        raise ValueError(
            "DDTREE does not support data-parallel attention yet (--enable-dp-attention); "
            "serve without it or with --speculative-algorithm DFLASH."
        )


def check_draft_head(*, has_selector: bool, has_lilicorr: bool, is_domino: bool) -> None:
    """DDTree needs the drafter's per-position distributions over the target's LM head; drafts
    that propose through their own heads (selector, LiLiCorr, Domino rollout) give no such
    distribution. Raises ValueError."""
    kinds = [n for n, on in (("selector", has_selector), ("LiLiCorr", has_lilicorr), ("Domino", is_domino)) if on]
    if kinds:
        raise ValueError(
            f"DDTREE needs a plain DFlash draft (per-position distributions through the target "
            f"LM head); this draft model has a {' / '.join(kinds)} head. Use "
            "--speculative-algorithm DFLASH with this draft."
        )


def check_lm_head(weight: Any, *, num_added: int, tp_size: int, has_from_topk: bool) -> None:
    """The draft top-K reads the target LM head's dense weight shard.

    Raises ValueError for a head without a dense 2-D weight (quantised heads), with LoRA-added
    vocabulary, or tensor parallelism without the core's ``build_ddtree_from_topk``.
    """
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2 or not weight.is_floating_point():
        raise ValueError(
            "DDTREE needs the target model's lm_head to have a dense floating-point weight "
            "(quantised LM heads are not supported by this revision)."
        )
    if num_added:
        raise ValueError("DDTREE does not support LoRA-added vocabulary on the target LM head.")
    if tp_size > 1 and not has_from_topk:
        raise ValueError(
            f"DDTREE with tensor parallelism (tp_size={tp_size}) needs the DDTree core's "
            "build_ddtree_from_topk; this install's ddtree_tree.py does not have it."
        )


def check_captured_verify_width(graph_runner: Any, verify_width: int) -> None:
    """Refuse target decode CUDA graphs captured at another width than the tree verify's.

    Args:
      graph_runner: the target ``ModelRunner.decode_cuda_graph_runner`` (None: no graphs).
      verify_width: budget + 1 tokens per request.
    Raises:
      RuntimeError naming the missing patchset revision (graphs captured at DFlash's block width
      replay a verify of the wrong size).
    """
    captured = getattr(graph_runner, "captured_req_width", None)
    if captured is not None and int(captured) != int(verify_width):
        raise RuntimeError(
            f"DDTREE: the target's decode CUDA graphs were captured {captured} tokens wide, the "
            f"tree verify is budget + 1 = {verify_width}: revision 2 or later of the sglpatch "
            "ddtree patchset (spec_info.py, decode_cuda_graph_runner.py) is missing. Run "
            "`sglpatch apply ddtree`, or serve with --disable-cuda-graph."
        )


def replays_only_its_width(graph_runner: Any) -> bool:
    """Whether the target's decode graph runner sends a verify of another width than it captured
    to the eager forward (SGLang 0.5.21 - 0.5.23: ``can_run_graph``'s uniform-width invariant).

    Probed on the runner itself with a stand-in batch one token wider than its capture: the
    invariant answers False before reading anything else of the batch. A runner that reads
    further (raises) or answers True would replay a graph of the wrong width: False here.

    Args:
      graph_runner: the target ``ModelRunner.decode_cuda_graph_runner`` (not None).
    """
    from types import SimpleNamespace

    captured = getattr(graph_runner, "captured_req_width", None)
    if captured is None:
        return False
    probe = SimpleNamespace(
        replace_embeds=None,
        spec_info=SimpleNamespace(num_tokens_per_req=int(captured) + 1),
    )
    try:
        return graph_runner.can_run_graph(probe) is False
    except Exception:  # noqa: BLE001 - it read more than the invariant needs: not the fallback
        return False


def check_widths_beside_graphs(
    schedule: Optional[BudgetSchedule],
    graph_runner: Any,
    planner: Optional[AutoBudgetPlanner] = None,
    *,
    block_size: int,
) -> list[str]:
    """Check that every verify width of a budget schedule (or of the ``auto`` planner) can run
    beside the target's decode CUDA graphs, and say how each runs.

    The graphs are captured at the server budget's width (budget + 1 tokens, with the tree mask).
    A step of that width replays them; a step of another width — a smaller tree, or a chain step
    (DFlash's verify of the block, causal) — runs the target verify eagerly, which SGLang's graph
    runner does by itself for a width it did not capture (``replays_only_its_width``).

    Args:
      schedule: the parsed ``--speculative-ddtree-budget-schedule`` (None: none or ``auto``).
      graph_runner: the target ``ModelRunner.decode_cuda_graph_runner`` (None: no graphs).
      planner: the ``auto`` planner (None: a fixed schedule or none).
      block_size: DFlash's block B (a chain step verifies B tokens).
    Returns:
      Lines for the log: what replays and what runs eagerly ([] without graphs or without
      several widths).
    Raises:
      ValueError: a chain step whose width B equals the captured width (budget = B - 1: it would
      replay the tree-mask graph without a mask), or several widths on a runner without the
      uniform-width fallback.
    """
    if graph_runner is None or (schedule is None and planner is None):
        return []
    if planner is not None:
        budgets, ceiling, what = list(planner.candidates), planner.ceiling, "auto chooses among budgets"
    else:
        budgets, ceiling, what = schedule.budgets(), schedule.ceiling, "gives budgets"
    shown = ", ".join("chain" if n == CHAIN else str(n) for n in budgets)
    others = [n for n in budgets if n != ceiling]
    if not others:
        return []
    flag = "--speculative-ddtree-budget-schedule" + (" auto" if planner is not None else "")
    if CHAIN in budgets and block_size == ceiling + 1:
        raise ValueError(
            f"DDTREE {flag} {what} [{shown}] with --speculative-ddtree-budget {ceiling} = block "
            f"size - 1: a chain step verifies the block's {block_size} tokens, the width the target's "
            "CUDA graphs were captured at with the tree mask, and would replay them without one. "
            f"Give --speculative-ddtree-budget {block_size} or more, a schedule without chain "
            "entries, or serve with --disable-cuda-graph."
        )
    if not replays_only_its_width(graph_runner):
        raise ValueError(
            f"DDTREE {flag} {what} [{shown}], but this SGLang's decode CUDA graph runner "
            "would replay a graph captured at another verify width (its can_run_graph does not "
            "send other widths to the eager forward). Serve with --disable-cuda-graph, or give a "
            "fixed --speculative-ddtree-budget without the schedule."
        )
    eager = ", ".join("chain" if n == CHAIN else str(n) for n in others)
    return [
        f"DDTREE: the target's CUDA graphs replay the verify at budget {ceiling} "
        f"({ceiling + 1} tokens per request); steps at budgets [{eager}] verify eagerly "
        "(a width the graphs were not captured at)."
    ]


@dataclass
class VerifyWidthState:
    """The target's verify resources of their own for one tree budget, as SGLang's adaptive
    speculative decoding keeps one ``SpecRuntimeState`` per step count: an attention backend built
    for budget + 1 tokens per request and, where the server captures CUDA graphs, a decode graph
    runner captured at that width (None: the width verifies eagerly on its backend).

    Fields:
      budget: tree nodes per request (>= 1).
      tokens_per_request: the width the backend was built for (budget + 1 on a patched SGLang).
      attn_backend: the target ``AttentionBackend`` of that width.
      graph_runner: the target ``DecodeCudaGraphRunner`` (or the runner class this server uses).
      memory_gib: device memory the two took (GiB; 0.0 when not measured: no graphs).
    """

    budget: int
    tokens_per_request: int
    attn_backend: Any
    graph_runner: Any = None
    memory_gib: float = 0.0


def build_verify_width_state(
    model_runner: Any, budget: int, *, graph_runner_cls: Optional[Callable[..., Any]] = None
) -> VerifyWidthState:
    """Build the target's verify backend for ``budget`` tree nodes per request on the target
    ``ModelRunner`` and, given ``graph_runner_cls``, capture its decode CUDA graphs at that width.

    SGLang reads the verify width from the spec config (``get_num_tokens_per_req_for_target_verify``
    answers DDTreeSizes(...).verify_width, patch 0006), so the budget is overridden there while the
    backend and the runner are built, with SGLang's own scoped ``override``. ``graph_runner_cls`` is
    the class of the runner SGLang captured at start-up (its platform's choice), constructed with
    the new backend as EAGLE's adaptive states are (``attn_backend=``). The model runner's own
    backend and runner are left as they were.

    Raises:
      RuntimeError: the backend answers another width than budget + 1 (the override did not reach
      it: this SGLang reads the width elsewhere), or what SGLang raises while capturing.
    """
    from sglang.srt.runtime_context import get_spec

    n = int(budget)
    keep_workspace = getattr(model_runner, "init_new_workspace", None)
    with get_spec().override(speculative_ddtree_budget=n):
        try:
            backend = model_runner._get_attention_backend(init_new_workspace=True)
        finally:
            if keep_workspace is not None:
                model_runner.init_new_workspace = keep_workspace
        width = int(model_runner.decode_num_tokens_per_req())
        if width != n + 1:
            raise RuntimeError(
                f"DDTREE: a verify backend built for budget {n} answers {width} tokens per request, "
                f"not {n + 1}: this SGLang does not take the verify width from the spec config. "
                "Serve with --speculative-ddtree-graph-memory 0."
            )
        runner = None
        if graph_runner_cls is not None:
            runner = graph_runner_cls(model_runner, attn_backend=backend)
            captured = getattr(runner, "captured_req_width", width)
            if int(captured) != width:
                raise RuntimeError(
                    f"DDTREE: the verify graphs for budget {n} were captured {captured} tokens wide, "
                    f"not {width}. Serve with --speculative-ddtree-graph-memory 0."
                )
    return VerifyWidthState(n, width, backend, runner)


def draft_head_logits(hidden: torch.Tensor, weight: torch.Tensor, num_org: int) -> torch.Tensor:
    """Dense draft logits on one rank: hidden [T, H] @ weight[:num_org].T -> [T, num_org]
    (weight dtype). Used at TP = 1, where the shard is the whole vocabulary."""
    hs = hidden if hidden.dtype == weight.dtype else hidden.to(weight.dtype)
    return torch.matmul(hs, weight[:num_org].T)


def draft_head_topk(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    *,
    num_org: int,
    vocab_start: int,
    k: int,
    world_size: int = 1,
    all_gather: Optional[Callable[[torch.Tensor], torch.Tensor]] = None,
    chunk_rows: int = 256,
) -> TopKCandidates:
    """Per-position top-K of the drafter's distributions through a (vocab-sharded) LM head.

    Args:
      hidden: [T, H] draft hidden states (T = bs * L, depth-major per request).
      weight: [V_local_padded, H] this rank's LM head shard; rows [0, num_org) are real.
      vocab_start: global id of row 0; k: K.
      world_size, all_gather: see ``ddtree_info.gather_topk_candidates``.
      chunk_rows: rows per local matmul ([chunk_rows, V_local] logits live at a time).
    Returns:
      merged TopKCandidates [T, K] (the same on every rank). Two collectives per step.
    """
    T = hidden.shape[0]
    parts = []
    for r0 in range(0, T, int(chunk_rows)):
        logits = draft_head_logits(hidden[r0 : r0 + int(chunk_rows)], weight, num_org)
        parts.append(local_topk_candidates(logits, vocab_start, k))
    local = TopKCandidates(
        torch.cat([p.values for p in parts]), torch.cat([p.ids for p in parts]), torch.cat([p.lse for p in parts])
    )
    return gather_topk_candidates(local, k, world_size=world_size, all_gather=all_gather)


def _group_all_gather(group: Any, world_size: int) -> Callable[[torch.Tensor], torch.Tensor]:
    """SGLang GroupCoordinator -> ``f(x) -> [world, *x.shape]`` (rank-major, like DFlash's
    ``all_gather_into_tensor`` use)."""

    def all_gather(x: torch.Tensor) -> torch.Tensor:
        flat = x.contiguous().view(-1)
        out = torch.empty((world_size * flat.numel(),), dtype=x.dtype, device=x.device)
        group.all_gather_into_tensor(out, flat)
        return out.view(world_size, *x.shape)

    return all_gather


def attn_dp_enabled(parallel: Any) -> bool:
    """Whether DP attention is on, from SGLang's ``get_parallel()`` context: ``attn_dp_enabled``
    (SGLang 0.5.22 on), else the ``enable_dp_attention`` flag (0.5.21 publishes only that)."""
    try:
        return bool(parallel.attn_dp_enabled)
    except AttributeError:
        return bool(parallel.enable_dp_attention)


def _resolve_verify_backend(attn_backend: Any) -> Any:
    """The backend object that runs TARGET_VERIFY, through SGLang's wrappers (hybrid
    prefill/decode split, two-batch overlap, hybrid linear attention's full-attention part)."""
    from sglang.srt.layers.attention.hybrid_attn_backend import HybridAttnBackend
    from sglang.srt.layers.attention.tbo_backend import TboAttnBackend
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    backend = attn_backend
    for _ in range(4):
        if isinstance(backend, HybridAttnBackend):
            backend = backend._select_backend(ForwardMode.TARGET_VERIFY)
        elif isinstance(backend, TboAttnBackend):
            backend = backend.primary
        elif getattr(backend, "full_attn_backend", None) is not None:
            backend = backend.full_attn_backend
        else:
            break
    return backend


# ---------------------------------------------------------------------------------------------
# The worker (needs SGLang)
# ---------------------------------------------------------------------------------------------
try:  # pragma: no cover - exercised only where SGLang's import-time deps are installed
    from sglang.srt.speculative.dflash_worker_v2 import DFlashWorkerV2 as _WorkerBase

    SGLANG_WORKER_AVAILABLE = True
except ImportError:
    _WorkerBase = object
    SGLANG_WORKER_AVAILABLE = False


class DDTreeWorker(_WorkerBase):  # type: ignore[misc,valid-type]
    """DDTree on the DFlash drafter (spec-v2; overlap and non-overlap scheduling).

    Construction raises ValueError for unsupported configurations (see the module docstring)
    and RuntimeError when the revision-2 hooks it relies on are missing from SGLang.
    """

    def __init__(self, server_args, gpu_id: int, nccl_port: int, target_worker):
        if not SGLANG_WORKER_AVAILABLE:
            raise ImportError("DDTreeWorker needs SGLang's DFlash spec-v2 worker (sglang.srt.speculative.dflash_worker_v2)")
        from sglang.srt.runtime_context import get_parallel, get_spec

        from . import ddtree_info, ddtree_tree

        sizes = DDTreeSizes.from_spec(get_spec())
        schedule_text = getattr(get_spec(), "speculative_ddtree_budget_schedule", None)
        floor = max(1, sizes.block_size - 1)
        planner: Optional[AutoBudgetPlanner] = None
        if is_auto(schedule_text):  # refused here, before the draft model loads, where it cannot run
            if sizes.budget < floor:
                raise ValueError(
                    f"DDTREE --speculative-ddtree-budget-schedule auto chooses budgets from block size "
                    f"- 1 = {floor} up to --speculative-ddtree-budget, which is {sizes.budget}: give "
                    f"--speculative-ddtree-budget {floor} or more (the widest tree it may verify)."
                )
            planner = AutoBudgetPlanner(floor, sizes.budget)
        # SGLang 0.5.23 builds this worker before the memory pools, the attention backends and the
        # CUDA graphs (Scheduler.init_model_worker): the target's backend is checked in
        # init_attention_backends, the captured verify width in init_cuda_graphs.
        check_parallel_layout(attn_dp_enabled=attn_dp_enabled(get_parallel()))
        lm_head = getattr(target_worker.model_runner.model, "lm_head", None)
        shard = getattr(lm_head, "shard_indices", None)
        tp_size = int(get_parallel().tp_group.world_size)
        check_lm_head(
            getattr(lm_head, "weight", None),
            num_added=int(getattr(shard, "num_added_elements", 0) or 0),
            tp_size=tp_size,
            has_from_topk=hasattr(ddtree_tree, "build_ddtree_from_topk"),
        )
        if ddtree_info.DDTreeDraftInputV2 is None or not hasattr(
            ddtree_info.DDTreeDraftInputV2, "decode_reserve_tokens"
        ):
            raise RuntimeError("DDTREE: DDTreeDraftInputV2 is unavailable (SGLang import failed)")
        from sglang.srt.speculative.dflash_info_v2 import DFlashDraftInputV2

        if not hasattr(DFlashDraftInputV2, "decode_reserve_tokens"):
            raise RuntimeError(
                "DDTREE needs revision 2 of the sglpatch ddtree patchset in dflash_info_v2.py "
                "(DFlashDraftInputV2.decode_reserve_tokens): without it the KV reservation stays "
                "2 x block and the verify window would read unreserved slots. Run "
                "`sglpatch apply ddtree`."
            )

        super().__init__(server_args, gpu_id, nccl_port, target_worker)

        check_draft_head(
            has_selector=self.selector is not None,
            has_lilicorr=self.lilicorr is not None,
            is_domino=bool(self._is_domino),
        )
        if int(self.block_size) != sizes.block_size:
            raise RuntimeError(
                f"DDTREE block size mismatch: worker {self.block_size}, spec {sizes.block_size}"
            )
        self._tp_group = get_parallel().tp_group
        self._tp_size = tp_size
        # outside the draft scope, the context answers the target's rank
        self._ddtree_tp_rank = int(get_parallel().tp_rank)
        self._draft_scope = self._draft_scope_factory()
        # SGLang 0.5.21's compact-draft host bound takes the device lengths (its last resort)
        self._compact_bound_takes_prefix = (
            "draft_prefix_lens" in inspect.signature(self._fill_compact_seq_lens_cpu_bound).parameters
        )
        self.ddtree_sizes = sizes
        self._ddtree_positions_buf: Optional[torch.Tensor] = None
        self.budget_planner: Optional[AutoBudgetPlanner] = planner
        self.budget_schedule: Optional[BudgetSchedule] = (
            load_schedule(str(schedule_text), floor=floor, ceiling=sizes.budget)
            if schedule_text and self.budget_planner is None
            else None
        )
        # auto: (batch size, budget, perf_counter at its start) of the last decode step, and the
        # results whose accept lengths have not reached the host yet
        self._last_decode: Optional[Tuple[int, int, float]] = None
        self._pending_accepts: Deque[Tuple[int, Any]] = collections.deque(maxlen=16)
        self._logged_plan = 0
        self._budgets_tried: set = set()
        # the target's verify backend (and graphs) of their own per narrower tree budget, built in
        # init_cuda_graphs; a budget without one verifies on the model runner's own
        self._verify_states: Dict[int, VerifyWidthState] = {}
        self.graph_width_plan: Optional[GraphWidthPlan] = None

    def _draft_scope_factory(self) -> Callable[[], Any]:
        """A no-argument callable entering the draft's TP scope as this DFlashWorkerV2 does:
        ``draft_tp_context(draft_parallel_layout)`` (SGLang 0.5.23), the worker's own
        ``draft_tp_context(draft group, owns_attention=...)`` (0.5.21: ``empty_context`` without
        DP attention), or ``draft_tp_context(draft_owns_attention)`` (0.5.22). DP attention is
        refused, so each means the draft runs on the target's TP group."""
        from sglang.srt.speculative.spec_utils import draft_tp_context

        if hasattr(self, "draft_parallel_layout"):
            return functools.partial(draft_tp_context, self.draft_parallel_layout)
        own = getattr(self, "draft_tp_context", None)
        if callable(own):
            return functools.partial(
                own, self.draft_model_runner.tp_group, owns_attention=self.draft_owns_attention
            )
        return functools.partial(draft_tp_context, self.draft_owns_attention)

    # -- start-up checks that need what SGLang builds after the worker ------------------------
    def init_attention_backends(self):
        """DFlash's backends, then refuse a target verify backend that would verify a chain.

        Raises ValueError (see ``check_verify_backend``).
        """
        super().init_attention_backends()
        backend = _resolve_verify_backend(self.target_worker.model_runner.attn_backend)
        check_verify_backend(
            type(backend).__name__,
            chain_only_kernel=bool(getattr(backend, "use_verify_splitkv", False))
            or bool(getattr(backend, "use_verify_shared_kv", False)),
        )
        if self._ddtree_tp_rank == 0:
            sizes = self.ddtree_sizes
            logger.info(
                "DDTREE worker ready: block=%d budget=%d topk=%d verify_width=%d window=%d "
                "reserve=%d backend=%s tp=%d budget_schedule=%s",
                sizes.block_size,
                sizes.budget,
                sizes.topk,
                sizes.verify_width,
                sizes.window_width,
                sizes.kv_reserve,
                type(backend).__name__,
                self._tp_size,
                (
                    self.budget_schedule.text()
                    if self.budget_schedule
                    else "auto over " + ",".join(str(n) if n else "chain" for n in self.budget_planner.candidates)
                    if self.budget_planner
                    else "none"
                ),
            )

    def init_cuda_graphs(self):
        """DFlash's draft graphs, then check the width the target's decode graphs were captured at
        (the target's graphs are captured before the draft worker's).

        Raises RuntimeError when they were captured narrower or wider than budget + 1.
        """
        super().init_cuda_graphs()
        graph_runner = getattr(self.target_worker.model_runner, "decode_cuda_graph_runner", None)
        check_captured_verify_width(graph_runner, self.ddtree_sizes.verify_width)
        eager_lines = check_widths_beside_graphs(
            self.budget_schedule,
            graph_runner,
            self.budget_planner,
            block_size=self.ddtree_sizes.block_size,
        )
        self._build_verify_states(graph_runner)
        if self._ddtree_tp_rank == 0:
            own = self._verify_states or self.graph_width_plan is not None
            for line in self._verify_state_lines() if own else eager_lines:
                logger.info(line)

    def _tree_budgets(self) -> List[int]:
        """The tree budgets (ascending, no ``CHAIN``) this server's steps can verify."""
        if self.budget_planner is not None:
            budgets = self.budget_planner.candidates
        elif self.budget_schedule is not None:
            budgets = self.budget_schedule.budgets()
        else:
            budgets = [self.ddtree_sizes.budget]
        return sorted({int(n) for n in budgets if n != CHAIN})

    def _free_device_gib(self) -> float:
        """Free device memory (GiB), the least of the TP ranks' (every rank then decides alike)."""
        from sglang.srt.utils.common import get_available_gpu_memory

        runner = self.target_worker.model_runner
        if self._tp_size > 1:
            return float(
                get_available_gpu_memory(
                    runner.device, runner.gpu_id, distributed=True,
                    cpu_group=getattr(self._tp_group, "cpu_group", None),
                )
            )
        return float(get_available_gpu_memory(runner.device, runner.gpu_id))

    def _build_verify_states(self, graph_runner: Any) -> None:
        """A verify state of its own (``VerifyWidthState``) for each narrower tree budget the
        schedule or the planner can give: with CUDA graphs, captured narrowest first while their
        measured memory fits --speculative-ddtree-graph-memory (``plan_graph_widths``; the rest
        verify eagerly through the start-up runner's uniform-width fallback); without graphs, the
        backend alone for every such budget (each backend built as SGLang builds one: a
        flashinfer backend takes a workspace of its own). The server budget's width keeps SGLang's
        own. Raises RuntimeError naming the way out when a capture fails."""
        from sglang.srt.runtime_context import get_spec

        budgets = [n for n in self._tree_budgets() if n != self.ddtree_sizes.budget]
        if not budgets:
            return
        runner = self.target_worker.model_runner
        if graph_runner is None or getattr(graph_runner, "captured_req_width", None) is None:
            for n in budgets:
                self._verify_states[n] = build_verify_width_state(runner, n)
            return
        bound = float(getattr(get_spec(), "speculative_ddtree_graph_memory", 0.0) or 0.0)

        def capture(n: int) -> float:
            before = self._free_device_gib()
            try:
                state = build_verify_width_state(runner, n, graph_runner_cls=type(graph_runner))
            except Exception as exc:  # noqa: BLE001 - SGLang's capture: say the way out, keep the cause
                if str(exc).startswith("DDTREE:"):
                    raise  # build_verify_width_state's own, which names the way out
                raise RuntimeError(
                    f"DDTREE: capturing the target's verify CUDA graphs for budget {n} ({n + 1} tokens "
                    f"per request) failed: {type(exc).__name__}: {exc}. Serve with "
                    "--speculative-ddtree-graph-memory 0 (narrower widths then verify eagerly, as "
                    "revision 11 did) or --disable-cuda-graph."
                ) from exc
            state.memory_gib = max(0.0, before - self._free_device_gib())
            self._verify_states[n] = state
            return state.memory_gib

        self.graph_width_plan = plan_graph_widths(budgets, capture, bound_gib=bound)

    def _verify_state_lines(self) -> List[str]:
        """Log lines: each budget's own verify state, and what verifies eagerly."""
        lines = []
        if self._verify_states:
            shown = ", ".join(
                f"{n}: {state.tokens_per_request} tokens/request"
                + (", graphs" if state.graph_runner is not None else ", eager")
                for n, state in sorted(self._verify_states.items())
            )
            lines.append(f"DDTREE: target verify states of their own for budgets [{shown}]")
        if self.graph_width_plan is not None:
            lines.append("DDTREE: " + self.graph_width_plan.describe() + " (and chain steps)")
        return lines

    @contextlib.contextmanager
    def _verify_width(self, budget: int) -> Iterator[None]:
        """Within: the target model runner verifies with ``budget``'s own backend and graph runner
        (SGLang's adaptive ``apply_runtime_state`` swaps the same two), restored on exit; a budget
        without a state of its own uses the runner's."""
        state = self._verify_states.get(int(budget))
        if state is None:
            yield
            return
        runner = self.target_worker.model_runner
        kept = (runner.attn_backend, runner.decode_cuda_graph_runner)
        runner.attn_backend, runner.decode_cuda_graph_runner = state.attn_backend, state.graph_runner
        try:
            yield
        finally:
            runner.attn_backend, runner.decode_cuda_graph_runner = kept

    # -- DFlash hooks -----------------------------------------------------------------------
    def _maybe_build_draft_sampler(self):
        # DFlash folds a greedy argmax into the draft graph; DDTree needs the hidden states.
        return None

    def _make_next_draft_input_prefill(self, *, bonus_tokens, seq_lens):
        return make_ddtree_draft_input(bonus_tokens=bonus_tokens, new_seq_lens=seq_lens)

    def _make_next_draft_input_decode(self, *, bonus_tokens, new_seq_lens):
        return make_ddtree_draft_input(bonus_tokens=bonus_tokens, new_seq_lens=new_seq_lens)

    def forward_batch_generation(self, batch, on_publish=None, grammar_barrier=None, pp_proxy_tensors=None):
        """Prefill, idle and chain steps are DFlash's own; other decode steps verify a tree.

        A chain step (the budget schedule or the ``auto`` planner says ``chain`` for this batch
        size) is DFlashWorkerV2's decode step unchanged: the block's argmax chain, verified
        causally at the block's width. Both steps leave the same state behind (the committed
        tokens' target hidden states in the draft KV cache, ``DDTreeDraftInputV2`` with the bonus
        token), so consecutive steps may switch between them as the running batch changes.
        """
        decode = not (
            batch.forward_mode.is_extend() or batch.is_extend_in_batch or batch.forward_mode.is_idle()
        )
        if not decode:
            self._last_decode = None  # the interval to the next decode step is not a step's cost
            budget = None
        else:
            budget = self.step_budget(len(batch.seq_lens))
        if budget is None or budget == CHAIN:
            result = super().forward_batch_generation(
                batch,
                on_publish=on_publish,
                grammar_barrier=grammar_barrier,
                pp_proxy_tensors=pp_proxy_tensors,
            )
        else:
            result = self._ddtree_decode_step(batch, budget, on_publish=on_publish, grammar_barrier=grammar_barrier)
        if budget is not None and self.budget_planner is not None:
            self._pending_accepts.append((budget, result))
        return result

    # -- the step's budget ------------------------------------------------------------------
    def step_budget(self, batch_size: int) -> int:
        """The budget of a decode step of ``batch_size`` requests: ``CHAIN`` (DFlash's own step) or
        tree nodes per request, from the ``auto`` planner, the schedule, or the server's budget.
        With the planner, also feeds it the previous decode step's time and the accept lengths
        that have reached the host since."""
        if self.budget_planner is None:
            if self.budget_schedule is None:
                return self.ddtree_sizes.budget
            return self.budget_schedule.budget_for(batch_size)
        now = time.perf_counter()
        self._feed_planner(now)
        budget = self.budget_planner.choose(batch_size)
        self._last_decode = (batch_size, budget, now)
        tried = (batch_bucket(batch_size), budget)
        if tried not in self._budgets_tried:  # at most buckets x candidates lines in a lifetime
            self._budgets_tried.add(tried)
            if self._ddtree_tp_rank == 0:
                logger.info(
                    "DDTREE auto budget: first step at batch %d-%d with %s",
                    tried[0],
                    2 * tried[0] - 1,
                    "DFlash's chain" if budget == CHAIN else f"a tree of {budget} nodes",
                )
        return budget

    def _feed_planner(self, now: float) -> None:
        planner = self.budget_planner
        if self._last_decode is not None:
            bs, budget, started = self._last_decode
            planner.record_time(bs, budget, now - started)
        while self._pending_accepts:
            budget, result = self._pending_accepts[0]
            lens = getattr(result, "accept_lens", None)
            if not isinstance(lens, torch.Tensor) or lens.numel() == 0:
                self._pending_accepts.popleft()
                continue
            done = getattr(getattr(result, "copy_done", None), "query", None)
            if lens.device.type != "cpu" or (callable(done) and not done()):
                break  # the scheduler has not copied it to the host yet: next step
            self._pending_accepts.popleft()
            planner.record_accept(budget, float(lens.to(torch.float32).mean()))
        if planner.plan_changes != self._logged_plan and self._ddtree_tp_rank == 0:
            self._logged_plan = planner.plan_changes   # a counter: no text built per step
            logger.info("DDTREE auto budget plan (batch:budget): %s", planner.describe())

    # -- the decode step --------------------------------------------------------------------
    def step_sizes(self, budget: int) -> DDTreeSizes:
        """The sizes of a tree decode step of ``budget`` nodes per request (``step_budget``): the
        server's, with that budget (top-k unset stays equal to the budget; the window W stays
        the server's). Raises ValueError for ``CHAIN`` (a chain step has no tree)."""
        sizes = self.ddtree_sizes
        n = int(budget)
        if n == CHAIN:
            raise ValueError("a chain step (DFlash's own) has no tree sizes")
        if n == sizes.budget:
            return sizes
        topk = n if sizes.topk >= sizes.budget else min(sizes.topk, n)
        return DDTreeSizes(sizes.block_size, n, topk)

    def _positions_buffer(self, n: int) -> torch.Tensor:
        buf = self._ddtree_positions_buf
        if buf is None or buf.numel() < n:
            cap = max(n, 2 * (0 if buf is None else buf.numel()))
            self._ddtree_positions_buf = torch.empty((cap,), dtype=torch.int64, device=self.device)
        return self._ddtree_positions_buf

    def _host_committed_bound(self, batch, draft_input) -> torch.Tensor:
        """Host upper bound of the committed lengths (no device sync): the scheduler's
        ``seq_lens_cpu`` when present, else the reservation bound of the overlap scheduler."""
        if batch.seq_lens_cpu is not None:
            return batch.seq_lens_cpu.to(torch.int64)
        if draft_input.nxt_kv_lens_cpu is not None:
            return draft_input.nxt_kv_lens_cpu.to(torch.int64)
        return torch.tensor([int(r.kv.kv_allocated_len) for r in batch.reqs], dtype=torch.int64)

    def _ddtree_decode_step(self, batch, budget: int, *, on_publish=None, grammar_barrier=None):
        from sglang.kernels.ops.speculative.cache_locs import assign_extend_cache_locs_func
        from sglang.srt.layers.logprob_processor import compute_spec_logprobs
        from sglang.srt.lora.layers import unwrap_lora_layer
        from sglang.srt.managers.scheduler import GenerationBatchResult
        from sglang.srt.model_executor.forward_batch_info import (
            CaptureHiddenMode,
            ForwardBatch,
            ForwardMode,
            enable_num_token_non_padded,
        )
        from sglang.srt.speculative import dflash_worker_v2 as dflash
        from sglang.srt.speculative.dflash_info_v2 import DFlashDraftInputV2
        from sglang.srt.speculative.dflash_utils import apply_dflash_verify_logits_adjustments

        try:
            from sglang.srt.speculative.dflash_utils import build_speculative_verify_target_probs
        except ImportError:  # SGLang 0.5.21's name for it
            from sglang.srt.speculative.dflash_utils import (
                build_dflash_verify_target_probs as build_speculative_verify_target_probs,
            )
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
        from sglang.srt.speculative.spec_tp_sync import SpecTpSyncSite
        from sglang.srt.speculative.spec_utils import GrammarTree, build_grammar_vocab_mask

        from .ddtree_accept import sample_target_choices

        draft_input = batch.spec_info
        if not isinstance(draft_input, DFlashDraftInputV2):
            raise RuntimeError("DDTREE expected DDTreeDraftInputV2 state on the running batch.")
        batch.seq_lens.record_stream(torch.get_device_module(self.device).current_stream())

        bs = len(batch.seq_lens)
        # the server's sizes fix the window W (KV reserved per request); the step's budget may be
        # smaller, from the budget schedule or planner for this batch size (eager verify only)
        W = self.ddtree_sizes.window_width
        sizes = self.step_sizes(budget)
        B, L, N1 = sizes.block_size, sizes.draft_depth, sizes.verify_width
        device = self.device
        prefix_lens = batch.seq_lens
        req_to_token = self.model_runner.req_to_token_pool.req_to_token

        # 1) The step's window: W reserved slots after the committed prefix.
        window_virtual = assign_extend_cache_locs_func(
            req_pool_indices=batch.req_pool_indices,
            req_to_token=req_to_token,
            start_offset=prefix_lens,
            end_offset=prefix_lens + W,
            batch_size=bs,
            draft_token_num=W,
            device=device,
        ).view(bs, W)
        host_committed = self._host_committed_bound(batch, draft_input)
        target_translator = self.target_worker.model_runner.kv_index_translator
        # SGLang 0.5.22 on plans the window's KV locations once (KVLocPlan: the ids each pool's
        # kernels write); 0.5.21 has no plans: there the draft block, the verify, the KV moves and
        # the draft-KV writes take the window's req_to_token slots, as its DFlash step does.
        kv_loc_plan = (
            target_translator.plan(
                req_pool_indices=batch.req_pool_indices,
                seq_lens=prefix_lens,
                seq_lens_cpu=host_committed,
                write_virtual=window_virtual.reshape(-1),
                read_extent=W,
            )
            if hasattr(target_translator, "plan")
            else None
        )
        draft_cols = slice(0, B) if W > B else None
        verify_cols = slice(0, N1) if W > N1 else None

        # 2) DFlash's draft block: [bonus, MASK x L] at positions prefix + 0..L.
        self._ensure_draft_block_buffers(bs)
        block_ids = self._draft_block_ids_buf[:bs]
        block_ids.fill_(int(self._mask_token_id))
        block_ids[:, 0].copy_(draft_input.bonus_tokens)
        positions_2d = self._draft_block_positions_buf[:bs]
        torch.add(prefix_lens.unsqueeze(1), self._block_pos_offsets, out=positions_2d)
        block_loc_2d = self._draft_verify_out_cache_loc_buf[:bs]
        block_loc_2d.copy_(window_virtual[:, :B])

        target_model = self.target_worker.model_runner.model
        embed_module = unwrap_lora_layer(dflash._resolve_dflash_embedding_module(self.draft_model, target_model))
        if self._full_embed_gpu is not None:
            noise_embedding = torch.nn.functional.embedding(block_ids, self._full_embed_gpu)
        else:
            noise_embedding = embed_module(block_ids)
        if self._noise_embed_scale != 1.0:
            noise_embedding = noise_embedding * self._noise_embed_scale

        seq_lens_cpu = self._draft_seq_lens_cpu_buf[:bs]
        if self.use_compact_draft_cache:
            draft_seq_lens = self._compute_compact_draft_seq_lens(prefix_lens)
            # SGLang 0.5.21's last-resort bound copies the device lengths: it takes them
            device_lens = {"draft_prefix_lens": draft_seq_lens} if self._compact_bound_takes_prefix else {}
            self._fill_compact_seq_lens_cpu_bound(
                batch_seq_lens_cpu=batch.seq_lens_cpu,
                nxt_kv_lens_cpu=draft_input.nxt_kv_lens_cpu,
                out=seq_lens_cpu,
                **device_lens,
            )
            self._rebuild_compact_draft_cache(
                req_pool_indices=batch.req_pool_indices,
                prefix_lens=prefix_lens,
                draft_prefix_lens=draft_seq_lens,
                verify_out_cache_loc_2d=block_loc_2d,
                bs=bs,
                block_size=B,
            )
        else:
            draft_seq_lens = prefix_lens
            seq_lens_cpu.copy_(host_committed.to(torch.int32) + B)
        draft_seq_lens_sum = int(seq_lens_cpu.sum())  # host tensor: no device sync

        forward_batch = ForwardBatch(
            forward_mode=ForwardMode.TARGET_VERIFY,
            batch_size=bs,
            input_ids=block_ids.flatten(),
            req_pool_indices=batch.req_pool_indices,
            seq_lens=draft_seq_lens,
            out_cache_loc=block_loc_2d.reshape(-1),
            seq_lens_sum=draft_seq_lens_sum,
            seq_lens_cpu=seq_lens_cpu,
            positions=positions_2d.reshape(-1),
            input_embeds=noise_embedding.view(-1, noise_embedding.shape[-1]),
            spec_algorithm=SpeculativeAlgorithm.DFLASH,  # this forward IS DFlash's draft block
            spec_info=self._draft_block_spec_info,
            capture_hidden_mode=CaptureHiddenMode.NULL,
            num_token_non_padded=(
                torch.full((), bs * B, dtype=torch.int32, device=device)
                if enable_num_token_non_padded()
                else None
            ),
            global_num_token_non_padded_cpu=bs * B,
            can_run_decode_cuda_graph=batch.can_run_decode_cuda_graph,
        )
        if kv_loc_plan is not None:
            draft_translator = self.draft_model_runner.kv_index_translator
            draft_plan = (
                kv_loc_plan.reads_from(
                    draft_translator, seq_lens=draft_seq_lens, seq_lens_cpu=seq_lens_cpu, read_extent=B
                )
                if self.use_compact_draft_cache
                else kv_loc_plan
            )
            draft_plan.bind(forward_batch, draft_translator, cols=draft_cols)
        with torch.inference_mode(), self._draft_scope():
            draft_out = self.draft_model_runner.forward(forward_batch)
        draft_hidden = draft_out.logits_output.hidden_states
        if draft_hidden is None:
            raise RuntimeError("DDTREE: the DFlash draft forward returned no hidden states.")
        draft_hidden = draft_hidden.view(bs, B, -1)[:, 1:, :].reshape(bs * L, -1)

        # 3) Per-depth top-K (TP-safe) and the tree.
        lm_head = unwrap_lora_layer(target_model.lm_head)
        shard = getattr(lm_head, "shard_indices", None)
        weight = lm_head.weight
        num_org = int(shard.num_org_elements) if shard is not None else int(weight.shape[0])
        vocab_start = int(shard.org_vocab_start_index) if shard is not None else 0
        k = min(sizes.topk, sizes.budget)
        with torch.inference_mode(), self._draft_scope():
            if self._tp_size == 1:
                logits = draft_head_logits(draft_hidden, weight, num_org).view(bs, L, -1)
                tree = build_tree_from_logits(logits, block_ids[:, 0], sizes)
                del logits
            else:
                cands = draft_head_topk(
                    draft_hidden,
                    weight,
                    num_org=num_org,
                    vocab_start=vocab_start,
                    k=k,
                    world_size=self._tp_size,
                    all_gather=_group_all_gather(self._tp_group, self._tp_size),
                )
                tree = build_tree_from_candidates(cands, block_ids[:, 0], sizes)

        grammar_tree = (
            GrammarTree.from_device(tree.retrieve_next_token, tree.retrieve_next_sibling, tree.tokens)
            if batch.has_grammar
            else None
        )

        # 4) Target verify of N1 tokens per request.
        # Host upper bound of sum(prefix_lens) for the mask size. Reserved length - W bounds the
        # device prefix (reserved >= host committed + B + W, device prefix <= host committed + B)
        # even when the host's committed lengths lag a step under overlap; an under-estimate
        # would write past the mask, a loose one overflows the backend's graph mask buffer.
        prefix_sum_bound = int(host_committed.sum())
        if draft_input.nxt_kv_lens_cpu is not None and draft_input.nxt_kv_lens_sum is not None:
            prefix_sum_bound = max(prefix_sum_bound, int(draft_input.nxt_kv_lens_sum) - bs * W)
        verify_input = prepare_verify_tensors(
            tree,
            prefix_lens,
            positions_out=self._positions_buffer(bs * N1),
            custom_mask_out=None,
            prefix_lens_sum=prefix_sum_bound,
            kv_loc_plan=kv_loc_plan,
            kv_loc_cols=verify_cols if kv_loc_plan is not None else None,
        )
        batch.out_cache_loc = window_virtual[:, :N1].reshape(-1)
        seq_lens_cpu_backup, seq_lens_sum_backup = batch.seq_lens_cpu, batch.seq_lens_sum
        verify_host = host_committed + N1
        batch.seq_lens_cpu = verify_host
        batch.seq_lens_sum = int(verify_host.sum())
        with self._verify_width(budget):
            verify_forward_batch, _ = verify_input.prepare_for_verify(batch, self.target_worker)
            batch.seq_lens_cpu, batch.seq_lens_sum = seq_lens_cpu_backup, seq_lens_sum_backup
            seq_lens_pre_verify = batch.seq_lens.clone() if self._need_mamba_verify_commit else None

            target_out = self.target_worker.forward_batch_generation(
                batch=None, forward_batch=verify_forward_batch, is_verify=True, skip_attn_backend_init=True
            )
        logits_output = target_out.logits_output

        # 5) The target's choice at every node (argmax, or one draw per node at T > 0).
        sampling_info = batch.sampling_info
        greedy = sampling_info is None or sampling_info.is_all_greedy
        choice = None
        # SGLang 0.5.23's DFlash worker defers the verify logits' vocab gather (a TP-sharded
        # argmax where nothing else reads the logits); 0.5.22's has no deferred gather.
        target_lp = getattr(self, "_target_logits_processor", None)
        if target_lp is not None and target_lp.is_deferred_shard(logits_output.next_token_logits):
            if greedy and self._can_skip_verify_logits(batch, sampling_info):
                choice = target_lp.deferred_argmax(logits_output.next_token_logits)
                logits_output.next_token_logits = None
            else:
                logits_output.next_token_logits = target_lp.finish_deferred_gather(logits_output.next_token_logits)
        if choice is None:
            if sampling_info is not None:
                apply_dflash_verify_logits_adjustments(
                    next_token_logits=logits_output.next_token_logits,
                    sampling_info=sampling_info,
                    draft_token_num=N1,
                )
            if batch.has_grammar:
                grammar_mask = build_grammar_vocab_mask(
                    reqs=batch.reqs,
                    tree=grammar_tree,
                    sampling_info=sampling_info,
                    device=logits_output.next_token_logits.device,
                    barrier=grammar_barrier,
                )
                if grammar_mask is not None:
                    grammar_mask.apply(logits_output.next_token_logits)
            if greedy:
                choice = torch.argmax(logits_output.next_token_logits, dim=-1)
            else:
                probs = build_speculative_verify_target_probs(
                    next_token_logits=logits_output.next_token_logits,
                    sampling_info=sampling_info,
                    draft_token_num=N1,
                    bs=bs,
                    max_top_k=draft_input.max_top_k,
                    uniform_top_k_value=draft_input.uniform_top_k_value,
                )
                choice = sample_target_choices(probs)
                del probs
        choice = choice[: bs * N1].view(bs, N1).to(torch.int64)
        site = SpecTpSyncSite.DFLASH_ACCEPT_GREEDY if greedy else SpecTpSyncSite.DFLASH_ACCEPT_SAMPLE
        self._tp_sync.sync(site, choice)

        # 6) Walk, compact the accepted path's target KV, lay the outputs out.
        # The verify window in the ids the target pool moves, from the plan (a replayed graph's
        # batch may carry the runner's padded static buffer instead); 0.5.21: its req_to_token
        # slots, as EAGLE's accept moves there pass them.
        window_phys = (
            kv_loc_plan.write_ids(target_translator, cols=verify_cols).view(bs, N1)
            if kv_loc_plan is not None
            else window_virtual[:, :N1]
        )
        step = finish_verify_tensors(tree, choice, prefix_lens, window_phys, sizes)
        self.model_runner.token_to_kv_pool.move_kv_cache(step.kv_moves.tgt_loc, step.kv_moves.src_loc)
        outputs = step.outputs
        if batch.return_logprob:
            compute_spec_logprobs(batch, logits_output, choice.reshape(-1), accept_index=step.accept_index_flat)
        if self._need_mamba_verify_commit:
            # Only reachable with --speculative-ddtree-allow-hybrid-unsafe: commits the state
            # after the last accepted node in verify order, which mixes sibling branches.
            last_label = torch.gather(
                step.acceptance.accept_index, 1, step.acceptance.accept_length[:, None]
            ).squeeze(1)
            self._update_target_mamba_state_after_verify(
                batch=batch,
                seq_lens_pre_verify=seq_lens_pre_verify,
                seq_lens_post_verify=outputs.new_seq_lens,
                commit_lens=(last_label + 1).to(torch.int32),
            )
        if on_publish is not None:
            on_publish(outputs.new_seq_lens)

        # 7) The ACCEPTED nodes' target hidden states, in path order, into the draft KV.
        hidden = logits_output.hidden_states
        if hidden is None:
            raise RuntimeError("DDTREE verify requires target hidden states, but got None.")
        # rows past bs * N1 (TP/EP alignment padding) are never selected
        hidden = hidden.reshape(-1, hidden.shape[-1])
        draft_loc_2d = (
            self._draft_write_ids(kv_loc_plan).view(bs, W)[:, :B].contiguous()
            if kv_loc_plan is not None
            else window_virtual[:, :B].contiguous()
        )
        self._append_target_hidden_to_draft_kv_by_loc(
            target_hidden=hidden[step.hidden_rows.reshape(-1)],
            cache_loc=draft_loc_2d.reshape(-1),
            cache_loc_2d=draft_loc_2d,
            positions=step.draft_positions,
            commit_lens=outputs.commit_lens,
        )
        logits_output.hidden_states = None

        next_draft_input = self._make_next_draft_input_decode(
            bonus_tokens=step.acceptance.bonus_token, new_seq_lens=outputs.new_seq_lens
        )
        return GenerationBatchResult(
            logits_output=logits_output,
            next_token_ids=outputs.out_tokens.reshape(-1),
            accept_lens=outputs.commit_lens,
            can_run_cuda_graph=target_out.can_run_cuda_graph,
            next_draft_input=next_draft_input,
            speculative_num_draft_tokens=B,
            speculative_output_stride=sizes.output_stride,
            new_seq_lens=outputs.new_seq_lens,
            routed_experts_output=target_out.routed_experts_output,
            indexer_topk_output=target_out.indexer_topk_output,
        )
