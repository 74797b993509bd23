"""A root-owned SGLang install reached by a non-root SSH user with `sudo: true`: apply, smoke checks,
status and rollback all run through `sudo -n`, and every file keeps its root owner and its mode."""

from __future__ import annotations

import hashlib
import json
import os

import pytest

from sglang_patcher import service_apply, service_rollback, service_status

pytestmark = [pytest.mark.ssh, pytest.mark.sglang, pytest.mark.slow]

SPEC_INFO = "sglang/srt/speculative/spec_info.py"


def _chown_root(site):
    for top in ("sglang", "sglang-0.5.23.dist-info"):
        d = site / top
        os.chown(d, 0, 0)
        for p in d.rglob("*"):
            os.lchown(p, 0, 0)


def test_apply_and_rollback_of_a_root_owned_install_through_sudo(sshd, sglang_target, ssh_user_sudo,
                                                                 sglpatch_home):
    site = sglang_target.site_packages
    _chown_root(site)
    target = site / SPEC_INFO
    before = hashlib.sha256(target.read_bytes()).hexdigest()
    mode = target.stat().st_mode & 0o7777

    plain = sshd.host_entry(sglang_target)
    with pytest.raises(Exception) as exc:     # without sudo the login user cannot write it
        service_apply.apply_patchset("ddtree@1", plain, confirm=lambda plan: True)
    assert getattr(exc.value, "exit_code", None) == 8, exc.value

    host = sshd.host_entry(sglang_target, sudo=True)
    res = service_apply.apply_patchset("ddtree@1", host, confirm=lambda plan: True)
    assert res.status == "applied" and res.checks.level_status("L0") == "passed"
    st = target.stat()
    assert (st.st_uid, st.st_gid) == (0, 0) and st.st_mode & 0o7777 == mode
    assert hashlib.sha256(target.read_bytes()).hexdigest() != before
    assert service_status.host_status(host, patchset="ddtree@1").overall == "patched"

    service_rollback.rollback(host)
    st = target.stat()
    assert (st.st_uid, st.st_gid) == (0, 0) and st.st_mode & 0o7777 == mode
    assert hashlib.sha256(target.read_bytes()).hexdigest() == before
    assert service_status.host_status(host, patchset="ddtree@1").overall == "pristine"


@pytest.mark.no_sudo
def test_the_no_sudo_refusal_says_each_reason_once(sshd, sglang_target, sglpatch_home):
    """Issue 18: without sudo on a root-owned install the refusal repeated the same two reasons for
    all 20 files in one 4 KB line: now one line per reason, a few files named, the count given."""
    if os.geteuid() != 0:
        pytest.skip("needs root to make the install root-owned")
    _chown_root(sglang_target.site_packages)
    with pytest.raises(Exception) as exc:
        service_apply.apply_patchset("ddtree", sshd.host_entry(sglang_target), confirm=lambda plan: True)
    err = exc.value
    assert getattr(err, "exit_code", None) == 8 and getattr(err, "kind", None) == "not_writable", err
    msg = err.message
    assert msg.count("owned by root") == 1 and msg.count("not writable by") == 1, msg
    assert " more" in msg and len(msg) < 1000, msg
    assert len(err.details["problems"]) > 20      # the JSON details keep every file's reason


@pytest.mark.parametrize("state_owner", ["root", "login user"])
def test_prune_without_sudo_of_backups_written_through_sudo_is_refused_whole(sshd, sglang_target, ssh_user_sudo,
                                                                             sglpatch_home, state_owner):
    """Issue 18: deployments made with `sudo: true` and rolled back, then `prune` from an entry
    without sudo: one clear refusal (exit 8) naming the root-owned backups and `sudo: true` — no
    traceback, no record marked pruned, every backup still there; with sudo the same prune works.
    The state dir is root's (the lock cannot be taken), or the login user's with root-owned backup
    trees inside (the records could be rewritten, the backups not deleted)."""
    from sglang_patcher.errors import DeployError

    site = sglang_target.site_packages
    _chown_root(site)
    host = sshd.host_entry(sglang_target, sudo=True)
    ids = []
    for _ in range(2):
        ids.append(service_apply.apply_patchset("ddtree@1", host, confirm=lambda plan: True).deployment_id)
        service_rollback.rollback(host)
    state = site / ".sglpatch"
    if state_owner == "login user":
        for p in [state, state / "backups", state / "deployments", *(state / "deployments").iterdir()]:
            os.chown(p, sglang_target.uid, sglang_target.gid)
    records = {i: (state / "deployments" / f"{i}.json").read_bytes() for i in ids}
    assert all((state / "backups" / i).is_dir() for i in ids)

    plain = sshd.host_entry(sglang_target)
    with pytest.raises(DeployError) as exc:
        service_rollback.prune(plain, keep=0)
    err = exc.value
    assert err.exit_code == 8 and getattr(err, "kind", None) == "not_writable", err
    msg = str(err) + (err.hint or "")
    assert "sudo: true" in msg and "Traceback" not in msg
    assert str(state / "backups" if state_owner == "login user" else state) in str(err)
    for i in ids:          # nothing half-done: records as they were, backups all there
        assert (state / "deployments" / f"{i}.json").read_bytes() == records[i]
        assert (state / "backups" / i / "sglang").is_dir()
    assert not (state / "lock").exists()

    out = service_rollback.prune(host, keep=0)
    assert sorted(p["id"] for p in out.pruned) == sorted(ids)
    for i in ids:
        assert not (state / "backups" / i).exists()
        assert "backups_pruned" in json.loads((state / "deployments" / f"{i}.json").read_text())
