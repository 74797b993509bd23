"""L1 smoke check of the ddtree patchset (revision 2: the worker) on SGLang 0.5.23.

Run by the target host's own interpreter (standard library + the installed sglang; no sglpatch code),
sent in one exec channel by ``sglang_patcher.checks.run_l1``. It takes no arguments and prints ONE
JSON object on its last stdout line::

    {"checks": [{"name": str, "status": "passed" | "failed" | "skipped", "detail": str}, ...]}

and exits 0 even when a check fails (a crash is reported by the caller as a failed L1). Nothing here
needs a GPU, a model or a server; no worker is constructed.

What it proves, in order (each check depends on the imports of the first):

1. the patched modules import (``spec_info``, ``spec_registry``, ``server_args``,
   ``arg_groups.fields.spec``, ``arg_groups.speculative_hook``);
2. ``SpeculativeAlgorithm.from_string("DDTREE")`` returns the DDTREE member (an unpatched 0.5.23
   raises ``ValueError: Unknown speculative algorithm name``), and it is in the DFlash family;
3. the plugin registry still accepts registrations (0.5.23 refuses every ``register`` when an enum
   ``is_*`` method is missing on ``CustomSpecAlgo``);
4. ``--speculative-ddtree-*`` parse through SGLang's own ``prepare_server_args`` with their defaults
   (budget 256, topk unset = budget, hybrid override off) and explicit values;
5. the DDTREE validation accepts a valid configuration, refuses budget 0, refuses a hybrid
   Mamba/GDN target without ``--speculative-ddtree-allow-hybrid-unsafe`` and accepts it with it,
   and (revision 2) refuses a hybrid sliding-window (SWA) target and ``--enable-hisparse``;
6. (revision 2) the DDTree modules import from ``sglang.srt.speculative`` (relative imports
   inside the installed package): ``ddtree_reference``, ``ddtree_tree``, ``ddtree_accept``,
   ``ddtree_info``, ``ddtree_budget`` (revision 3), ``ddtree_worker``; (revision 4) the Triton
   kernels by pipeline stage import from ``sglang.kernels.ops.speculative`` (needs triton; until
   revision 3 they were one module, ``sglang.srt.speculative.ddtree_kernels``): ``ddtree_keys``,
   ``ddtree_prep``, ``ddtree_beam``, ``ddtree_verify_inputs``, ``ddtree_walk`` (revision 11:
   ``ddtree_verify_attention``);
7. (revision 2) ``create_worker`` resolves DDTREE to ``sglang.srt.speculative.ddtree_worker.
   DDTreeWorker`` (the class, not constructed), and that class subclasses ``DFlashWorkerV2``;
8. (revision 2) the sizes SGLang's own code now derives for DDTREE (budget 64, block 16): target
   verify width ``get_num_tokens_per_req_for_target_verify(16, False)`` = 65 = budget + 1 (also
   through ``spec_utils.resolve_num_tokens_per_req``), the draft runner's 16, DFLASH's 16; the
   capture input ``create_dummy_verify_input`` = a masked ``DDTreeVerifyInput`` of width 65 for the
   target and DFlash's mask-less block input for the draft; the KV reservation
   ``decode_reserve_tokens(16)`` = 16 + max(16, 65) = 81 for DDTREE and 32 for DFLASH
   (docs/ddtree-rev2.md Appendix A's self-check, without a model or GPU);
9. (revision 11) the triton backend hands DDTREE's target verify to DDTree's attention kernel, and
   the hook declines what it does not serve (a chain step's causal verify, a logit cap).

The width checks read SGLang's published ``spec`` config bag, so they publish the parsed record with
``get_context().set_server_args``. Where that fails only because a third-party module is missing
while computing the *derived* leaves of other namespaces (``transformers`` on a CPU host without it;
the ``spec`` namespace has no derived leaves), the bags are published without derived leaves and
the detail says so.

Where validation runs in 0.5.23: ``prepare_server_args`` only parses. ``ServerArgs.resolve_once``
runs ``arg_groups.pipeline.run_resolution_pipeline``, whose ``handle_speculative_decoding`` step
ends with ``SpeculativeAlgorithm.handle_server_args(server_args)``, which dispatches to
``speculative_hook._handle_ddtree``. This script calls ``handle_server_args`` on a record prepared
the way the pipeline prepares it (raw-input snapshot, empty declaration stash, input sealed). The
pipeline's earlier steps need the target checkpoint's config through ``ModelConfig``, which cannot be
built without the model (and, in 0.5.23, without torchvision and the CUDA stack); so the target's
model configuration is supplied through ``ModelConfig``'s fixture slot (``_model_config``, handed
back as is by ``model_config_of``) as an architecture-only stand-in: the DDTREE hybrid tests read
only ``hf_config.architectures`` (and ``layer_types``) and ``is_hybrid_swa``.

When a third-party module SGLang imports is missing (e.g. a ``--no-deps`` install), every check that
needs it is reported ``skipped`` with ``missing module <name>``: never ``passed``.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import logging
import os
import sys
import traceback
import types

PATCHED_MODULES = (
    "sglang.srt.speculative.spec_registry",
    "sglang.srt.speculative.spec_info",
    "sglang.srt.arg_groups.fields.spec",
    "sglang.srt.server_args",
    "sglang.srt.arg_groups.speculative_hook",
)

# Installed by revision 2 into sglang/srt/speculative/ (patchset.yaml new_files; ddtree_budget since
# revision 3) and, since revision 4, the Triton kernels into sglang/kernels/ops/speculative/.
DDTREE_PACKAGE = "sglang.srt.speculative"
DDTREE_MODULES = ("ddtree_reference", "ddtree_tree", "ddtree_accept", "ddtree_info", "ddtree_budget",
                  "ddtree_worker")
KERNELS_PACKAGE = "sglang.kernels.ops.speculative"
KERNEL_MODULES = ("ddtree_keys", "ddtree_prep", "ddtree_beam", "ddtree_verify_inputs", "ddtree_walk",
                  "ddtree_verify_attention")

DEFAULT_BUDGET = 256
# A dense target and a hybrid (GDN) one, by architecture name as in the checkpoints' config.json.
DENSE_ARCH = "Qwen3ForCausalLM"
HYBRID_ARCH = "Qwen3NextForCausalLM"
SWA_ARCH = "Gemma4ForCausalLM"      # a hybrid sliding-window target (configs/model_config.py)
# Sizes checked against SGLang's own derivations: DFlash block 16, DDTree budget 64.
BLOCK, BUDGET = 16, 64


class CheckFailed(Exception):
    """A check's expectation did not hold; the message is the check's detail."""


def _first_party(name: str | None) -> bool:
    return bool(name) and (name == "sglang" or name.startswith("sglang."))


def _import_all() -> tuple[dict, str | None]:
    """Import the patched modules. Returns (modules, missing third-party module name or None).

    Raises ImportError (or anything else) for a failure that is not a missing dependency.
    """
    import importlib

    mods = {}
    for name in PATCHED_MODULES:
        try:
            mods[name] = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if _first_party(exc.name):
                raise
            return mods, exc.name or str(exc)
    return mods, None


class _TargetModelConfig:
    """Stands in for ``sglang.srt.configs.model_config.ModelConfig`` of the target checkpoint: only
    its ``hf_config.architectures`` / ``layer_types`` are read by the DDTREE hybrid test."""

    def __init__(self, architecture: str, is_hybrid_swa: bool = False):
        self.hf_config = types.SimpleNamespace(architectures=[architecture], layer_types=[])
        self.is_hybrid_swa = is_hybrid_swa


def _server_args(extra: list[str]):
    """A ServerArgs parsed by SGLang's own ``prepare_server_args`` (a DDTREE config on CUDA)."""
    from sglang.srt.server_args import prepare_server_args

    argv = [
        # Never opened: parsing and this validation step read no checkpoint (nothing is written).
        "--model-path", "/nonexistent/sglpatch-l1/target",
        "--speculative-algorithm", "DDTREE",
        "--speculative-draft-model-path", "/nonexistent/sglpatch-l1/draft",
        "--speculative-num-draft-tokens", "16",
        "--device", "cuda",
        "--attention-backend", "triton",
        "--speculative-draft-attention-backend", "triton",
        *extra,
    ]
    return prepare_server_args(argv)


def _validate(extra: list[str], architecture: str, is_hybrid_swa: bool = False):
    """Run the DDTREE validation step the resolution pipeline runs; returns the record."""
    from sglang.srt.arg_groups.arg_utils import record_fields
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    sa = _server_args(extra)
    # As run_resolution_pipeline / resolve_once prepare the record before their handlers run.
    sa._raw_input = {f.name: getattr(sa, f.name) for f in record_fields(type(sa))}
    sa._resolved_overrides = []
    sa._model_config = _TargetModelConfig(architecture, is_hybrid_swa)
    sa._input_frozen = True
    try:
        SpeculativeAlgorithm.from_string(sa.speculative_algorithm).handle_server_args(sa)
    finally:
        sa._input_frozen = False
    return sa


def check_from_string(mods):
    SA = mods["sglang.srt.speculative.spec_info"].SpeculativeAlgorithm
    algo = SA.from_string("DDTREE")
    if algo is not SA.DDTREE or SA.from_string("ddtree") is not SA.DDTREE:
        raise CheckFailed(f"from_string('DDTREE') returned {algo!r}")
    facts = {"is_ddtree": algo.is_ddtree(), "is_dflash": algo.is_dflash(),
             "is_dflash_family": algo.is_dflash_family()}
    if facts != {"is_ddtree": True, "is_dflash": False, "is_dflash_family": True}:
        raise CheckFailed(f"unexpected predicates {facts}")
    if SA.DFLASH.is_ddtree():
        raise CheckFailed("DFLASH.is_ddtree() is True")
    return f"SpeculativeAlgorithm.{algo.name}; {facts}"


def check_registry(mods):
    SA = mods["sglang.srt.speculative.spec_info"].SpeculativeAlgorithm
    registry = mods["sglang.srt.speculative.spec_registry"]
    if registry.CustomSpecAlgo("X", lambda sa: None).is_ddtree() is not False:
        raise CheckFailed("CustomSpecAlgo.is_ddtree() is not False")
    name = f"SGLPATCH_L1_PROBE_{os.getpid()}"
    SA.register(name)(lambda server_args: object)
    algo = SA.from_string(name)
    if not isinstance(algo, registry.CustomSpecAlgo) or algo.is_ddtree():
        raise CheckFailed(f"from_string({name!r}) returned {algo!r}")
    return f"registered {name} in this process; CustomSpecAlgo.is_ddtree() is False"


def check_defaults(mods):
    sa = _server_args([])
    got = (sa.speculative_ddtree_budget, sa.speculative_ddtree_topk,
           sa.speculative_ddtree_allow_hybrid_unsafe)
    if got != (DEFAULT_BUDGET, None, False):
        raise CheckFailed(f"(budget, topk, allow_hybrid_unsafe) = {got}, "
                          f"want ({DEFAULT_BUDGET}, None, False)")
    return f"budget={got[0]} topk={got[1]} (= budget) allow_hybrid_unsafe={got[2]}"


def check_flags(mods):
    sa = _server_args(["--speculative-ddtree-budget", "64", "--speculative-ddtree-topk", "8",
                       "--speculative-ddtree-allow-hybrid-unsafe"])
    got = (sa.speculative_ddtree_budget, sa.speculative_ddtree_topk,
           sa.speculative_ddtree_allow_hybrid_unsafe)
    if got != (64, 8, True):
        raise CheckFailed(f"parsed {got}, want (64, 8, True)")
    return "--speculative-ddtree-budget 64 --speculative-ddtree-topk 8 " \
           "--speculative-ddtree-allow-hybrid-unsafe parsed"


def check_valid(mods):
    from sglang.srt.arg_groups.overrides import resolution_result, resolving_view

    sa = _validate([], DENSE_ARCH)
    steps = resolution_result(sa, "speculative_num_steps")
    topk = resolution_result(sa, "speculative_eagle_topk")
    if (steps, topk) != (1, 1):
        raise CheckFailed(f"DFlash resolution did not run: num_steps={steps} eagle_topk={topk}")
    spec = mods["sglang.srt.speculative.spec_info"].SpeculativeAlgorithm.DDTREE
    width = spec.resolve_max_speculative_num_draft_tokens(sa)
    if width != DEFAULT_BUDGET + 1:
        raise CheckFailed(f"max verify width {width}, want budget + 1 = {DEFAULT_BUDGET + 1}")
    return (f"{DENSE_ARCH}: accepted; num_steps=1 eagle_topk=1 "
            f"draft_backend={resolving_view(sa).speculative_draft_attention_backend} "
            f"max verify width={width}")


def _expect_refusal(extra, architecture, *needles, is_hybrid_swa=False):
    try:
        _validate(extra, architecture, is_hybrid_swa)
    except ValueError as exc:
        msg = str(exc)
        missing = [n for n in needles if n not in msg]
        if missing:
            raise CheckFailed(f"refused, but the message lacks {missing}: {msg}")
        return f"refused: {msg}"
    raise CheckFailed(f"{architecture} with {extra or 'defaults'} was accepted")


def check_budget_zero(mods):
    return _expect_refusal(["--speculative-ddtree-budget", "0"], DENSE_ARCH,
                           "--speculative-ddtree-budget")


def check_schedules_accepted(mods):
    """A budget schedule table (with a chain entry), ``auto`` and ``fixed`` pass validation; the
    module the schedule argument names (``ddtree_budget``) imports and reads them as the worker
    will, an unset schedule as ``auto`` (revision 13)."""
    base = ["--speculative-ddtree-budget", "16", "--speculative-ddtree-budget-schedule"]
    for schedule in ("1:16,4:8,16:chain", "auto", "fixed"):
        sa = _validate(base + [schedule], DENSE_ARCH)
        if sa.speculative_ddtree_budget_schedule != schedule:
            raise CheckFailed(f"--speculative-ddtree-budget-schedule {schedule} parsed as "
                              f"{sa.speculative_ddtree_budget_schedule!r}")
    budget = importlib.import_module("sglang.srt.speculative.ddtree_budget")
    table = budget.load_schedule("1:16,4:8,16:chain", floor=3, ceiling=16)
    if [table.budget_for(b) for b in (1, 4, 16)] != [16, 8, budget.CHAIN] or not budget.is_auto("auto"):
        raise CheckFailed(f"ddtree_budget reads the table as {table.text()!r}")
    source = {text: budget.schedule_source(text, budget=16, floor=3) for text in (None, "fixed")}
    if source != {None: budget.AUTO, "fixed": None}:
        raise CheckFailed(f"ddtree_budget reads an unset schedule and 'fixed' as {source} (want auto, fixed)")
    planner = budget.AutoBudgetPlanner(3, 16)
    return (f"1:16,4:8,16:chain, auto and fixed accepted; unset means auto, which chooses among "
            f"{list(planner.candidates)} (0 = chain)")


def check_schedule_refused(mods):
    return _expect_refusal(["--speculative-ddtree-budget-schedule", "1:0"], DENSE_ARCH,
                           "--speculative-ddtree-budget-schedule", "write 'chain'")


def check_hybrid_refused(mods):
    return _expect_refusal([], HYBRID_ARCH, HYBRID_ARCH, "--speculative-ddtree-allow-hybrid-unsafe")


def check_hybrid_override(mods):
    _validate(["--speculative-ddtree-allow-hybrid-unsafe"], HYBRID_ARCH)
    return f"{HYBRID_ARCH}: accepted with --speculative-ddtree-allow-hybrid-unsafe"


def check_swa_refused(mods):
    return _expect_refusal([], SWA_ARCH, "sliding-window", "--speculative-algorithm DFLASH",
                           is_hybrid_swa=True)


def check_hisparse_refused(mods):
    return _expect_refusal(["--enable-hisparse"], DENSE_ARCH, "--enable-hisparse")


def check_fa3_refused(mods):
    # fa3 picks tree or chain from speculative_eagle_topk (1 for DDTREE): it would verify a chain
    return _expect_refusal(["--attention-backend", "fa3"], DENSE_ARCH, "'fa3'", "--attention-backend triton")


def check_fa3_decode_refused(mods):
    return _expect_refusal(["--prefill-attention-backend", "triton", "--decode-attention-backend", "fa3"],
                           DENSE_ARCH, "decode attention backend is 'fa3'")


def check_flashinfer_accepted(mods):
    _validate(["--attention-backend", "flashinfer"], DENSE_ARCH)
    return f"{DENSE_ARCH}: accepted with --attention-backend flashinfer"


def _import_module_check(module: str, package: str = DDTREE_PACKAGE):
    def check(mods):
        import importlib

        mod = importlib.import_module(f"{package}.{module}")
        where = getattr(mod, "__file__", "") or ""
        folder = package.replace(".", os.sep)
        if f"{folder}{os.sep}{module}.py" not in where:
            raise CheckFailed(f"imported from {where}, not from {folder.replace(os.sep, '/')}/")
        return where
    return check


def _sglang_import(module: str):
    """Import an SGLang module; a missing third-party dependency surfaces as ModuleNotFoundError
    (reported as skipped by the runner), a first-party failure as a failure."""
    import importlib

    return importlib.import_module(module)


def check_create_worker(mods):
    SA = mods["sglang.srt.speculative.spec_info"].SpeculativeAlgorithm
    sa = _server_args([])
    cls = SA.DDTREE.create_worker(sa)        # returns the class; nothing is constructed
    name = f"{getattr(cls, '__module__', '?')}.{getattr(cls, '__qualname__', cls)!s}"
    if name != "sglang.srt.speculative.ddtree_worker.DDTreeWorker":
        raise CheckFailed(f"create_worker returned {name} (want sglang.srt.speculative.ddtree_worker."
                          "DDTreeWorker; never DFlash's worker)")
    return f"DDTREE -> {name} (not constructed)"


def check_worker_base(mods):
    base = _sglang_import("sglang.srt.speculative.dflash_worker_v2").DFlashWorkerV2
    worker = _sglang_import("sglang.srt.speculative.ddtree_worker")
    if not issubclass(worker.DDTreeWorker, base) or not worker.SGLANG_WORKER_AVAILABLE:
        raise CheckFailed(f"DDTreeWorker bases {worker.DDTreeWorker.__mro__[1:]} "
                          f"(SGLANG_WORKER_AVAILABLE={worker.SGLANG_WORKER_AVAILABLE})")
    return "DDTreeWorker -> DFlashWorkerV2 (" + ", ".join(
        c.__name__ for c in worker.DDTreeWorker.__mro__[1:4]) + ")"


_PUBLISHED = {}


def _publish_sizes_config():
    """Publish a parsed DDTREE record (block 16, budget 64) as SGLang's runtime config; returns a
    note ('' or why derived leaves were left out)."""
    if "note" in _PUBLISHED:
        return _PUBLISHED["note"]
    from sglang.srt import runtime_context

    sa = _server_args(["--speculative-ddtree-budget", str(BUDGET)])
    note = ""
    try:
        runtime_context.get_context().set_server_args(sa)
    except ModuleNotFoundError as exc:
        if _first_party(exc.name):
            raise
        # Only other namespaces' derived leaves need the missing module; publish without them.
        saved = runtime_context._install_derived_leaves
        runtime_context._install_derived_leaves = lambda tops, server_args: None
        try:
            runtime_context.get_context().set_server_args(sa)
        finally:
            runtime_context._install_derived_leaves = saved
        note = f" (config published without derived leaves: missing module {exc.name})"
    _PUBLISHED["note"] = note
    return note


def check_widths(mods):
    note = _publish_sizes_config()
    SA = mods["sglang.srt.speculative.spec_info"].SpeculativeAlgorithm
    got = {
        "target": SA.DDTREE.get_num_tokens_per_req_for_target_verify(BLOCK, False),
        "draft": SA.DDTREE.get_num_tokens_per_req_for_target_verify(BLOCK, True),
        "dflash": SA.DFLASH.get_num_tokens_per_req_for_target_verify(BLOCK, False),
    }
    want = {"target": BUDGET + 1, "draft": BLOCK, "dflash": BLOCK}
    try:    # the graph runner's entry point; spec_utils needs huggingface_hub
        spec_utils = _sglang_import("sglang.srt.speculative.spec_utils")
    except ModuleNotFoundError as exc:
        if _first_party(exc.name):
            raise
        note += f"; spec_utils.resolve_num_tokens_per_req not checked: missing module {exc.name}"
    else:
        got["resolved"] = spec_utils.resolve_num_tokens_per_req(
            phase="target_verify", spec_algorithm=SA.DDTREE, is_draft_worker=False)
        want["resolved"] = BUDGET + 1
    if got != want:
        raise CheckFailed(f"widths {got}, want {want}")
    return f"block {BLOCK}, budget {BUDGET}: {got}{note}"


def check_capture_input(mods):
    note = _publish_sizes_config()
    import torch

    spec_info = mods["sglang.srt.speculative.spec_info"]
    SA = spec_info.SpeculativeAlgorithm
    _sglang_import("sglang.srt.model_executor.forward_batch_info")   # the capture input needs it
    mask = torch.ones(128, dtype=torch.bool)
    target = spec_info.create_dummy_verify_input(SA.DDTREE, mask, BUDGET + 1, False)
    draft = spec_info.create_dummy_verify_input(SA.DDTREE, mask, BLOCK, True)
    got = {"target": (type(target).__name__, target.custom_mask is mask, target.draft_token_num),
           "draft": (type(draft).__name__, draft.custom_mask is None, draft.draft_token_num)}
    want = {"target": ("DDTreeVerifyInput", True, BUDGET + 1),
            "draft": ("DFlashVerifyInput", True, BLOCK)}
    if got != want:
        raise CheckFailed(f"(type, mask as wanted, width) {got}, want {want}")
    return f"target: masked DDTreeVerifyInput width {BUDGET + 1}; draft: DFlash block {BLOCK}{note}"


def check_reserve(mods):
    note = _publish_sizes_config()
    import torch

    v2 = _sglang_import("sglang.srt.speculative.dflash_info_v2")
    info = _sglang_import("sglang.srt.speculative.ddtree_info")
    if not hasattr(v2.DFlashDraftInputV2, "decode_reserve_tokens"):
        raise CheckFailed("DFlashDraftInputV2.decode_reserve_tokens is missing (0007 not applied)")
    draft = info.make_ddtree_draft_input(bonus_tokens=torch.tensor([1]), new_seq_lens=torch.tensor([5]))
    got = (draft.decode_reserve_tokens(BLOCK), v2.DFlashDraftInputV2.decode_reserve_tokens(draft, BLOCK))
    want = (BLOCK + max(BLOCK, BUDGET + 1), 2 * BLOCK)
    if got != want:
        raise CheckFailed(f"(DDTREE, DFLASH) reserve {got}, want {want}")
    return f"DDTREE {got[0]} = {BLOCK} + max({BLOCK}, {BUDGET + 1}); DFLASH {got[1]}{note}"


def check_graph_width_fallback(mods):
    """Revision 9 runs budget schedules beside the target's CUDA graphs: the decode graph runner
    must send a verify of a width it did not capture to the eager forward (the worker's start-up
    probe, here on this install's DecodeCudaGraphRunner class; no graph is captured)."""
    runner_mod = _sglang_import("sglang.srt.model_executor.runner.decode_cuda_graph_runner")
    worker = _sglang_import("sglang.srt.speculative.ddtree_worker")
    cls = runner_mod.DecodeCudaGraphRunner
    runner = cls.__new__(cls)          # nothing captured: the probe reads two fields
    runner.captured_req_width, runner.ragged_verify_mode = BUDGET + 1, False
    if not worker.replays_only_its_width(runner):
        raise CheckFailed("DecodeCudaGraphRunner.can_run_graph does not send a verify of another width "
                          "than its capture to the eager forward: DDTREE budget schedules and auto need "
                          "--disable-cuda-graph on this install (the server refuses them otherwise)")
    return (f"a runner captured at {BUDGET + 1} tokens per request sends {BUDGET + 2} to the eager "
            "forward: other schedule widths verify eagerly beside the graphs")


def check_triton_verify_route(mods):
    """Revision 11: the triton backend hands DDTREE's target verify to DDTree's kernel. Read from
    the installed triton_backend.py's syntax tree (importing it needs triton and transformers):
    ``TritonAttnBackend.__init__`` sets ``self.ddtree_verify_fwd`` under a test of
    ``spec_algorithm.is_ddtree()`` and ``forward_extend`` hands it the verify (tree verifies and,
    from revision 12, chain steps' causal verifies). Where triton imports, the hook is also run on
    two calls it must decline (no custom_mask and not causal; a logit-capped layer): it returns
    False and writes nothing, so ``extend_attention_fwd`` runs them. No kernel is launched."""
    import ast
    import importlib.util

    root = importlib.util.find_spec("sglang").submodule_search_locations[0]
    path = os.path.join(root, "srt", "layers", "attention", "triton_backend.py")
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    cls = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "TritonAttnBackend"), None)
    if cls is None:
        raise CheckFailed(f"no class TritonAttnBackend in {path}")
    methods = {n.name: n for n in cls.body if isinstance(n, ast.FunctionDef)}

    def sets_hook_under_ddtree(node: ast.AST) -> bool:
        for n in ast.walk(node):
            if isinstance(n, ast.If) and "is_ddtree" in ast.dump(n.test) and any(
                    isinstance(t, ast.Attribute) and t.attr == "ddtree_verify_fwd"
                    for s in ast.walk(n) if isinstance(s, ast.Assign) for t in s.targets):
                return True
        return False

    if "__init__" not in methods or not sets_hook_under_ddtree(methods["__init__"]):
        raise CheckFailed("TritonAttnBackend.__init__ does not set ddtree_verify_fwd for DDTREE (0011 not applied)")
    uses = [n for n in ast.walk(methods.get("forward_extend", cls)) if isinstance(n, ast.Attribute)
            and n.attr == "ddtree_verify_fwd"]
    if "forward_extend" not in methods or not uses:
        raise CheckFailed("TritonAttnBackend.forward_extend does not hand the target verify to ddtree_verify_fwd")
    detail = "TritonAttnBackend: DDTREE's target verify -> ddtree_verify_fwd"
    try:
        kernel = _sglang_import("sglang.kernels.ops.speculative.ddtree_verify_attention")
    except ModuleNotFoundError as exc:
        if _first_party(exc.name):
            raise
        return detail + f"; the hook's declines not run: missing module {exc.name}"
    import torch

    q = torch.zeros(4, 4, 8)
    kv = torch.zeros(4, 2, 8)
    o = torch.full_like(q, 7.0)
    ind = torch.tensor([0, 4], dtype=torch.int32)
    args = (q, kv, kv, o, kv, kv, ind, torch.zeros(2, dtype=torch.int32), torch.zeros(0, dtype=torch.int64))
    unmasked = kernel.ddtree_verify_fwd(*args, None, False, None, 4)
    capped = kernel.ddtree_verify_fwd(*args, torch.ones(16, dtype=torch.bool), True,
                                      torch.tensor([0, 16]), 4, logit_cap=30.0)
    if unmasked or capped or not bool((o == 7.0).all()):
        raise CheckFailed(f"ddtree_verify_fwd took a call it must decline (non-causal without a mask "
                          f"{unmasked}, logit cap {capped})")
    return detail + "; a non-causal call without a mask and a logit-capped layer fall back to extend_attention_fwd"


CHECKS = (
    ("from_string DDTREE", check_from_string),
    ("plugin registry accepts registrations", check_registry),
    ("ddtree server-arg defaults", check_defaults),
    ("ddtree server-arg flags", check_flags),
    ("validation accepts a valid DDTREE config", check_valid),
    ("validation refuses budget 0", check_budget_zero),
    ("validation accepts a budget schedule and auto", check_schedules_accepted),
    ("validation refuses a bad budget schedule", check_schedule_refused),
    ("validation refuses a hybrid target without the override", check_hybrid_refused),
    ("validation accepts a hybrid target with the override", check_hybrid_override),
    ("validation refuses a hybrid SWA target", check_swa_refused),
    ("validation refuses --enable-hisparse", check_hisparse_refused),
    ("validation refuses --attention-backend fa3", check_fa3_refused),
    ("validation refuses a fa3 decode backend", check_fa3_decode_refused),
    ("validation accepts --attention-backend flashinfer", check_flashinfer_accepted),
    *((f"import {DDTREE_PACKAGE}.{m}", _import_module_check(m)) for m in DDTREE_MODULES),
    *((f"import {KERNELS_PACKAGE}.{m}", _import_module_check(m, KERNELS_PACKAGE)) for m in KERNEL_MODULES),
    ("create_worker resolves DDTREE to DDTreeWorker", check_create_worker),
    ("DDTreeWorker subclasses DFlashWorkerV2", check_worker_base),
    ("target verify width is budget + 1", check_widths),
    ("capture input carries the tree mask", check_capture_input),
    ("KV reservation is block + max(block, budget + 1)", check_reserve),
    ("other verify widths run eagerly beside the CUDA graphs", check_graph_width_fallback),
    ("the triton backend routes DDTREE's tree verify to DDTree's kernel", check_triton_verify_route),
)
# every result's name, in the order run() reports them
CHECK_NAMES = ("import patched modules", *(name for name, _ in CHECKS))


def _tail(exc: BaseException) -> str:
    lines = traceback.format_exception(type(exc), exc, exc.__traceback__)
    return "".join(lines).strip().splitlines()[-1][:2000]


def _third_party_origin(exc: BaseException) -> str | None:
    """The file of the innermost frame when it is outside the sglang package (the error comes from
    the host's environment, e.g. a torchvision built for another torch), else None."""
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return None
    inner = frames[-1].filename.replace(os.sep, "/")
    if "/sglang/" in inner or inner.endswith("l1_ddtree.py") or inner.startswith("<"):
        return None
    return inner


def _failure_detail(exc: BaseException) -> str:
    """A failed check's detail; an error raised inside a third-party package says it is the host's
    environment, not the patch, and what to do."""
    origin = _third_party_origin(exc)
    if origin is None:
        return _tail(exc)
    return (f"environment: the error is raised in {origin}, a package SGLang imports, not in sglang "
            f"itself ({_tail(exc)}); the unpatched release would fail the same way: repair the host's "
            "Python environment (e.g. a torchvision built for its torch) and apply again")


def run() -> list[dict]:
    results = []

    def add(name, status, detail):
        results.append({"name": name, "status": status, "detail": detail})

    try:
        mods, missing = _import_all()
    except Exception as exc:  # an import error: the patched tree is broken, or the environment
        add("import patched modules", "failed", _failure_detail(exc))
        for name, _ in CHECKS:
            add(name, "skipped", "the patched modules do not import")
        return results
    if missing is not None:
        for name in CHECK_NAMES:
            add(name, "skipped", f"missing module {missing}")
        return results
    add("import patched modules", "passed", ", ".join(PATCHED_MODULES))

    for name, fn in CHECKS:
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err):
                detail = fn(mods)
            add(name, "passed", detail)
        except SystemExit as exc:  # argparse exits on an unknown flag (an unpatched tree)
            said = err.getvalue().strip().splitlines()
            add(name, "failed", f"argument parsing exited with {exc.code}: "
                                f"{said[-1] if said else ''}")
        except CheckFailed as exc:
            add(name, "failed", str(exc))
        except ModuleNotFoundError as exc:
            if _first_party(exc.name):
                add(name, "failed", _tail(exc))
            else:
                add(name, "skipped", f"missing module {exc.name}")
        except Exception as exc:
            add(name, "failed", _failure_detail(exc))
    return results


def main() -> int:
    # SGLang logs its resolution decisions; keep stdout for the one JSON line.
    logging.disable(logging.CRITICAL)
    captured = io.StringIO()
    with contextlib.redirect_stdout(captured):
        results = run()
    sys.stderr.write(captured.getvalue())
    sys.stdout.write(json.dumps({"checks": results}) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
