"""DDTreeWorker's contract with SGLang 0.5.23's code, checked statically against the real wheel
(the environment's SGLang; the worker's 0.5.21 / 0.5.22 branches are proven by the live tests).

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


# Names of older releases' DFlashWorkerV2 (0.5.21, 0.5.22) -> the one method that reads them, where
# the worker has already detected which DFlashWorkerV2 it runs on.
OLDER_RELEASE_ATTRS = {"draft_owns_attention": "_draft_scope_factory"}


def test_every_self_attribute_exists_on_dflash_or_is_ours():
    reads, writes = _self_attrs(WORKER)
    own = {f.name for f in WORKER.body if isinstance(f, ast.FunctionDef)} | writes
    base_src = inspect.getsource(dflash)
    base_assigned = set(re.findall(r"self\.([A-Za-z_][A-Za-z0-9_]*)\s*(?::[^=\n]*)?=", base_src))
    readers = {f.name: _self_attrs(f)[0] for f in WORKER.body if isinstance(f, ast.FunctionDef)}
    missing = []
    for attr in sorted(reads - own):
        if hasattr(dflash.DFlashWorkerV2, attr) or attr in base_assigned:
            continue
        if attr in OLDER_RELEASE_ATTRS:
            assert {f for f, r in readers.items() if attr in r} == {OLDER_RELEASE_ATTRS[attr]}, attr
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
    "target_translator.plan": "sglang.srt.mem_cache.kv_index_translator.KVIndexTranslator/plan",
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
    """Every import of the decode step resolves, but those of an ``except ImportError`` fallback
    (another release's name for the same thing: it need not exist in this SGLang)."""
    step = next(f for f in WORKER.body if isinstance(f, ast.FunctionDef) and f.name == "_ddtree_decode_step")
    import importlib

    fallbacks = {id(n) for t in ast.walk(step) if isinstance(t, ast.Try) for h in t.handlers
                 if ast.unparse(h.type) == "ImportError" for n in ast.walk(h)}
    checked = 0
    for node in ast.walk(step):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and id(node) not in fallbacks:
            mod = importlib.import_module(node.module)
            for alias in node.names:
                assert hasattr(mod, alias.name), f"{node.module}.{alias.name}"
                checked += 1
    assert fallbacks and checked >= 15, checked


CHECK_SCRIPT = r'''
import json, torch
from sglang.srt.server_args import prepare_server_args
from sglang.srt.runtime_context import get_context
sa = prepare_server_args(["--model-path", "dummy-model", "--speculative-algorithm", "DDTREE",
    "--speculative-num-draft-tokens", "16", "--speculative-ddtree-budget", "64",
    "--speculative-draft-model-path", "dummy-draft"])
get_context().set_server_args(sa)
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm, create_dummy_verify_input
from sglang.srt.speculative.spec_utils import resolve_num_tokens_per_req
from sglang.srt.speculative.dflash_info_v2 import DFlashDraftInputV2
from sglang.srt.speculative.ddtree_info import make_ddtree_draft_input
A = SpeculativeAlgorithm.from_string("DDTREE")
m = torch.ones(100, dtype=torch.bool)
vi = create_dummy_verify_input(A, m, 65, False)
dv = create_dummy_verify_input(A, m, 16, True)
di = make_ddtree_draft_input(bonus_tokens=torch.tensor([1]), new_seq_lens=torch.tensor([5]))
print(json.dumps(dict(
    target=A.get_num_tokens_per_req_for_target_verify(16, False),
    draft=A.get_num_tokens_per_req_for_target_verify(16, True),
    resolved=resolve_num_tokens_per_req(phase="target_verify", spec_algorithm=A, is_draft_worker=False),
    capture=[type(vi).__name__, vi.custom_mask is m, vi.draft_token_num],
    draft_capture=[type(dv).__name__, dv.custom_mask is None, dv.draft_token_num],
    worker=[A.create_worker(sa).__name__],
    reserve=[di.decode_reserve_tokens(16), DFlashDraftInputV2.decode_reserve_tokens(di, 16)],
    dflash=SpeculativeAlgorithm.DFLASH.get_num_tokens_per_req_for_target_verify(16, False),
)))
'''


@pytest.mark.slow
def test_revision_2_wires_ddtree_through_sglangs_own_code(tmp_path):
    """docs/ddtree-rev2.md's Appendix A hunks, applied after revision 1 to a copy of the wheel's
    sglang package, make SGLang's own code return DDTree's widths, capture input, worker and
    reservation (a subprocess imports the patched copy)."""
    import os
    import shutil
    import subprocess
    import sys

    import sglang

    repo = Path(__file__).resolve().parents[2]
    # Revision 2 as shipped (the series with Appendix A as 0006-0008, and the six modules),
    # rendered by the project's own strict applier onto a copy of this sglang tree.
    from sglang_patcher.patchset import load_patchset

    pkg_root = Path(sglang.__file__).parent.parent
    site = tmp_path / "site"
    shutil.copytree(Path(sglang.__file__).parent, site / "sglang",
                    ignore=shutil.ignore_patterns("__pycache__"))

    def read(rel):
        f = pkg_root / rel
        return f.read_bytes() if f.is_file() else None

    result = load_patchset(repo / "patchsets" / "ddtree").render("0.5.23", read)
    for rel, change in result.files.items():
        dest = site / rel
        if change.new is None:
            dest.unlink(missing_ok=True)
        else:
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(change.new)
    env = dict(os.environ, PYTHONPATH=str(site))
    out = subprocess.run([sys.executable, "-c", CHECK_SCRIPT], env=env, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    import json

    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got == dict(
        target=65, draft=16, resolved=65,
        capture=["DDTreeVerifyInput", True, 65], draft_capture=["DFlashVerifyInput", True, 16],
        worker=["DDTreeWorker"], reserve=[81, 32], dflash=16,
    )
