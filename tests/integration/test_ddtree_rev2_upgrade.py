"""Revision 1 → 2 of the ddtree patchset on one host, over a real sshd on the real sglang 0.5.23 venv.

``ddtree@1`` (history/r1) is applied; then ``ddtree@2`` (history/r2) is applied to the same
host: its plan recognises the files revision 1 wrote by their hashes (``older`` r1, from
``history``), moves them to revision 2 and adds the six modules; ``status`` says r2. What rollback
does after the upgrade (the deploy code's behaviour, documented in the patchset README): the first
rollback undoes the latest deployment (r2) and restores what it replaced, i.e. revision 1 (status
patched r1 by the r1 manifest); a second rollback undoes revision 1 and the host is pristine by the
distribution's RECORD, the added modules gone.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from sglang_patcher.deploy import apply_to_host, host_status, rollback_host
from sglang_patcher.discovery import discover
from sglang_patcher.mirror import snapshot
from sglang_patcher.patchset import load_patchset
from sglang_patcher.transport import connect

pytestmark = [pytest.mark.ssh, pytest.mark.sglang]

REPO = Path(__file__).resolve().parents[2]
VERSION = "0.5.23"


def _live(site: Path, rel: str) -> str | None:
    p = site / rel
    return hashlib.sha256(p.read_bytes()).hexdigest() if p.exists() else None


def test_ddtree_r1_then_r2_upgrade_then_rollback_twice(ssh_host, sglang_target, sglpatch_home):
    r1 = load_patchset(REPO / "patchsets" / "ddtree" / "history" / "r1")
    assert load_patchset("ddtree@1").revision == 1
    r2 = load_patchset("ddtree@2")
    assert (r1.revision, r2.revision) == (1, 2)
    site = sglang_target.site_packages
    t = connect(ssh_host)
    try:
        info = discover(t, ssh_host)
        snap = snapshot(t, ssh_host, info, home=sglpatch_home)

        first = apply_to_host(t, ssh_host, info, r1, pristine=snap.mirror, home=sglpatch_home)
        assert first.status == "applied", first.to_json()
        for path, sha in r1.target(VERSION).expected.items():
            assert _live(site, path) == sha, path
        # r2's view of an r1 host: every r1 file is r1 — also those both revisions write alike
        # (credited to the revision the host's records say is active) — so the host is "older"
        st = host_status(t, ssh_host, info, r2)
        states = {f.path: (f.state, f.revision) for f in st.files}
        assert states["sglang/srt/speculative/spec_info.py"] == ("patched", 1), st.to_json()
        assert states["sglang/srt/arg_groups/speculative_hook.py"] == ("patched", 1), st.to_json()
        assert states["sglang/srt/arg_groups/fields/spec.py"] == ("patched", 1), st.to_json()
        assert states["sglang/srt/speculative/ddtree_worker.py"][0] in ("pristine", "absent"), st.to_json()
        assert st.overall == "older" and st.older_revision == 1, st.to_json()

        up = apply_to_host(t, ssh_host, info, r2, pristine=snap.mirror, home=sglpatch_home)
        assert up.status == "applied", up.to_json()
        plan = {p: (fp.state, fp.found_revision) for p, fp in up.plan.files.items()}
        assert plan["sglang/srt/speculative/spec_info.py"] == ("older", 1), plan
        assert plan["sglang/srt/arg_groups/speculative_hook.py"] == ("older", 1), plan
        assert up.plan.kind == "upgrade"
        st = host_status(t, ssh_host, info, r2)
        assert st.overall == "patched", st.to_json()
        assert all(f.state == "patched" and f.revision == 2 for f in st.files), st.to_json()
        for path, sha in r2.target(VERSION).expected.items():
            assert _live(site, path) == sha, path
        again = apply_to_host(t, ssh_host, info, r2, pristine=snap.mirror, home=sglpatch_home)
        assert again.status == "already_applied"

        # rollback 1: undoes the r2 deployment, back to what it replaced (revision 1)
        rb = rollback_host(t, ssh_host, info, home=sglpatch_home)
        assert rb.rolled_back == [up.deployment_id]
        for path, sha in r1.target(VERSION).expected.items():
            assert _live(site, path) == sha, f"{path}: not back at revision 1"
        for path in r2.target(VERSION).new_files:
            assert _live(site, path) is None, f"{path} was added by r2 and must be gone"
        st1 = host_status(t, ssh_host, info, r1)
        assert st1.overall == "patched" and all(f.revision == 1 for f in st1.files), st1.to_json()

        # rollback 2: undoes revision 1, pristine by the distribution's RECORD
        rb2 = rollback_host(t, ssh_host, info, home=sglpatch_home)
        assert rb2.rolled_back == [first.deployment_id]
        final = host_status(t, ssh_host, info, r2)
        assert final.overall == "pristine", final.to_json()
        for f in final.files:
            if f.path in info.record:
                assert f.live == info.record[f.path], f.path
            else:
                assert f.live is None, f.path
        print(f"\n[measure] ddtree r1 -> r2 over loopback ssh: r1 apply {first.seconds:.2f} s / "
              f"{first.round_trips} rt; upgrade {up.seconds:.2f} s / {up.round_trips} rt "
              f"({len(up.plan.to_push)} files)")
    finally:
        t.close()


@pytest.mark.l1
@pytest.mark.slow
def test_ddtree_l1_follows_the_revision_on_upgrade(sshd, sglang_target_l1, sglpatch_home):
    """On the L1 venv (CPU torch + light deps): after ``ddtree@1`` the r1 check runs (create_worker
    refuses, naming revision 2); after the upgrade the r2 check runs (create_worker resolves to
    DDTreeWorker, the modules import, the target verify width is budget + 1)."""
    host = sshd.host_entry(sglang_target_l1, name="sshd-l1-upgrade")
    r1 = load_patchset("ddtree@1")
    r2 = load_patchset("ddtree@2")
    t = connect(host)
    try:
        info = discover(t, host)
        snap = snapshot(t, host, info, home=sglpatch_home)
        first = apply_to_host(t, host, info, r1, pristine=snap.mirror, home=sglpatch_home)
        l1 = {c.name: c for c in first.checks.checks if c.level == "L1"}
        assert l1["create_worker refuses DDTREE (revision 2)"].status == "passed", first.checks.text()
        assert first.checks.level_status("L1") == "passed", first.checks.text()

        up = apply_to_host(t, host, info, r2, pristine=snap.mirror, home=sglpatch_home)
        assert up.status == "applied" and up.plan.kind == "upgrade"
        l1 = {c.name: c for c in up.checks.checks if c.level == "L1"}
        assert "create_worker refuses DDTREE (revision 2)" not in l1
        assert l1["create_worker resolves DDTREE to DDTreeWorker"].status == "passed", up.checks.text()
        assert l1["target verify width is budget + 1"].status == "passed", up.checks.text()
        for m in ("ddtree_reference", "ddtree_tree", "ddtree_accept", "ddtree_kernels", "ddtree_info",
                  "ddtree_worker"):
            assert l1[f"import sglang.srt.speculative.{m}"].status == "passed", up.checks.text()
        assert not up.checks.failed, up.checks.text()
        assert all(c.status == "passed" or c.detail.startswith("missing module ") for c in l1.values())
        rollback_host(t, host, info, home=sglpatch_home)
        rollback_host(t, host, info, home=sglpatch_home)
        final = host_status(t, host, info, r2)
        assert final.overall == "pristine", final.to_json()
    finally:
        t.close()
