"""The DDTree patchset end to end over a real sshd on the real sglang 0.5.23 venv.

apply → status patched → re-apply is a clean no-op → rollback → status pristine with every hash equal
to the installed distribution's RECORD. On the ``--no-deps`` venv L1 cannot import sglang's
dependencies and must say "skipped" (never "passed"); on the L1 venv (CPU torch + light deps) L1 must
pass. Round trips and seconds are printed (``-s``).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from sglang_patcher.deploy import apply_to_host, host_status, rollback_host
from sglang_patcher.discovery import discover
from sglang_patcher.mirror import snapshot
from sglang_patcher.transport import connect

pytestmark = [pytest.mark.ssh, pytest.mark.sglang]

REPO = Path(__file__).resolve().parents[2]
DDTREE = REPO / "patchsets" / "ddtree"
VERSION = "0.5.23"


def _ddtree():
    if not (DDTREE / "patchset.yaml").is_file():
        pytest.skip("patchsets/ddtree/patchset.yaml does not exist yet")
    from sglang_patcher.patchset import load_patchset
    ps = load_patchset(DDTREE)
    if VERSION not in ps.versions:
        pytest.skip(f"the ddtree patchset does not target sglang {VERSION} yet")
    return ps


def _story(host, target, home):
    ps = _ddtree()
    t = connect(host)
    try:
        info = discover(t, host)
        assert info.sglang_version == VERSION
        snap = snapshot(t, host, info, home=home)
        res = apply_to_host(t, host, info, ps, pristine=snap.mirror, home=home)
        assert res.status == "applied", res.to_json()
        status = host_status(t, host, info, ps)
        assert status.overall == "patched", status.to_json()
        assert all(f.state == "patched" and f.revision == ps.revision for f in status.files
                   if f.path not in status.retired)
        # a file only earlier revisions installed (r3's ddtree_kernels.py) is absent, as the release has it
        assert all(f.state == "absent" for f in status.files if f.path in status.retired), status.retired
        again = apply_to_host(t, host, info, ps, pristine=snap.mirror, home=home)
        assert again.status == "already_applied" and again.round_trips == 1
        t0, rt0 = time.monotonic(), t.round_trips
        rb = rollback_host(t, host, info, home=home)
        rb_s, rb_rt = time.monotonic() - t0, t.round_trips - rt0
        assert rb.rolled_back == [res.deployment_id]
        final = host_status(t, host, info, ps)
        assert final.overall == "pristine", final.to_json()
        for f in final.files:
            if f.path in info.record:
                assert f.live == info.record[f.path], f.path
            else:
                assert f.live is None, f"{f.path} was added by the patchset and must be gone"
        print(f"\n[measure] ddtree r{ps.revision} over loopback ssh: {len(res.plan.to_push)} files; "
              f"apply {res.seconds:.2f} s / {res.round_trips} round trips (checks {res.checks.seconds}); "
              f"re-apply {again.seconds:.2f} s / {again.round_trips}; rollback {rb_s:.2f} s / {rb_rt}")
        return res
    finally:
        t.close()


def test_ddtree_apply_status_noop_rollback_no_deps(ssh_host, sglang_target, sglpatch_home):
    res = _story(ssh_host, sglang_target, sglpatch_home)
    assert res.checks.level_status("L0") == "passed"
    l1 = [c for c in res.checks.checks if c.level == "L1"]
    assert l1 and res.checks.gate_passed
    # sglang's dependencies are absent in this venv: L1 must say skipped, never passed
    assert res.checks.level_status("L1") == "skipped", res.checks.text()
    assert not res.checks.all_passed


@pytest.mark.l1
@pytest.mark.slow
def test_ddtree_l1_passes_with_light_deps(sshd, sglang_target_l1, sglpatch_home):
    host = sshd.host_entry(sglang_target_l1, name="sshd-l1")
    res = _story(host, sglang_target_l1, sglpatch_home)
    assert res.checks.level_status("L0") == "passed"
    assert res.checks.level_status("L1") in ("passed", "partial"), res.checks.text()
    assert not res.checks.failed
