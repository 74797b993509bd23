"""A root-owned SGLang install reached by a non-root SSH user with `sudo: true`: apply, smoke checks,
status and rollback all run through `sudo -n`, and every file keeps its root owner and its mode."""

from __future__ import annotations

import hashlib
import os

import pytest

from sglang_patcher import service

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
        service.apply_patchset("ddtree@1", plain, confirm=lambda plan: True)
    assert getattr(exc.value, "exit_code", None) == 8, exc.value

    host = sshd.host_entry(sglang_target, sudo=True)
    res = service.apply_patchset("ddtree@1", host, confirm=lambda plan: True)
    assert res.status == "applied" and res.checks.level_status("L0") == "passed"
    st = target.stat()
    assert (st.st_uid, st.st_gid) == (0, 0) and st.st_mode & 0o7777 == mode
    assert hashlib.sha256(target.read_bytes()).hexdigest() != before
    assert service.host_status(host, patchset="ddtree@1").overall == "patched"

    service.rollback(host)
    st = target.stat()
    assert (st.st_uid, st.st_gid) == (0, 0) and st.st_mode & 0o7777 == mode
    assert hashlib.sha256(target.read_bytes()).hexdigest() == before
    assert service.host_status(host, patchset="ddtree@1").overall == "pristine"
