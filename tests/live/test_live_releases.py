"""DDTREE on every other SGLang release the patchset targets, in a live engine on the CPU.

The greedy matrix (``test_live_greedy.py``) runs on 0.5.23. For each other release with a CPU
server set here (``tests/live/requirements-sglang-<release>-cpu-server.txt``; today 0.5.22 and
0.5.21) a pristine venv of that release is patched by a real ``sglpatch apply ddtree`` — which
picks the release's own series — and one driver process runs the trained fixture's arms
(:func:`arm_names`): the target alone and DDTREE under a budget schedule with chain steps
(``ddtree-b4-sched``: 16 nodes alone, DFlash's chain at 2-3 requests, 8 nodes from 4). Its single
phase verifies trees of 16 nodes, its batch phase trees of 8 (what ``ddtree-b4-n8`` covers) and
its ragged phase goes tree -> chain -> tree within each request: DFlash's own chain step inside
the DDTREE worker (what the DFLASH arm's step is). ``RELEASE_ARMS`` can give a release more arms
(DFLASH and ``ddtree-b4-n8`` ran on 0.5.22 until the CI's 45 minutes asked for their ~2.5 min).
Measured on an idle 2-core machine: 0.5.21's engines 67 s and the whole release 2:17 (3 tests).

Every token must equal the target's, and trees must accept drafts (more than DFLASH's chain where
the release runs DFLASH). Negative control: the walk made off by one in that release's installed
module breaks the equality (on ``ddtree-b4-n8`` where the release runs it, else on
``ddtree-b4-sched``; single requests, as in the greedy matrix's control).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.live import matrix
from tests.live.test_live_negative_controls import FAULTS, inject
from tests.live.test_live_startup_errors import assert_other_widths_go_eager, probe_graph_widths
from tests.support import live_env, live_sglang as ls, venvs

OTHER_RELEASES = [v for v in live_env.live_releases() if v != venvs.SGLANG_VERSION]
FULL_ARMS = ("target", "dflash-b4", "ddtree-b4-n8", "ddtree-b4-sched")   # for RELEASE_ARMS: with DFLASH
LEAN_ARMS = ("target", "ddtree-b4-sched")
RELEASE_ARMS: dict[str, tuple[str, ...]] = {}     # every other release: LEAN_ARMS


def arm_names(version: str) -> tuple[str, ...]:
    """The trained fixture's arms that run on ``version`` (see the module docstring)."""
    return RELEASE_ARMS.get(version, LEAN_ARMS)


def arms(version: str) -> list[matrix.Arm]:
    return [a for a in matrix.ARMS["trained"] if a.name in arm_names(version)]


@pytest.fixture(scope="module", params=OTHER_RELEASES)
def release_runs(request, live_models, tmp_path_factory):
    """(release, patched venv, {arm: EngineRun}) for one release other than 0.5.23."""
    version = request.param
    try:
        pristine = live_env.pristine_live_venv(version)
    except RuntimeError as exc:
        if os.environ.get("CI"):
            raise
        pytest.skip(f"cannot build the live CPU SGLang {version} venv: {exc}")
    where = tmp_path_factory.mktemp(f"live-{version}")
    patched = live_env.patched_copy(pristine, where)
    fx = live_models["trained"]
    runs = ls.run_engines(patched.python, [matrix.engine_spec(fx, a) for a in arms(version)], where / "runs")
    yield version, patched, runs
    venvs.remove_venv(patched.venv, background=True)


def _sglang_version(python: str) -> str:
    out = subprocess.run([python, "-c", "import importlib.metadata as m; print(m.version('sglang'))"],
                         capture_output=True, text=True, env=live_env.sglang_env(), timeout=120)
    return out.stdout.strip()


def test_ddtree_tokens_equal_the_target_on_the_release(release_runs) -> None:
    version, patched, runs = release_runs
    assert _sglang_version(patched.python) == version
    base = runs["target"]
    assert base.ok, f"the target alone did not run on {version}: {base.error}\n{base.traceback}"
    assert set(runs) == set(arm_names(version)), sorted(runs)
    for arm in arm_names(version)[1:]:
        run = runs[arm]
        assert run.ok, f"{arm} did not run on sglang {version}: {run.error}\n{run.traceback}\n{run.log[-3000:]}"
        problems = ls.token_mismatches(base, run, "single") + ls.token_mismatches(base, run, "batch")
        assert not problems, f"sglang {version} {arm}:\n" + "\n".join(problems)
        for g in run.phases["single"] + run.phases["batch"]:
            assert len(g.output_ids) == matrix.NEW_TOKENS["trained"], g
            assert g.meta.get("spec_verify_ct", 0) >= 1, g.meta
    sched = runs["ddtree-b4-sched"]
    problems = ls.token_mismatches(base, sched, "ragged")
    assert not problems, "\n".join(problems)
    assert [len(g.output_ids) for g in sched.phases["ragged"]] == list(matrix.RAGGED_LENGTHS)


def test_trees_accept_more_than_the_chain_on_the_release(release_runs) -> None:
    version, _, runs = release_runs

    def mean_accept(name: str) -> float:
        vals = [v for ph in ("single", "batch") for v in runs[name].accept_lengths(ph) if v]
        assert vals, (version, name)
        return sum(vals) / len(vals)

    if "dflash-b4" in runs:
        assert mean_accept("ddtree-b4-n8") > mean_accept("dflash-b4") > 1.2, version
    else:   # trees of 16 (alone) and 8 nodes (batched) accept drafts, as DFLASH's chain does here
        assert mean_accept("ddtree-b4-sched") > 1.2, version


def test_an_injected_walk_fault_breaks_equality_on_the_release(release_runs, live_models,
                                                               tmp_path: Path) -> None:
    version, patched, runs = release_runs
    fault = FAULTS["walk-off-by-one"]
    mine = arms(version)
    arm = next((a for a in mine if a.name == fault.arm), None) or next(a for a in mine if a.name == "ddtree-b4-sched")
    broken = venvs.clone_venv(patched.venv, tmp_path / "venv", share_deps=True)
    try:
        inject(broken.venv, fault)
        spec = matrix.engine_spec(live_models[fault.fixture], arm)
        spec = ls.EngineSpec(spec.name, spec.kwargs, tuple(p for p in spec.phases if p.name in fault.phases))
        run = ls.run_engines(str(broken), [spec], tmp_path / "run")[arm.name]
    finally:
        venvs.remove_venv(broken.venv, background=True)
    assert run.ok, f"the broken engine did not run on {version} ({run.error}): a control must reach the comparison"
    base = runs["target"]
    problems = [p for ph in fault.phases for p in ls.token_mismatches(base, run, ph)]
    assert problems, f"sglang {version}: the injected walk fault went unnoticed"


def test_schedule_widths_beside_cuda_graphs_probe_the_releases_graph_runner(release_runs) -> None:
    """The release's own DecodeCudaGraphRunner sends a width it did not capture to the eager
    forward (what revision 9's schedules beside CUDA graphs rely on; see test_live_startup_errors)."""
    _version, patched, _runs = release_runs
    assert_other_widths_go_eager(probe_graph_widths(patched.python))
