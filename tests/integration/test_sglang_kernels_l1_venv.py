"""SGLang 0.5.23's own Triton tree-verify kernel accepts exactly what our DDTree walk accepts — run
for real in CI, inside the L1 target venv (sglang 0.5.23 + its CPU dependency set), on the CPU through
Triton's interpreter.

The test process itself has no sglang, so ``tests/unit/test_ddtree_info_sglang.py`` is run by a
pytest inside that venv: the venv's interpreter with a ``--target`` overlay holding only pytest (and
its two small dependencies) on PYTHONPATH. The H200 run covers the JIT CUDA path (tests/gpu).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.sglang, pytest.mark.l1, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def pytest_overlay(tmp_path_factory) -> Path:
    """A directory with this run's pytest (and pluggy, iniconfig) for another interpreter."""
    import iniconfig
    import pluggy

    dest = tmp_path_factory.mktemp("pytest-overlay")
    pins = [f"pytest=={pytest.__version__}", f"pluggy=={pluggy.__version__}",
            f"iniconfig=={getattr(iniconfig, '__version__', '2.0.0')}"]
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check",
                           "--no-deps", "--target", str(dest), *pins], capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.fail(f"could not install {pins} into an overlay:\n{proc.stderr[-2000:]}")
    return dest


def test_sglang_triton_tree_verify_equals_our_walk_in_the_l1_venv(pytest_overlay, l1_pristine):
    venv = l1_pristine
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(PYTHONPATH=str(pytest_overlay), TRITON_INTERPRET="1")
    proc = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rA",
         "tests/unit/test_ddtree_info_sglang.py", "-k", "sglang_triton_verify_equals_core_walk"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "4 passed" in out and "skipped" not in out.split("short test summary")[-1].lower(), out[-4000:]
