"""The tests that import SGLang itself, run where SGLang imports: the L1 venv's interpreter.

``tests/unit/test_ddtree_info_sglang.py`` (SGLang 0.5.23's own Triton tree-verify kernel fed our
trees, in Triton's CPU interpreter) and ``tests/unit/test_ddtree_worker_sglang.py`` (our worker
against the real ``DFlashWorkerV2``) skip in pytest's own Python, which has no sglang. Here they run
in a venv holding the real sglang==0.5.23 wheel, its CPU dependency set
(``sglang_patcher/data/sglang-0.5.23-cpu-requirements.txt``) and this pytest, built once and cached
like the other target venvs. SGLang's kernel tests must pass there. The worker's module needs
transformers and torchvision (``sglang.srt.configs`` imports the multimodal utilities), and
torchvision has no PyPI build for the CPU torch 2.13.0 this machine uses: those tests may skip, and
only for that reason (the L1 check's worker and capture checks skip for the same one).
"""

from __future__ import annotations

import os
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

pytestmark = [pytest.mark.sglang, pytest.mark.l1, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
FILES = ["tests/unit/test_ddtree_info_sglang.py", "tests/unit/test_ddtree_worker_sglang.py"]
# what the worker's module lacks in the L1 set: transformers, and with it torchvision
KNOWN_SKIPS = ("No module named 'transformers'", "No module named 'torchvision'")


def test_sglang_importing_tests_pass_in_a_venv_where_sglang_imports(tmp_path, l1_pytest_pristine):
    venv = l1_pytest_pristine
    ini = tmp_path / "pytest.ini"
    ini.write_text("[pytest]\n")  # not the repository's: its addopts and conftest need our test deps
    report = tmp_path / "junit.xml"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(PYTHONPATH=str(REPO), TRITON_INTERPRET="1")
    proc = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pytest", "-c", str(ini), "--rootdir", str(REPO), "--noconftest",
         "-p", "no:cacheprovider", "-q", f"--junitxml={report}", *FILES],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=1200)
    tail = (proc.stdout + proc.stderr)[-4000:]
    assert proc.returncode == 0, tail
    cases = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        skipped = case.find("skipped")
        cases[f"{case.get('classname')}::{case.get('name')}"] = (  # a module's skip: its reason in the text
            f"skipped: {skipped.get('message')} {skipped.text or ''}" if skipped is not None else "passed")
    if not cases:  # nothing collected at all
        pytest.fail(f"no test of {FILES} ran in {venv}:\n{tail}")
    verify = {k: v for k, v in cases.items() if "test_sglang_triton_verify_equals_core_walk" in k}
    assert len(verify) == 4 and set(verify.values()) == {"passed"}, (cases, tail)
    # the worker's module: it imports (then every test passes) or it lacks what the L1 set lacks
    for name, state in cases.items():
        ok = (state == "passed" or "does not import here" in state
              or ("test_ddtree_worker_sglang" in name and any(k in state for k in KNOWN_SKIPS)))
        assert ok, (name, state, tail)
