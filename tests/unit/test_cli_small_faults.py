"""Issue 18's smaller faults, each as a user met it: a failed smoke check buried among 45 lines;
`rollback` with no records and no --host exiting 10 where "never deployed" is no error."""

from __future__ import annotations

import json

from sglang_patcher.checks import CheckReport, CheckResult
from sglang_patcher.cli import main


def test_a_failed_check_stands_out_in_the_error_text():
    rep = CheckReport("h", [CheckResult("L0", f"py_compile m{i}.py", "passed") for i in range(30)]
                      + [CheckResult("L1", f"import m{i}", "passed") for i in range(14)]
                      + [CheckResult("L1", "DDTREE validation", "failed", "ValueError: boom")])
    lines = rep.text().splitlines()
    assert len(lines) == 3, lines
    assert lines[0] == "  [L1] failed  DDTREE validation: ValueError: boom"
    assert "[L0] passed  30 other check(s)" in lines[1] and "14 other check(s)" in lines[2]
    ok = CheckReport("h", [CheckResult("L0", "a", "passed"), CheckResult("L0", "b", "passed")])
    assert len(ok.text().splitlines()) == 2       # nothing failed: every check as it ran


def test_rollback_without_host_or_records_is_nothing_to_roll_back_exit_0(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("SGLPATCH_HOME", str(tmp_path / "home"))
    capsys.readouterr()
    assert main(["rollback"]) == 0
    out, _ = capsys.readouterr()
    flat = " ".join(out.split())            # rich wraps at the terminal width, anywhere
    assert "nothing to roll back" in flat and "--host HOST" in flat, out
    assert main(["--json", "rollback"]) == 0
    doc = json.loads(capsys.readouterr()[0])
    assert doc["ok"] is True and doc["rolled_back"] == [] and doc["host"] is None


def test_hosts_check_at_80_columns_prints_each_error_whole_below_the_table():
    """Issue 18: at 80 columns `hosts --check` wrapped an error one word per line in its cell."""
    from rich.console import Console

    from sglang_patcher.errors import TransportError
    from sglang_patcher.inventory import Host
    from sglang_patcher.service_hosts import HostCheck, HostsCheckReport

    host = Host(name="gpu-far-away", hostname="10.0.0.9", python="/opt/conda/envs/sglang/bin/python")
    err = TransportError("gpu-far-away (10.0.0.9:22): cannot connect (connection refused)",
                         hint="is the host up and sshd listening on that port?")
    console = Console(width=80, record=True, color_system=None)
    console.print(HostsCheckReport([HostCheck(host, error=err)]))
    text = console.export_text()
    assert "gpu-far-away (10.0.0.9:22): cannot connect (connection refused)" in text
    assert "  hint: is the host up and sshd listening on that port?" in text
    assert max(len(line.split()) for line in text.splitlines() if "│" in line) >= 3   # no word-per-line cells
