"""Smoke checks L0/L1 run for real with this machine's interpreter over the local transport."""

from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest
from rich.console import Console

from sglang_patcher.checks import CheckReport, CheckResult, parse_l1_output, run_checks, run_l1
from sglang_patcher.transport.local import LocalTransport


@pytest.fixture
def site(tmp_path):
    sp = tmp_path / "site-packages"
    (sp / "pkg").mkdir(parents=True)
    (sp / "pkg/good.py").write_text("X = 1\n")
    (sp / "pkg/bad.py").write_text("def f(:\n    pass\n")
    (sp / "pkg/data.txt").write_text("not python")
    return sp


def _host_info(sp):
    host = SimpleNamespace(name="local-checks", python=sys.executable, sudo=False)
    info = SimpleNamespace(interpreter=sys.executable, site_packages=str(sp))
    return host, info


def _patchset(tmp_path, script: str | None):
    if script is None:
        return SimpleNamespace(root=tmp_path, checks={})
    (tmp_path / "checks").mkdir(exist_ok=True)
    (tmp_path / "checks/l1.py").write_text(script)
    return SimpleNamespace(root=tmp_path, checks={"l1": "checks/l1.py"})


L1_MIXED = """
import json, sys
print("noise before the result")
print(json.dumps({"checks": [
    {"name": "import", "status": "passed", "detail": sys.argv[0][:0]},
    {"name": "gpu kernels", "status": "skipped", "detail": "torch.cuda not available"}]}))
"""


def test_l0_compiles_every_touched_py_in_one_round_trip(site, tmp_path):
    t = LocalTransport("local-checks")
    host, info = _host_info(site)
    rep = run_checks(t, host, info, ["pkg/good.py", "pkg/bad.py", "pkg/data.txt"],
                     _patchset(tmp_path, None), levels=("L0",))
    assert rep.round_trips == 1
    by = {c.name: c for c in rep.checks}
    assert by["py_compile pkg/good.py"].status == "passed"
    assert by["py_compile pkg/bad.py"].status == "failed"
    assert "bad.py" in by["py_compile pkg/bad.py"].detail
    assert not rep.gate_passed and rep.level_status("L0") == "failed"
    assert not (site / "pkg/__pycache__").exists()  # bytecode never lands in __pycache__


def test_l1_skipped_is_shown_and_never_counted_as_passed(site, tmp_path):
    t = LocalTransport("local-checks")
    host, info = _host_info(site)
    rep = run_checks(t, host, info, ["pkg/good.py"], _patchset(tmp_path, L1_MIXED))
    assert rep.round_trips == 2
    assert rep.gate_passed and not rep.all_passed
    assert rep.level_status("L0") == "passed" and rep.level_status("L1") == "partial"
    assert rep.summary()["skipped"] == ["L1:gpu kernels"]
    out = Console(width=120, record=True, file=open("/dev/null", "w"))
    out.print(rep)
    text = out.export_text()
    assert "skipped" in text and "torch.cuda not available" in text


def test_no_l1_script_is_a_skipped_level(site, tmp_path):
    t = LocalTransport("local-checks")
    host, info = _host_info(site)
    rep = run_checks(t, host, info, ["pkg/good.py"], _patchset(tmp_path, None))
    assert rep.level_status("L1") == "skipped" and rep.gate_passed and not rep.all_passed
    assert rep.to_json()["summary"]["L1"] == "skipped"


def test_l1_crash_is_a_failed_check_with_the_output_tail(site, tmp_path):
    t = LocalTransport("local-checks")
    host, info = _host_info(site)
    rep = run_checks(t, host, info, [], _patchset(tmp_path, "import no_such_module_xyz\n"))
    [l1] = [c for c in rep.checks if c.level == "L1"]
    assert l1.status == "failed" and "no_such_module_xyz" in l1.detail
    assert not rep.gate_passed


def test_l1_script_that_reports_a_failure(tmp_path):
    t = LocalTransport("x")
    res = run_l1(t, sys.executable, b'import json\nprint(json.dumps({"checks": [{"name": "from_string",'
                                    b' "status": "failed", "detail": "ValueError: DDTREE"}]}))\n'
                                    b'raise SystemExit(1)\n')
    assert [(c.name, c.status) for c in res] == [("from_string", "failed")]


@pytest.mark.parametrize("stdout,expect", [
    (b'{"checks": [{"name": "a", "status": "passed"}]}', [("a", "passed")]),
    (b'{"checks": [{"name": "a", "status": "ok"}]}', [("a", "failed")]),
    (b'{"checks": []}', [("l1 script", "skipped")]),
    (b'hello', [("l1 script", "failed")]),
])
def test_parse_l1_output(stdout, expect):
    assert [(c.name, c.status) for c in parse_l1_output(stdout, b"", 0)] == expect


def test_report_status_rules():
    rep = CheckReport("h", [CheckResult("L1", "a", "skipped"), CheckResult("L1", "b", "skipped")])
    assert rep.level_status("L1") == "skipped" and rep.gate_passed and not rep.all_passed
    rep.checks.append(CheckResult("L0", "c", "failed", "boom"))
    assert not rep.gate_passed and "boom" in rep.text()
