"""Revision 2 → 3 (and 1 → 3) through the ``sglpatch`` command line on the local transport's real
sglang 0.5.23 venv. Revision 3 changes the worker (its start-up checks: revision 2 could not start a
DDTREE server; the budget schedule), adds ddtree_budget.py and the schedule's argument and
validation, so the upgrade from 2 pushes those four files; rollbacks walk back one deployment at a
time and end pristine by RECORD. Since revision 4 these name ``ddtree@3``; then revision 3 -> the
current revision (4's kernel move on the way), revision 4 -> the current revision (5 added SGLang
0.5.22: on 0.5.23 only the two DDTree modules that adapt to it change), revision 5 -> the current
revision (6 added SGLang 0.5.21: on 0.5.23 again only those two modules change), revision 6 ->
the current revision (7: the auto budget planner and the small-K prep: DDTree modules and kernels,
and patch 0010's two lines in spec.py and speculative_hook.py) and revision 8 -> 9 (schedules
beside CUDA graphs and the prep's shared exp-sum: two DDTree files)."""

from __future__ import annotations

import os

import pytest

from tests.integration.test_cli import file_states, live_hash, record_hashes, run_cli, run_json, write_hosts

pytestmark = [pytest.mark.sglang]

VERSION = "0.5.23"
SPEC_INFO = "sglang/srt/speculative/spec_info.py"
WORKER = "sglang/srt/speculative/ddtree_worker.py"
BUDGET = "sglang/srt/speculative/ddtree_budget.py"
KERNELS_R3 = "sglang/srt/speculative/ddtree_kernels.py"    # revision 3's kernels, one module
KERNELS_R4 = [f"sglang/kernels/ops/speculative/ddtree_{m}.py"    # revision 4's, by pipeline stage
              for m in ("keys", "prep", "beam", "verify_inputs", "walk")]
INFO = "sglang/srt/speculative/ddtree_info.py"
CURRENT = 13
PREP = "sglang/kernels/ops/speculative/ddtree_prep.py"


def _hosts(tmp_path, local_target):
    from sglang_patcher.inventory import Host

    return ["--hosts", str(write_hosts(tmp_path / "hosts.yaml",
                                       Host(name="here", transport="local", python=str(local_target))))]


def test_cli_r2_then_r3_pushes_the_worker_then_rollback_twice(capsys, tmp_path, sglpatch_home,
                                                              local_target):
    h, site = _hosts(tmp_path, local_target), local_target.site_packages
    record = record_hashes(site)

    # an exact pin of a withdrawn revision is applied (as pip installs a yanked release pinned with
    # ==), but the warning comes before the plan: a dry run says it and writes nothing
    code, data, err = run_json(capsys, *h, "apply", "ddtree@2", "--host", "here", "--dry-run")
    assert code == 0 and data["status"] == "dry_run", err
    assert "warning: ddtree r2 is withdrawn: revision 2 cannot serve with DDTREE" in err, err
    assert [w.split(":")[0] for w in data["warnings"]] == ["ddtree r2 is withdrawn"], data["warnings"]
    assert record_hashes(site) == record
    code, data, err = run_json(capsys, *h, "apply", "ddtree@2", "--host", "here", "--yes")
    assert code == 0, err
    assert err.index("is withdrawn") < err.index("mirror refreshed"), err
    r2_worker, r2_spec_info = live_hash(site, WORKER), live_hash(site, SPEC_INFO)
    # a host at revision 2 cannot serve with DDTREE: status says so, with what to do
    code, data, err = run_json(capsys, *h, "status", "--host", "here")
    assert code == 0, err
    assert len(data["warnings"]) == 1 and "ddtree r2" in data["warnings"][0], data["warnings"]
    assert "attn_backend" in data["warnings"][0] and "sglpatch apply ddtree" in data["warnings"][0]
    code, out, err = run_cli(capsys, *h, "status", "--host", "here")
    assert "is withdrawn" in " ".join(out.split()), out

    code, data, err = run_json(capsys, *h, "apply", "ddtree@3", "--host", "here", "--yes")
    assert code == 0, err
    assert data["status"] == "applied" and data["plan"]["revision"] == 3, data
    assert data["plan"]["kind"] == "upgrade", data["plan"]
    pushed = sorted(p for p, f in data["plan"]["files"].items() if f["action"] != "none")
    assert pushed == sorted([WORKER, BUDGET, "sglang/srt/arg_groups/fields/spec.py",
                             "sglang/srt/arg_groups/speculative_hook.py"]), data["plan"]["files"]
    assert live_hash(site, WORKER) != r2_worker and live_hash(site, SPEC_INFO) == r2_spec_info
    code, data, err = run_json(capsys, *h, "status", "--host", "here", "--patchset", "ddtree@3")
    assert code == 0, err
    assert {(f["state"], f["revision"]) for f in data["files"]} == {("patched", 3)}, data["files"]
    assert data["warnings"] == []

    code, _, err = run_json(capsys, *h, "rollback", "--host", "here")
    assert code == 0, err
    assert live_hash(site, WORKER) == r2_worker
    code, data, err = run_json(capsys, *h, "status", "--host", "here", "--patchset", "ddtree@2")
    assert code == 0 and data["overall"] == "patched", data
    code, _, err = run_json(capsys, *h, "rollback", "--host", "here")
    assert code == 0, err
    assert live_hash(site, SPEC_INFO) == record[SPEC_INFO] and live_hash(site, WORKER) is None
    assert live_hash(site, BUDGET) is None


def test_cli_r1_straight_to_r3(capsys, tmp_path, sglpatch_home, local_target):
    h, site = _hosts(tmp_path, local_target), local_target.site_packages
    code, data, err = run_json(capsys, *h, "apply", "ddtree@1", "--host", "here", "--yes")
    assert code == 0, err
    code, data, err = run_json(capsys, *h, "apply", "ddtree@3", "--host", "here", "--yes")
    assert code == 0, err
    assert data["plan"]["kind"] == "upgrade" and data["plan"]["revision"] == 3, data["plan"]
    code, data, err = run_json(capsys, *h, "status", "--host", "here", "--patchset", "ddtree@3")
    assert {(f["state"], f["revision"]) for f in data["files"]} == {("patched", 3)}, data["files"]


def test_cli_r3_then_current_pushes_only_what_changed_then_rollback(capsys, tmp_path, sglpatch_home,
                                                                     local_target):
    """Revision 4 (chain steps in the budget schedule, the Triton kernels by pipeline stage), kept
    by revision 5: a host at revision 3 is recognised (patched@r3), the upgrade pushes the changed
    files only — the worker, the schedule module and the schedule argument's help among them, never
    the untouched SGLang files —, writes the kernel modules into sglang/kernels/ops/speculative/
    and deletes revision 3's ddtree_kernels.py; status reads patched at the current revision
    throughout (the deleted module too), and a rollback puts revision 3's bytes back, the kernel
    module included, the new ones gone."""
    from sglang_patcher.patchset import load_patchset

    h, site = _hosts(tmp_path, local_target), local_target.site_packages
    code, data, err = run_json(capsys, *h, "apply", "ddtree@3", "--host", "here", "--yes")
    assert code == 0, err
    r3 = {p: live_hash(site, p) for p in (WORKER, BUDGET, SPEC_INFO, KERNELS_R3, *KERNELS_R4, VERIFY_ATTN)}
    assert r3[KERNELS_R3] is not None and all(r3[p] is None for p in (*KERNELS_R4, VERIFY_ATTN)), r3
    code, data, err = run_json(capsys, *h, "status", "--host", "here", "--patchset", "ddtree")
    assert data["overall"] == "older" and data["older_revision"] == 3, data
    states = {f["path"]: (f["state"], f["revision"]) for f in data["files"]}
    # r4's own kernels and r11's, not yet there
    assert {states.pop(p) for p in (*KERNELS_R4, VERIFY_ATTN)} == {("absent", None)}, data["files"]
    assert set(states.values()) == {("patched", 3)}, data["files"]

    code, data, err = run_json(capsys, *h, "apply", "ddtree", "--host", "here", "--yes")
    assert code == 0, err
    assert data["plan"]["kind"] == "upgrade" and data["plan"]["revision"] == CURRENT, data["plan"]
    pushed = {p for p, f in data["plan"]["files"].items() if f["action"] != "none"}
    assert {WORKER, BUDGET, "sglang/srt/arg_groups/fields/spec.py"} <= pushed, pushed
    assert SPEC_INFO not in pushed and live_hash(site, SPEC_INFO) == r3[SPEC_INFO]
    assert {KERNELS_R3, *KERNELS_R4} <= pushed and data["plan"]["files"][KERNELS_R3]["action"] == "delete"
    want = load_patchset("ddtree").spec.targets[VERSION].expected   # KERNELS_R3: none, so deleted
    assert all(live_hash(site, p) == want.get(p) for p in pushed), pushed
    assert live_hash(site, KERNELS_R3) is None
    code, data, err = run_json(capsys, *h, "status", "--host", "here", "--patchset", "ddtree")
    assert {(f["state"], f["revision"]) for f in data["files"]} == {("patched", CURRENT)}, data["files"]
    assert data["overall"] == "patched" and data["retired"] == [KERNELS_R3], data
    code, data, err = run_json(capsys, *h, "status", "--host", "here")    # by the host's records alone
    assert data["overall"] == "patched" and file_states(data)[KERNELS_R3] == "patched", data

    code, _, err = run_json(capsys, *h, "rollback", "--host", "here")
    assert code == 0, err
    assert {p: live_hash(site, p) for p in r3} == r3


R7_SGLANG = {"sglang/srt/arg_groups/fields/spec.py", "sglang/srt/arg_groups/speculative_hook.py"}
R11_SGLANG = {"sglang/srt/layers/attention/triton_backend.py"}
VERIFY_ATTN = "sglang/kernels/ops/speculative/ddtree_verify_attention.py"


@pytest.mark.parametrize("old", [4, 6, 12])
def test_cli_older_revision_then_current_pushes_the_adapted_modules_only_then_rollback(
        capsys, tmp_path, sglpatch_home, local_target, old):
    """Revisions 5 and 6 add SGLang releases (0.5.22, 0.5.21); on 0.5.23 each changes only the
    DDTree modules that adapt to the added release's DFlash worker (6: exactly the worker and
    ddtree_info). Revision 7 changes DDTree modules and kernels and, of SGLang's files, only the
    two that patch 0010's changed lines live in; revisions 9 and 10 only the prep kernel and the
    worker (each from the one before); revision 11 the triton backend (patch 0011) and a new kernel
    file, which the upgrade creates and the rollback removes; revision 12 patch 0010's two files
    again (--speculative-ddtree-graph-memory), the budget and worker modules and the verify
    kernel. A host at
    revision 4, 6 or 11 is
    recognised (patched@rN; 5 is covered by the
    status tests of tests/integration/test_ddtree_patchset.py), the upgrade pushes exactly the
    files whose bytes differ, status then reads patched at the current revision, and a rollback
    puts the old revision's bytes back."""
    from sglang_patcher.patchset import load_patchset

    current, older = load_patchset("ddtree"), load_patchset(f"ddtree@{old}")
    assert current.revision == CURRENT and older.revision == old
    e_old, e_new = older.target(VERSION).expected, current.target(VERSION).expected
    differ = {p for p in e_new if e_old.get(p) != e_new[p]}
    assert differ <= set(current.target(VERSION).new_files) | R7_SGLANG | R11_SGLANG, differ
    if old < 11:
        assert R11_SGLANG | {VERIFY_ATTN} <= differ, differ
    if old == 6:
        assert R7_SGLANG | {WORKER, BUDGET} <= differ and INFO not in differ, differ
    if old == 11:
        assert differ == R7_SGLANG | {WORKER, BUDGET, VERIFY_ATTN}, differ

    h, site = _hosts(tmp_path, local_target), local_target.site_packages
    code, data, err = run_json(capsys, *h, "apply", f"ddtree@{old}", "--host", "here", "--yes")
    assert code == 0, err
    before = {p: live_hash(site, p) for p in e_old}
    assert before == e_old
    code, data, err = run_json(capsys, *h, "status", "--host", "here", "--patchset", "ddtree")
    assert data["overall"] == "older" and data["older_revision"] == old, data
    states = {f["path"]: (f["state"], f["revision"]) for f in data["files"]}
    assert {states[p] for p in differ - {VERIFY_ATTN}} == {("patched", old)}, data["files"]
    # revision 11's new kernel: absent on older hosts, that revision's bytes on an r11 or later host
    assert states[VERIFY_ATTN] == (("absent", None) if old < 11 else ("patched", old)), states[VERIFY_ATTN]

    code, data, err = run_json(capsys, *h, "apply", "ddtree", "--host", "here", "--yes")
    assert code == 0, err
    assert data["plan"]["kind"] == "upgrade" and data["plan"]["revision"] == CURRENT, data["plan"]
    pushed = {p for p, f in data["plan"]["files"].items() if f["action"] != "none"}
    assert pushed == differ, pushed
    assert {p: live_hash(site, p) for p in e_new} == e_new
    code, data, err = run_json(capsys, *h, "status", "--host", "here", "--patchset", "ddtree")
    assert data["overall"] == "patched" and data["retired"] == [KERNELS_R3], data
    # revision 3's kernel module, which this host never had, is absent as the release has it
    assert {(f["state"], f["revision"]) for f in data["files"] if f["path"] != KERNELS_R3} == \
        {("patched", CURRENT)}, data["files"]
    assert [f["state"] for f in data["files"] if f["path"] == KERNELS_R3] == ["absent"]

    code, _, err = run_json(capsys, *h, "rollback", "--host", "here")
    assert code == 0, err
    assert {p: live_hash(site, p) for p in e_old} == before
    # the upgrade's new file is gone again (revision 11 has it)
    assert os.path.exists(os.path.join(site, VERIFY_ATTN)) == (old >= 11)


def test_cli_r3_then_r4_then_current_reads_patched(capsys, tmp_path, sglpatch_home, local_target):
    """A host that went r3 -> r4 -> the current revision (each an upgrade; the r4 deployment deleted
    r3's kernel module) is patched at the current revision by its hashes: the retired module,
    absent as that revision wants it, is credited to the revision the host carries, not to the r4
    deployment that deleted it (it read 'mixed')."""
    h = _hosts(tmp_path, local_target)
    for name in ("ddtree@3", "ddtree@4", "ddtree"):
        code, _, err = run_json(capsys, *h, "apply", name, "--host", "here", "--yes")
        assert code == 0, (name, err)
    code, data, err = run_json(capsys, *h, "status", "--host", "here", "--patchset", "ddtree",
                               "--expect", "patched")
    assert code == 0 and data["overall"] == "patched", data
    assert {(f["state"], f["revision"]) for f in data["files"]} == {("patched", CURRENT)}, data["files"]
    assert data["retired"] == [KERNELS_R3]
