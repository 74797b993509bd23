"""A DDTREE configuration the patchset refuses stops ``python -m sglang.launch_server`` at start-up
with the patchset's own clear error (not a traceback from deep inside SGLang), on the live venv.

The refusals exist in unit tests too (``tests/unit/test_l1_check_ddtree.py`` and the L1 check);
here they are proven where users meet them: a real server start.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.support import live_env, live_sglang as ls

CASES = {
    "budget-0": (["--speculative-ddtree-budget", "0"], "--speculative-ddtree-budget >= 1"),
    "topk-0": (["--speculative-ddtree-budget", "8", "--speculative-ddtree-topk", "0"],
               "--speculative-ddtree-topk >= 1"),
    "torch-native-verify": (["--attention-backend", "torch_native"],
                            "Pass --attention-backend triton"),
    "hybrid-target": ([], "DDTREE does not support hybrid recurrent targets yet"),
    "graph-memory-negative": (["--speculative-ddtree-graph-memory", "-1"],
                              "give the GiB the narrower verify widths' CUDA graphs may take"),
}


def hybrid_target(target: Path, where: Path) -> Path:
    """The fixture's target with a recurrent architecture name (Mamba) in its config: validation
    reads only the config, so the refusal comes before any weight is loaded. (A hybrid GDN name
    such as Qwen3NextForCausalLM stops earlier on this CPU platform, at SGLang's own Mamba
    extra-buffer check, which a CUDA host passes.)"""
    dest = where / "hybrid-target"
    shutil.copytree(target, dest)
    cfg = json.loads((dest / "config.json").read_text())
    cfg["architectures"] = ["MambaForCausalLM"]
    (dest / "config.json").write_text(json.dumps(cfg, indent=1))
    return dest


@pytest.mark.parametrize("case", sorted(CASES))
def test_refused_configuration_stops_the_server_with_its_error(case: str, ddtree_venv, live_models,
                                                               tmp_path: Path) -> None:
    fx = live_models["random"]
    flags, message = CASES[case]
    target = hybrid_target(fx.target, tmp_path) if case == "hybrid-target" else fx.target
    argv = ls.server_argv(ddtree_venv.python, target, port=1,   # never bound: refused first
                          extra=ls.speculative_flags(fx.drafts[4], "DDTREE") + flags)
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=300,
                          env=live_env.sglang_env(), cwd=tmp_path)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, f"the server accepted {case}:\n{out[-2000:]}"
    assert message in out, out[-3000:]
    assert "ValueError" in out, out[-3000:]


# Budget schedules beside the target's CUDA graphs (ddtree revision 9): other widths than the
# captured one verify eagerly because SGLang's decode graph runner sends them there itself. No
# graph can be captured on this CPU; the installed worker's probe runs against SGLang's real
# DecodeCudaGraphRunner class of the release (an instance with the two fields the probe reads),
# and — the negative control — against that same class with its uniform-width lines taken out.
GRAPH_WIDTH_PROBE = r"""
import inspect, json, textwrap
from sglang.srt.model_executor.runner import decode_cuda_graph_runner as dcgr
from sglang.srt.speculative import ddtree_worker as wk
from sglang.srt.speculative.ddtree_budget import parse_schedule

def runner(cls):
    r = cls.__new__(cls)
    r.captured_req_width, r.ragged_verify_mode = 17, False
    return r

out = {}
real = runner(dcgr.DecodeCudaGraphRunner)
out["probe"] = wk.replays_only_its_width(real)
sched = parse_schedule("1:16,4:3,16:chain", floor=3, ceiling=16)
out["said"] = wk.check_widths_beside_graphs(sched, real, block_size=4)
src = textwrap.dedent(inspect.getsource(dcgr.DecodeCudaGraphRunner.can_run_graph))
line = "spec_info.num_tokens_per_req != self.captured_req_width"
out["invariant_found"] = line in src
scope = dict(vars(dcgr))
exec(src.replace(line, "False"), scope)
class WithoutInvariant(dcgr.DecodeCudaGraphRunner):
    can_run_graph = scope["can_run_graph"]
control = runner(WithoutInvariant)
out["control_probe"] = wk.replays_only_its_width(control)
try:
    wk.check_widths_beside_graphs(sched, control, block_size=4)
    out["control_refused"] = ""
except ValueError as exc:
    out["control_refused"] = str(exc)
print("PROBE " + json.dumps(out))
"""


def probe_graph_widths(python: str) -> dict:
    """Run :data:`GRAPH_WIDTH_PROBE` with ``python`` (a patched live venv's): its JSON answer."""
    proc = subprocess.run([python, "-c", GRAPH_WIDTH_PROBE], capture_output=True, text=True, timeout=300,
                          env=live_env.sglang_env())
    line = next((x for x in proc.stdout.splitlines() if x.startswith("PROBE ")), None)
    assert proc.returncode == 0 and line, proc.stdout[-2000:] + proc.stderr[-3000:]
    return json.loads(line[len("PROBE "):])


def assert_other_widths_go_eager(found: dict) -> None:
    assert found["invariant_found"], "SGLang's can_run_graph no longer has the uniform-width line"
    assert found["probe"] is True, found
    assert found["said"] == ["DDTREE: the target's CUDA graphs replay the verify at budget 16 (17 tokens per "
                             "request); steps at budgets [chain, 3] verify eagerly (a width the graphs were "
                             "not captured at)."], found
    # negative control: the same runner without the invariant would replay other widths: refused
    assert found["control_probe"] is False, found
    assert "would replay a graph captured at another verify width" in found["control_refused"], found


def test_schedule_widths_beside_cuda_graphs_probe_sglangs_own_graph_runner(ddtree_venv) -> None:
    assert_other_widths_go_eager(probe_graph_widths(ddtree_venv.python))
