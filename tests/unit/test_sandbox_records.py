"""The demo's sandbox built again retires the local records of the install it replaces: a deployment
on the deleted venv must not stay "active" in this machine's records (every later `rollback` failed,
exit 10)."""

from __future__ import annotations

import json
from pathlib import Path

from sglang_patcher.demo import retire_sandbox_records
from sglang_patcher.deploy.records import SUPERSEDED, local_only_active
from sglang_patcher.sandbox import sandbox_dir


def _record(home: Path, host: str, did: str, site: Path, phase: str = "verified") -> Path:
    p = home / "deployments" / host / f"{did}.json"
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps({"id": did, "host": host, "phase": phase, "site_packages": str(site),
                             "files": {"sglang/x.py": {"before": "a" * 64, "after": "b" * 64}}}))
    return p


def test_a_rebuilt_sandbox_marks_the_records_of_the_old_venv_superseded_and_says_so(tmp_path):
    home = tmp_path / "home"
    venv = sandbox_dir(home=home)
    site = venv / "lib" / "python3.11" / "site-packages"
    on_old = _record(home, "sandbox", "20261202T000000Z-ddtree-r4-aaaaaa", site)
    same_venv_other_name = _record(home, "my-sandbox", "20261202T000100Z-ddtree-r4-bbbbbb", site)
    done = _record(home, "sandbox", "20261201T000000Z-ddtree-r4-cccccc", site, phase="rolled_back")
    elsewhere = _record(home, "gpu-1", "20261202T000200Z-ddtree-r4-dddddd", tmp_path / "other" / "site-packages")
    lines: list[str] = []
    ids = retire_sandbox_records(venv, True, home=home, log=lines.append)
    assert sorted(ids) == ["20261202T000000Z-ddtree-r4-aaaaaa", "20261202T000100Z-ddtree-r4-bbbbbb"]
    for p in (on_old, same_venv_other_name):
        rec = json.loads(p.read_text())
        assert rec["phase"] == SUPERSEDED and rec["superseded"]["phase"] == "verified"
        assert str(venv) in rec["superseded"]["reason"]
    assert json.loads(done.read_text())["phase"] == "rolled_back"      # not active: left as it is
    assert json.loads(elsewhere.read_text())["phase"] == "verified"    # another install: not touched
    assert local_only_active(home, "sandbox", set()) == []              # rollback no longer finds it
    assert len(lines) == 1 and "marked superseded" in lines[0] and "nothing to roll back" in lines[0], lines
    assert "20261202T000000Z-ddtree-r4-aaaaaa" in lines[0] and str(venv) in lines[0]
    lines.clear()
    assert retire_sandbox_records(venv, True, home=home, log=lines.append) == [] and lines == []   # once


def test_a_sandbox_deleted_by_hand_retires_its_records_when_it_is_built_again(tmp_path, monkeypatch):
    """The demo's own hint says to delete the sandbox venv; the build after that finds no venv to
    delete, and its ``before_build`` (what the demo passes) still marks the records of the one that
    was there superseded, before any step of the build (which fails here at once: no pip run)."""
    import subprocess

    import pytest

    from sglang_patcher import sandbox
    from sglang_patcher.errors import SglpatchError

    home = tmp_path / "home"
    venv = sandbox_dir(home=home)
    rec = _record(home, "sandbox", "20261202T000000Z-ddtree-r4-aaaaaa", venv / "lib" / "python3.11" / "site-packages")
    assert not venv.exists()
    monkeypatch.setattr(sandbox.subprocess, "run",
                        lambda argv, **kw: subprocess.CompletedProcess(argv, 1, "", "no venv module here"))
    lines: list[str] = []
    with pytest.raises(SglpatchError, match="failed"):
        sandbox.ensure_sandbox(home=home, log=lines.append, before_build=lambda venv, existed:
                               retire_sandbox_records(venv, existed, home=home, log=lines.append))
    assert json.loads(rec.read_text())["phase"] == SUPERSEDED
    assert any("is gone (deleted) and built again" in line and "marked superseded" in line for line in lines), lines
