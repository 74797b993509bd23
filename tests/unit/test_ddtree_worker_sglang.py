"""DDTreeWorker's contract with SGLang 0.5.23's code, checked statically against the real wheel.

No GPU server can run here, so this proves what can be proven without one: the worker subclasses
the real ``DFlashWorkerV2``; the hooks it overrides keep DFlash's signatures; every ``self.X`` it
reads exists on DFlash's worker (so a typo or an upstream rename fails here, not on a GPU host);
and every keyword argument it passes to an SGLang callable is a parameter of that callable.
Skipped unless ``sglang.srt.speculative.dflash_worker_v2`` imports (SGLang's import-time deps; see
test_ddtree_info_sglang.py for the environment).
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.sglang

dflash = pytest.importorskip("sglang.srt.speculative.dflash_worker_v2")

from patchsets.ddtree.modules import ddtree_worker as Wk  # noqa: E402

SOURCE = Path(Wk.__file__).read_text()
TREE = ast.parse(SOURCE)
WORKER = next(n for n in TREE.body if isinstance(n, ast.ClassDef) and n.name == "DDTreeWorker")


def test_worker_subclasses_dflash_worker_v2():
    assert Wk.SGLANG_WORKER_AVAILABLE
    assert issubclass(Wk.DDTreeWorker, dflash.DFlashWorkerV2)


@pytest.mark.parametrize(
    "name",
    ["_maybe_build_draft_sampler", "_make_next_draft_input_prefill", "_make_next_draft_input_decode",
     "forward_batch_generation"],
)
def test_overridden_hooks_keep_dflash_signatures(name):
    ours = inspect.signature(getattr(Wk.DDTreeWorker, name))
    theirs = inspect.signature(getattr(dflash.DFlashWorkerV2, name))
    assert [(p.name, p.kind) for p in ours.parameters.values()] == [
        (p.name, p.kind) for p in theirs.parameters.values()
    ]


def _self_attrs(node):
    reads, writes = set(), set()
    for n in ast.walk(node):
        if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "self":
            (writes if isinstance(n.ctx, ast.Store) else reads).add(n.attr)
    return reads, writes


def test_every_self_attribute_exists_on_dflash_or_is_ours():
    reads, writes = _self_attrs(WORKER)
    own = {f.name for f in WORKER.body if isinstance(f, ast.FunctionDef)} | writes
    base_src = inspect.getsource(dflash)
    base_assigned = set(re.findall(r"self\.([A-Za-z_][A-Za-z0-9_]*)\s*(?::[^=\n]*)?=", base_src))
    missing = []
    for attr in sorted(reads - own):
        if hasattr(dflash.DFlashWorkerV2, attr) or attr in base_assigned:
            continue
        missing.append(attr)
    # DFlashWorkerV2.__getattr__ forwards unknown names to the target worker; allow only the
    # ones that are the target worker's by design.
    assert missing == [], f"not defined by DFlashWorkerV2: {missing}"


def _resolve(expr: str):
    """Resolve the callee strings used below to SGLang objects."""
    import importlib

    mod, _, attr = expr.rpartition(".")
    obj = importlib.import_module(mod)
    for part in attr.split("/"):
        obj = getattr(obj, part)
    return obj


# callee text in ddtree_worker -> the SGLang object it names
CALLEES = {
    "assign_extend_cache_locs_func": "sglang.kernels.ops.speculative.cache_locs.assign_extend_cache_locs_func",
    "ForwardBatch": "sglang.srt.model_executor.forward_batch_info.ForwardBatch",
    "GenerationBatchResult": "sglang.srt.managers.utils.GenerationBatchResult",
    "apply_dflash_verify_logits_adjustments":
        "sglang.srt.speculative.dflash_utils.apply_dflash_verify_logits_adjustments",
    "build_speculative_verify_target_probs":
        "sglang.srt.speculative.dflash_utils.build_speculative_verify_target_probs",
    "build_grammar_vocab_mask": "sglang.srt.speculative.spec_utils.build_grammar_vocab_mask",
    "GrammarTree.from_device": "sglang.srt.speculative.spec_utils.GrammarTree/from_device",
    "compute_spec_logprobs": "sglang.srt.layers.logprob_processor.compute_spec_logprobs",
    "self.target_worker.model_runner.kv_index_translator.plan":
        "sglang.srt.mem_cache.kv_index_translator.KVIndexTranslator/plan",
    "kv_loc_plan.reads_from": "sglang.srt.mem_cache.kv_loc_plan.KVLocPlan/reads_from",
    "draft_plan.bind": "sglang.srt.mem_cache.kv_loc_plan.KVLocPlan/bind",
    "kv_loc_plan.write_ids": "sglang.srt.mem_cache.kv_loc_plan.KVLocPlan/write_ids",
    "verify_input.prepare_for_verify": "sglang.srt.speculative.dflash_info.DFlashVerifyInput/prepare_for_verify",
    "self._append_target_hidden_to_draft_kv_by_loc":
        "sglang.srt.speculative.dflash_worker_v2.DFlashWorkerV2/_append_target_hidden_to_draft_kv_by_loc",
    "self._rebuild_compact_draft_cache":
        "sglang.srt.speculative.dflash_worker_v2.DFlashWorkerV2/_rebuild_compact_draft_cache",
    "self._fill_compact_seq_lens_cpu_bound":
        "sglang.srt.speculative.dflash_worker_v2.DFlashWorkerV2/_fill_compact_seq_lens_cpu_bound",
    "self._update_target_mamba_state_after_verify":
        "sglang.srt.speculative.dflash_worker_v2.DFlashWorkerV2/_update_target_mamba_state_after_verify",
    "self.target_worker.forward_batch_generation":
        "sglang.srt.managers.tp_worker.TpModelWorker/forward_batch_generation",
}


def _params(obj):
    if inspect.isclass(obj) and dataclasses.is_dataclass(obj):
        return {f.name for f in dataclasses.fields(obj)}, False
    sig = inspect.signature(obj)
    var_kw = any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values())
    return set(sig.parameters), var_kw


def test_keyword_arguments_match_sglang_signatures():
    seen = set()
    problems = []
    for call in (n for n in ast.walk(WORKER) if isinstance(n, ast.Call)):
        text = ast.unparse(call.func)
        if text not in CALLEES:
            continue
        seen.add(text)
        params, var_kw = _params(_resolve(CALLEES[text]))
        for kw in call.keywords:
            if kw.arg is not None and kw.arg not in params and not var_kw:
                problems.append(f"{text}({kw.arg}=...)")
    assert problems == []
    assert seen == set(CALLEES), f"mapped but not called: {set(CALLEES) - seen}"


def test_lazy_imports_of_the_decode_step_resolve():
    step = next(f for f in WORKER.body if isinstance(f, ast.FunctionDef) and f.name == "_ddtree_decode_step")
    import importlib

    for node in ast.walk(step):
        if isinstance(node, ast.ImportFrom) and node.level == 0:
            mod = importlib.import_module(node.module)
            for alias in node.names:
                assert hasattr(mod, alias.name), f"{node.module}.{alias.name}"
