"""The ddtree L1 check script's contract, without SGLang's dependencies (fast).

The script is run as the host runs it (a subprocess of an interpreter, no arguments) against crafted
``sglang`` packages on ``PYTHONPATH`` that stand in for the two ways an import can fail: a missing
third-party dependency (must be ``skipped``, never ``passed``) and a broken SGLang tree (must be
``failed``). The real SGLang runs are in tests/integration/test_ddtree_patchset.py (marker ``l1``).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# The current revision's check and revision 1's frozen one (history/r1, loaded as ddtree@1).
SCRIPTS = {
    "r2": REPO / "patchsets" / "ddtree" / "checks" / "l1_ddtree.py",
    "r1": REPO / "patchsets" / "ddtree" / "history" / "r1" / "checks" / "l1_ddtree.py",
}
SCRIPT = SCRIPTS["r2"]


@pytest.fixture(params=sorted(SCRIPTS), autouse=True)
def script(request, monkeypatch):
    """Every test runs against both revisions' check scripts."""
    monkeypatch.setitem(globals(), "SCRIPT", SCRIPTS[request.param])
    return SCRIPTS[request.param]


def _load_script():
    spec = importlib.util.spec_from_file_location("l1_ddtree_under_test", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _run(pythonpath: Path | None) -> tuple[list[dict], subprocess.CompletedProcess]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    # -S: no site-packages, so only the crafted package can answer `import sglang`
    proc = subprocess.run([sys.executable, "-S", str(SCRIPT)], capture_output=True, text=True,
                          env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 1, proc.stdout
    data = json.loads(lines[0])
    assert set(data) == {"checks"}
    for c in data["checks"]:
        assert set(c) == {"name", "status", "detail"}
        assert c["status"] in ("passed", "failed", "skipped")
    return data["checks"], proc


def _package(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def test_revision_2_checks_the_worker_and_sizes_revision_1_refused():
    spec = importlib.util.spec_from_file_location("l1_r2", SCRIPTS["r2"])
    r2 = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(r2)
    assert "create_worker resolves DDTREE to DDTreeWorker" in r2.CHECK_NAMES
    assert "create_worker refuses DDTREE (revision 2)" not in r2.CHECK_NAMES
    for m in ("ddtree_reference", "ddtree_tree", "ddtree_accept", "ddtree_info", "ddtree_budget", "ddtree_worker"):
        assert f"import sglang.srt.speculative.{m}" in r2.CHECK_NAMES
    # revision 4: the Triton kernels by pipeline stage, where SGLang keeps its speculative kernels
    for m in ("ddtree_keys", "ddtree_prep", "ddtree_beam", "ddtree_verify_inputs", "ddtree_walk"):
        assert f"import sglang.kernels.ops.speculative.{m}" in r2.CHECK_NAMES
    assert "import sglang.srt.speculative.ddtree_kernels" not in r2.CHECK_NAMES
    spec = importlib.util.spec_from_file_location("l1_r1", SCRIPTS["r1"])
    r1 = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(r1)
    assert "create_worker refuses DDTREE (revision 2)" in r1.CHECK_NAMES and len(r1.CHECK_NAMES) == 10


def test_check_names_match_the_checks_run():
    mod = _load_script()
    assert list(mod.CHECK_NAMES) == ["import patched modules"] + [n for n, _ in mod.CHECKS]
    assert len(set(mod.CHECK_NAMES)) == len(mod.CHECK_NAMES)


def test_missing_third_party_module_skips_every_check_crafted_sglang(tmp_path):
    pp = _package(tmp_path, {"sglang/__init__.py": "import sglpatch_absent_dependency_q7\n"})
    checks, _ = _run(pp)
    assert [c["name"] for c in checks] == list(_load_script().CHECK_NAMES)
    assert {c["status"] for c in checks} == {"skipped"}
    assert {c["detail"] for c in checks} == {"missing module sglpatch_absent_dependency_q7"}


def test_missing_dependency_deep_in_the_tree_is_still_a_skip_crafted_sglang(tmp_path):
    pp = _package(tmp_path, {
        "sglang/__init__.py": "",
        "sglang/srt/__init__.py": "",
        "sglang/srt/speculative/__init__.py": "",
        "sglang/srt/speculative/spec_registry.py": "import numpy_that_is_not_here\n",
    })
    checks, _ = _run(pp)
    assert {c["status"] for c in checks} == {"skipped"}
    assert checks[0]["detail"] == "missing module numpy_that_is_not_here"


def test_broken_sglang_tree_fails_and_never_passes_crafted_sglang(tmp_path):
    # sglang imports, but the patched module is missing from it: a broken install, not a missing dep
    pp = _package(tmp_path, {"sglang/__init__.py": "", "sglang/srt/__init__.py": ""})
    checks, _ = _run(pp)
    assert checks[0] == {"name": "import patched modules", "status": "failed",
                         "detail": checks[0]["detail"]}
    assert "sglang.srt.speculative" in checks[0]["detail"]
    assert all(c["status"] == "skipped" for c in checks[1:])
    assert not any(c["status"] == "passed" for c in checks)


def test_no_sglang_at_all_is_a_failure(tmp_path):
    checks, _ = _run(tmp_path)               # an empty PYTHONPATH under -S: no sglang anywhere
    assert checks[0]["status"] == "failed" and "sglang" in checks[0]["detail"]
    assert not any(c["status"] == "passed" for c in checks)


def test_a_syntax_error_in_a_patched_module_fails(tmp_path):
    pp = _package(tmp_path, {
        "sglang/__init__.py": "",
        "sglang/srt/__init__.py": "",
        "sglang/srt/speculative/__init__.py": "",
        "sglang/srt/speculative/spec_registry.py": "def broken(:\n",
    })
    checks, _ = _run(pp)
    assert checks[0]["status"] == "failed" and "SyntaxError" in checks[0]["detail"]


@pytest.mark.parametrize("name,first_party", [
    ("sglang", True), ("sglang.srt.x", True), ("sglangx", False), ("numpy", False), (None, False),
])
def test_first_party_classification(name, first_party):
    assert _load_script()._first_party(name) is first_party


def test_an_error_raised_in_a_third_party_package_is_named_the_environment_crafted_sglang(tmp_path, script):
    """A torchvision built for another torch raises while sglang imports it: the failure says it is
    the host's environment (and which file raised), not the patch; the same error raised inside
    sglang's own code stays a plain failure (the control)."""
    if script != SCRIPTS["r2"]:
        pytest.skip("the current revision's script")
    vision = 'raise RuntimeError("operator torchvision::nms does not exist")\n'
    pp = _package(tmp_path / "env", {"fakevision_q7/__init__.py": vision,
                                     "sglang/__init__.py": "import fakevision_q7\n"})
    checks, _ = _run(pp)
    first = checks[0]
    assert first["status"] == "failed" and first["detail"].startswith("environment:"), first
    assert "fakevision_q7/__init__.py" in first["detail"] and "torchvision::nms" in first["detail"]
    assert not any(c["status"] == "passed" for c in checks)
    own = _package(tmp_path / "own", {"sglang/__init__.py": vision})
    checks, _ = _run(own)
    assert checks[0]["status"] == "failed" and not checks[0]["detail"].startswith("environment:"), checks[0]
    assert "torchvision::nms" in checks[0]["detail"]
