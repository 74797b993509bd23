"""Revision 1 → 2 through the ``sglpatch`` command line (``main([...])`` in-process) on the local
transport's real sglang 0.5.23 venv: ``diff ddtree@2`` shows revision 2, ``apply ddtree@1`` then
``apply ddtree@2`` upgrades (status r2), ``rollback`` twice ends pristine by RECORD. (Revision 3's
path from revision 2: tests/integration/test_ddtree_rev3_cli.py.)"""

from __future__ import annotations

import pytest

from tests.integration.test_cli import live_hash, record_hashes, run_cli, run_json, write_hosts

pytestmark = [pytest.mark.sglang]

VERSION = "0.5.23"
SPEC_INFO = "sglang/srt/speculative/spec_info.py"
WORKER = "sglang/srt/speculative/ddtree_worker.py"


def test_diff_shows_revision_2_with_the_worker(capsys, sglpatch_home):
    """Revision 2 is withdrawn (its server cannot start): the diff still shows it (exit 0, as
    apply deploys an exact pin), and says so — in --json's warnings and on stderr, never in the
    patch on stdout; revision 1 is not withdrawn and has no warning."""
    code, data, err = run_json(capsys, "diff", "ddtree@2", "--sglang", VERSION)
    assert code == 0, err
    assert data["revision"] == 2
    assert WORKER in data["files"] and SPEC_INFO in data["files"]
    assert "+            return DDTreeWorker" in data["diff"]
    assert len(data["warnings"]) == 1 and "ddtree r2 is withdrawn: revision 2 cannot serve" in data["warnings"][0]
    code, out, plain_err = run_cli(capsys, "diff", "ddtree@2", "--sglang", VERSION)
    assert code == 0 and "withdrawn" in plain_err and "withdrawn" not in out, plain_err
    code, data, err = run_json(capsys, "diff", "ddtree@1", "--sglang", VERSION)
    assert code == 0, err
    assert data["revision"] == 1 and WORKER not in data["files"] and data["warnings"] == []


def test_cli_r1_then_r2_then_rollback_twice_local(capsys, tmp_path, sglpatch_home, local_target):
    from sglang_patcher.inventory import Host

    hosts = write_hosts(tmp_path / "hosts.yaml",
                        Host(name="here", transport="local", python=str(local_target)))
    site = local_target.site_packages
    record = record_hashes(site)
    h = ["--hosts", str(hosts)]

    code, data, err = run_json(capsys, *h, "apply", "ddtree@1", "--host", "here", "--yes")
    assert code == 0, err
    assert data["status"] == "applied" and data["plan"]["revision"] == 1
    r1_spec_info = live_hash(site, SPEC_INFO)
    assert live_hash(site, WORKER) is None

    code, data, err = run_json(capsys, *h, "apply", "ddtree@2", "--host", "here", "--yes")
    assert code == 0, err
    assert data["status"] == "applied" and data["plan"]["revision"] == 2, data
    assert data["plan"]["kind"] == "upgrade", data["plan"]
    code, data, err = run_json(capsys, *h, "status", "--host", "here", "--patchset", "ddtree@2")
    assert code == 0, err
    assert {(f["state"], f["revision"]) for f in data["files"]} == {("patched", 2)}, data["files"]
    # judged against r1, the r2 files are the host's records' later revision, not drift
    code, data, err = run_json(capsys, *h, "status", "--host", "here", "--patchset", "ddtree@1")
    assert code == 0, err
    assert data["overall"] == "newer", [(f["path"], f["state"], f["revision"]) for f in data["files"]]
    assert not [f for f in data["files"] if f["state"] == "drifted"], data["files"]
    code, out, err = run_cli(capsys, *h, "status", "--host", "here", "--patchset", "ddtree@1")
    assert "later than the r1 asked about" in " ".join(out.split()), out

    code, _, err = run_json(capsys, *h, "rollback", "--host", "here")
    assert code == 0, err
    assert live_hash(site, SPEC_INFO) == r1_spec_info and live_hash(site, WORKER) is None

    code, _, err = run_json(capsys, *h, "rollback", "--host", "here")
    assert code == 0, err
    assert live_hash(site, SPEC_INFO) == record[SPEC_INFO]
