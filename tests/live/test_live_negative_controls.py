"""Negative controls: the live equality check must fail when DDTREE is deliberately broken.

Each fault is injected (test-only) into the installed module of a private copy of the
ddtree-patched venv, and the same engine configuration as in the greedy tests runs there. The
comparison with the target alone must find a difference; otherwise the equality tests could not
fail and would prove nothing. Also: revision 2 of the patchset, applied by sglpatch, must fail to
start a DDTREE engine (the crash revision 3 fixes), so the live tests do catch start-up faults.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.live import matrix
from tests.support import live_env, live_sglang as ls, venvs


@dataclass(frozen=True)
class Fault:
    """Replace ``old`` (exactly once) by ``new`` in the installed ``sglang/srt/speculative/<module>``."""

    module: str
    old: str
    new: str
    fixture: str
    arm: str
    phases: tuple[str, ...] = ("single", "batch")     # the phases the broken engine runs


FAULTS = {
    # the walk reads the target's choice at label cur + 1 instead of at the current node
    "walk-off-by-one": Fault(
        "ddtree_accept.py",
        "        t = torch.gather(tgt, 1, cur[:, None])  # [bs, 1]\n",
        "        t = torch.gather(tgt, 1, (cur[:, None] + 1).clamp(max=N1 - 1))  # injected fault\n",
        "trained", "ddtree-b4-n8", ("single",)),   # wrong from the first verify: single requests suffice
    # the same fault under the auto planner: its tree steps (3-16 nodes, between chain steps)
    # go through the walk too, so its equality check can fail (single requests suffice)
    "walk-off-by-one-auto": Fault(
        "ddtree_accept.py",
        "        t = torch.gather(tgt, 1, cur[:, None])  # [bs, 1]\n",
        "        t = torch.gather(tgt, 1, (cur[:, None] + 1).clamp(max=N1 - 1))  # injected fault\n",
        "trained", "ddtree-b4-auto", ("single",)),
    # the verify mask lets every tree node see every other node (siblings, descendants)
    "all-true-tree-mask": Fault(
        "ddtree_tree.py",
        "    out.scatter_(0, idx.reshape(-1), tree.tree_mask.reshape(-1))\n",
        "    pass  # injected fault: the tree block stays all True\n",
        "random", "ddtree-b4-n32", ("single",)),   # the root sees 32 drafted keys: every verify
    # the accepted path's target KV is left where the verify wrote it
    "no-kv-compaction": Fault(
        "ddtree_worker.py",
        "        self.model_runner.token_to_kv_pool.move_kv_cache(step.kv_moves.tgt_loc, step.kv_moves.src_loc)\n",
        "        pass  # injected fault: no KV compaction\n",
        "random", "ddtree-b4-n32"),
}


def inject(venv: Path, fault: Fault) -> None:
    path = venvs.site_packages_of(venv) / "sglang" / "srt" / "speculative" / fault.module
    text = path.read_text()
    assert text.count(fault.old) == 1, f"{fault.module}: the fault's anchor is not there once"
    path.write_text(text.replace(fault.old, fault.new))
    for pyc in (path.parent / "__pycache__").glob(f"{path.stem}.*.pyc"):
        pyc.unlink()


@pytest.mark.parametrize("name", sorted(FAULTS))
def test_injected_fault_breaks_token_equality(name: str, ddtree_venv, live_models, greedy_runs,
                                             tmp_path: Path) -> None:
    fault = FAULTS[name]
    fx = live_models[fault.fixture]
    arm = next(a for a in matrix.ARMS[fault.fixture] if a.name == fault.arm)
    broken = venvs.clone_venv(ddtree_venv.venv, tmp_path / "venv", share_deps=True)
    try:
        inject(broken.venv, fault)
        spec = matrix.engine_spec(fx, arm)
        spec = ls.EngineSpec(spec.name, spec.kwargs, tuple(p for p in spec.phases if p.name in fault.phases))
        runs = ls.run_engines(str(broken), [spec], tmp_path / "run")
    finally:
        venvs.remove_venv(broken.venv, background=True)
    run, base = runs[arm.name], greedy_runs[fault.fixture]["target"]
    assert base.ok
    assert run.ok, f"the broken engine did not run at all ({run.error}): a control must reach the comparison"
    healthy = greedy_runs[fault.fixture][arm.name]
    assert healthy.ok and not [p for ph in fault.phases for p in ls.token_mismatches(base, healthy, ph)], \
        "the unbroken configuration must match for the control to mean anything"
    problems = [p for ph in fault.phases for p in ls.token_mismatches(base, run, ph)]
    assert problems, f"fault {name!r} went unnoticed: the equality check cannot fail"


def test_revision_2_cannot_start_a_ddtree_engine(live_pristine, live_models, tmp_path: Path) -> None:
    """Revision 2 read the target's attention backend before SGLang 0.5.23 creates it."""
    r2 = live_env.patched_copy(live_pristine, tmp_path, patchset="ddtree@2")
    try:
        fx = live_models["random"]
        arm = next(a for a in matrix.ARMS["random"] if a.name == "ddtree-b4-n3")
        # revision 2 has no budget schedule argument (`fixed` is revision 13's word): leave it out
        arm = dataclasses.replace(arm, extra=tuple(kv for kv in arm.extra if kv not in matrix.FIXED))
        runs = ls.run_engines(r2.python, [matrix.engine_spec(fx, arm)], tmp_path / "run", timeout=600)
    finally:
        venvs.remove_venv(r2.venv, background=True)
    run = runs[arm.name]
    assert not run.ok
    assert "attn_backend" in run.error + run.traceback + run.log, run.log[-3000:]
