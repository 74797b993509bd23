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
