"""The deploy transaction over a real OpenSSH sshd on loopback, against the real sglang 0.5.23 venv.

The SSH login user is non-root and owns the venv (tests/conftest.py). The patchset here is crafted
in the test from the installed ``spec_info.py`` (so it does not depend on the DDTree patchset); the
DDTree patchset itself is exercised in ``test_deploy_ddtree.py``. Every outcome is checked by sha256
against the installed distribution's RECORD. Round trips and seconds are printed (``-s``).
"""

from __future__ import annotations

import difflib
import hashlib
import os
import stat
import time
from pathlib import Path

import pytest
import yaml

from sglang_patcher.deploy import apply_to_host, host_status, rollback_host
from sglang_patcher.discovery import discover
from sglang_patcher.errors import CheckFailedError, DeployError, DriftError
from sglang_patcher.mirror import snapshot
from sglang_patcher.patchset import load_patchset
from sglang_patcher.transport import connect
from tests.support.venvs import site_packages_of

pytestmark = [pytest.mark.ssh, pytest.mark.sglang]

VERSION = "0.5.23"
SPEC = "sglang/srt/speculative/spec_info.py"
NEWMOD = "sglang/srt/speculative/sglpatch_probe_info.py"
L1_OK = """
import importlib.metadata as md, json
dist = md.distribution("sglang")
text = dist.locate_file("sglang/srt/speculative/spec_info.py").read_text()
ok = "SGLPATCH_TEST_MARKER" in text
print(json.dumps({"checks": [
    {"name": "marker in spec_info.py", "status": "passed" if ok else "failed", "detail": ""},
    {"name": "import sglang", "status": "skipped", "detail": "--no-deps install: torch missing"}]}))
"""
L1_FAIL = """
import json
print(json.dumps({"checks": [{"name": "from_string", "status": "failed",
                              "detail": "ValueError: crafted failure"}]}))
"""


def sha(b):
    return None if b is None else hashlib.sha256(b).hexdigest()


def make_patchset(root: Path, release_sp: Path, *, l1: str = L1_OK) -> object:
    """A one-patch patchset against the installed spec_info.py plus one new module (hashes rendered)."""
    old = (release_sp / SPEC).read_text()
    lines = old.splitlines(keepends=True)
    at = next(i for i, line in enumerate(lines) if line.startswith("class "))
    new_lines = lines[:at] + ["# SGLPATCH_TEST_MARKER\n"] + lines[at:]
    patch = "".join(difflib.unified_diff(lines, new_lines, f"a/{SPEC}", f"b/{SPEC}"))
    root.mkdir(parents=True)
    (root / "0001.patch").write_text(patch)
    (root / "probe_info.py").write_text("PROBE = True\n")
    (root / "l1.py").write_text(l1)
    spec = {"name": "sshprobe", "revision": 1,
            "targets": {VERSION: {"series": ["0001.patch"], "new_files": {NEWMOD: "probe_info.py"},
                                  "pristine": {SPEC: sha(old.encode())},
                                  "expected": {SPEC: sha("".join(new_lines).encode()),
                                               NEWMOD: sha(b"PROBE = True\n")}}},
            "checks": {"l1": "l1.py"}}
    (root / "patchset.yaml").write_text(yaml.safe_dump(spec))
    return load_patchset(root)


@pytest.fixture
def conn(ssh_host, sglpatch_home):
    t = connect(ssh_host)
    yield t
    t.close()


def pristine_reader(target):
    """Reads the cached pristine venv the target was cloned from (a local pristine copy)."""
    base = site_packages_of(Path(target.pristine))

    def read(rel):
        f = base / rel
        return f.read_bytes() if f.is_file() else None

    return read


def _live(target, rel):
    f = Path(target.site_packages) / rel
    return sha(f.read_bytes()) if f.exists() else None


def test_apply_status_reapply_rollback_over_ssh(conn, ssh_host, sglang_target, sglpatch_home, tmp_path):
    info = discover(conn, ssh_host)
    ps = make_patchset(tmp_path / "ps", Path(sglang_target.site_packages))
    spec_path = Path(sglang_target.site_packages) / SPEC
    st0 = spec_path.stat()
    cache = spec_path.parent / "__pycache__"
    pycs_before = sorted(p.name for p in cache.glob("spec_info.*.pyc"))

    t0, rt0 = time.monotonic(), conn.round_trips
    snap = snapshot(conn, ssh_host, info, home=sglpatch_home)
    snap_s, snap_rt = time.monotonic() - t0, conn.round_trips - rt0

    res = apply_to_host(conn, ssh_host, info, ps, pristine=snap.mirror, home=sglpatch_home)
    assert res.status == "applied", res.to_json()
    assert res.checks.level_status("L0") == "passed"
    assert [c.status for c in res.checks.checks if c.level == "L1"] == ["passed", "skipped"]
    assert res.plan.pristine_sources[SPEC] == "mirror"
    st1 = spec_path.stat()
    assert (st1.st_uid, st1.st_gid, stat.S_IMODE(st1.st_mode)) == (st0.st_uid, st0.st_gid, stat.S_IMODE(st0.st_mode))
    assert st1.st_ino != st0.st_ino  # replaced by rename, not written in place
    if pycs_before:
        assert not list(cache.glob("spec_info.*.pyc"))  # stale bytecode purged

    status = host_status(conn, ssh_host, info, ps)
    assert status.overall == "patched"
    assert {f.path: (f.state, f.revision) for f in status.files} == {SPEC: ("patched", 1), NEWMOD: ("patched", 1)}

    again = apply_to_host(conn, ssh_host, info, ps, pristine=snap.mirror, home=sglpatch_home)
    assert again.status == "already_applied" and again.round_trips == 1

    t1, rt1 = time.monotonic(), conn.round_trips
    rb = rollback_host(conn, ssh_host, info, home=sglpatch_home)
    rb_s, rb_rt = time.monotonic() - t1, conn.round_trips - rt1
    assert rb.rolled_back == [res.deployment_id]
    status = host_status(conn, ssh_host, info)
    assert status.overall == "pristine"
    for f in status.files:
        if f.path == NEWMOD:
            assert f.live is None
        else:
            assert f.live == f.record == info.record[f.path]
    assert _live(sglang_target, SPEC) == info.record[SPEC]
    print(f"\n[measure] loopback ssh, sglang {VERSION} ({snap.files} files): snapshot {snap_s:.2f} s / "
          f"{snap_rt} round trips; apply {res.seconds:.2f} s / {res.round_trips} round trips "
          f"(checks {res.checks.seconds}); re-apply {again.seconds:.2f} s / {again.round_trips}; "
          f"rollback {rb_s:.2f} s / {rb_rt}")


def test_drift_refused_over_ssh(conn, ssh_host, sglang_target, sglpatch_home, tmp_path):
    info = discover(conn, ssh_host)
    ps = make_patchset(tmp_path / "ps", Path(sglang_target.site_packages))
    spec_path = Path(sglang_target.site_packages) / SPEC
    drifted = spec_path.read_bytes() + b"\n# edited on the host\n"
    spec_path.write_bytes(drifted)
    with pytest.raises(DriftError) as ei:
        apply_to_host(conn, ssh_host, info, ps, pristine=pristine_reader(sglang_target), home=sglpatch_home)
    assert SPEC in str(ei.value)
    assert spec_path.read_bytes() == drifted
    assert not (Path(sglang_target.site_packages) / NEWMOD).exists()
    assert not (Path(sglang_target.site_packages) / ".sglpatch" / "lock").exists()


def test_failed_smoke_check_rolls_back_over_ssh(conn, ssh_host, sglang_target, sglpatch_home, tmp_path):
    info = discover(conn, ssh_host)
    ps = make_patchset(tmp_path / "ps", Path(sglang_target.site_packages), l1=L1_FAIL)
    with pytest.raises(CheckFailedError) as ei:
        apply_to_host(conn, ssh_host, info, ps, pristine=pristine_reader(sglang_target), home=sglpatch_home)
    assert "crafted failure" in str(ei.value) and "rolled back" in str(ei.value)
    assert _live(sglang_target, SPEC) == info.record[SPEC]
    assert not (Path(sglang_target.site_packages) / NEWMOD).exists()
    st = host_status(conn, ssh_host, info, ps)
    assert st.overall == "pristine" and st.lock is None and st.deployments[-1]["phase"] == "rolled_back"


def test_lost_host_backup_is_put_back_over_ssh(conn, ssh_host, sglang_target, sglpatch_home, tmp_path):
    """A backup deleted on the SSH host: rollback uploads the local copy (agent put_backups over
    the exec channel, the payload hash-checked there), restores the release and says so."""
    info = discover(conn, ssh_host)
    ps = make_patchset(tmp_path / "ps", Path(sglang_target.site_packages))
    res = apply_to_host(conn, ssh_host, info, ps, pristine=pristine_reader(sglang_target), home=sglpatch_home)
    backup = Path(sglang_target.site_packages) / ".sglpatch" / "backups" / res.deployment_id / SPEC
    backup.unlink()
    rb = rollback_host(conn, ssh_host, info, home=sglpatch_home)
    assert rb.rolled_back == [res.deployment_id]
    assert rb.backups_put_back == {res.deployment_id: {SPEC: "local copies"}}
    assert _live(sglang_target, SPEC) == info.record[SPEC] and sha(backup.read_bytes()) == info.record[SPEC]
    assert not (Path(sglang_target.site_packages) / NEWMOD).exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to make a file the SSH user does not own")
def test_root_owned_file_refused_before_any_write(conn, ssh_host, sglang_target, sglpatch_home, tmp_path):
    info = discover(conn, ssh_host)
    ps = make_patchset(tmp_path / "ps", Path(sglang_target.site_packages))
    spec_path = Path(sglang_target.site_packages) / SPEC
    os.chown(spec_path, 0, 0)
    try:
        with pytest.raises(DeployError) as ei:
            apply_to_host(conn, ssh_host, info, ps, pristine=pristine_reader(sglang_target), home=sglpatch_home)
        assert getattr(ei.value, "kind", None) == "not_writable"
        assert "owned by root" in str(ei.value) and "sudo" in str(ei.value)
        assert _live(sglang_target, SPEC) == info.record[SPEC]
        assert not (Path(sglang_target.site_packages) / ".sglpatch").exists()
    finally:
        os.chown(spec_path, sglang_target.uid, sglang_target.gid)


class _EnvTransport:
    """Wraps a real transport; runs every command under ``env NAME=VALUE`` on the host (test hook)."""

    def __init__(self, inner, **env):
        self.inner, self.env = inner, env
        self.name = inner.name

    @property
    def round_trips(self):
        return self.inner.round_trips

    def run(self, argv, **kw):
        return self.inner.run(["env", *(f"{k}={v}" for k, v in self.env.items()), *argv], **kw)

    def close(self):
        pass


def test_agent_killed_mid_commit_over_ssh_is_resumed_next_run(conn, ssh_host, sglang_target, sglpatch_home,
                                                             tmp_path):
    info = discover(conn, ssh_host)
    ps = make_patchset(tmp_path / "ps", Path(sglang_target.site_packages))
    read = pristine_reader(sglang_target)
    crashing = _EnvTransport(conn, SGLPATCH_AGENT_CRASH="commit:1")
    with pytest.raises(Exception) as ei:
        apply_to_host(crashing, ssh_host, info, ps, pristine=read, home=sglpatch_home)
    assert "137" in str(ei.value)
    st = host_status(conn, ssh_host, info, ps)
    assert st.overall == "pending" and st.journal["phase"] == "committing"
    for f in st.files:  # each file is whole: its old or its new version, never a torn one
        assert f.state in ("pristine", "patched"), f
    # the lock names this (live) process: not taken over silently...
    from sglang_patcher.errors import LockHeldError
    with pytest.raises(LockHeldError):
        apply_to_host(conn, ssh_host, info, ps, pristine=read, home=sglpatch_home)
    # ...but with --break-lock the next run finishes the commit and verifies it
    res = apply_to_host(conn, ssh_host, info, ps, pristine=read, home=sglpatch_home, break_lock=True)
    assert res.status == "resumed" and "resumed" in res.recovered[0]
    st = host_status(conn, ssh_host, info, ps)
    assert st.overall == "patched" and st.lock is None and st.journal is None


def test_a_push_that_fails_mid_way_over_ssh_leaves_no_backup_behind(conn, ssh_host, sglang_target, sglpatch_home,
                                                                    tmp_path):
    """The push's second rename fails on the host (as over a file made immutable after the plan):
    the host is rolled back AND keeps nothing of it — no backup folder under .sglpatch/backups/ that
    no deployment record names (prune never removed those), no journal, no lock; the next apply
    then deploys, with its own backups only."""
    info = discover(conn, ssh_host)
    ps = make_patchset(tmp_path / "ps", Path(sglang_target.site_packages))
    read = pristine_reader(sglang_target)
    site = Path(sglang_target.site_packages)
    with pytest.raises(DeployError) as ei:
        apply_to_host(_EnvTransport(conn, SGLPATCH_AGENT_FAIL="commit:2"), ssh_host, info, ps, pristine=read,
                      home=sglpatch_home)
    assert getattr(ei.value, "kind", None) == "push_failed" and "every file was restored" in str(ei.value)
    assert _live(sglang_target, SPEC) == info.record[SPEC] and not (site / NEWMOD).exists()
    assert not (site / ".sglpatch").exists(), sorted(map(str, (site / ".sglpatch").rglob("*")))
    res = apply_to_host(conn, ssh_host, info, ps, pristine=read, home=sglpatch_home)
    assert res.status == "applied"
    assert [p.name for p in (site / ".sglpatch" / "backups").iterdir()] == [res.deployment_id]


def test_truncated_upload_over_ssh_writes_nothing(conn, ssh_host, sglang_target, sglpatch_home):
    import json

    from sglang_patcher.deploy import make_holder, payload_tar
    from sglang_patcher.remote import launcher
    info = discover(conn, ssh_host)
    new = (Path(sglang_target.site_packages) / SPEC).read_bytes() + b"# new\n"
    tar = payload_tar({SPEC: new})
    args = {"site_packages": info.site_packages, "holder": make_holder("t"),
            "deployment": {"id": "20260101T000000Z-t-r1-000000"},
            "files": {SPEC: {"action": "write", "sha256": sha(new), "mode": None,
                             "allowed": [info.record[SPEC]]}}}
    res = launcher.run_script(conn, info.interpreter, "deploy_agent", "push", args, stdin=tar[:700])
    assert res.exit_code == 3 and json.loads(res.stdout)["kind"] == "bad_payload"
    assert _live(sglang_target, SPEC) == info.record[SPEC]
    assert not list((Path(sglang_target.site_packages) / SPEC).parent.glob(".spec_info.py.sglpatch-*"))
    assert not (Path(sglang_target.site_packages) / ".sglpatch").exists()


def test_two_deploys_at_once_do_not_interleave(ssh_host, sglang_target, sglpatch_home, tmp_path):
    import threading

    from sglang_patcher.errors import LockHeldError
    ps = make_patchset(tmp_path / "ps", Path(sglang_target.site_packages))
    read = pristine_reader(sglang_target)
    a, b = connect(ssh_host), connect(ssh_host)
    try:
        info = discover(a, ssh_host)
        a_holds_lock, b_done = threading.Event(), threading.Event()
        out = {}

        def progress(step, detail):
            if step == "checks":          # A has pushed and holds the lock until finish
                a_holds_lock.set()
                b_done.wait(60)

        def run_a():
            out["a"] = apply_to_host(a, ssh_host, info, ps, pristine=read, home=sglpatch_home, progress=progress)

        th = threading.Thread(target=run_a)
        th.start()
        assert a_holds_lock.wait(60)
        try:
            with pytest.raises(LockHeldError) as ei:
                apply_to_host(b, ssh_host, info, ps, pristine=read, home=sglpatch_home)
            assert f"pid {os.getpid()}" in str(ei.value)
        finally:
            b_done.set()
            th.join(60)
        assert out["a"].status == "applied"
        assert host_status(b, ssh_host, info, ps).overall == "patched"
    finally:
        a.close()
        b.close()


def test_an_apply_that_planned_before_another_pushed_is_refused_and_one_rollback_restores(
        ssh_host, sglang_target, sglpatch_home, tmp_path):
    """Issue 18: apply A inspects and plans (the host pristine), then pauses (its confirm prompt);
    apply B runs whole meanwhile (push, checks, finish). When A goes on, what it would write is
    checked under the host's lock against what its plan saw (compare-and-swap on each file's hash):
    the host changed, so A is refused (exit 8) before any write. One active deployment; one
    rollback ends pristine, by hash."""
    ps = make_patchset(tmp_path / "ps", Path(sglang_target.site_packages))
    read = pristine_reader(sglang_target)
    a, b = connect(ssh_host), connect(ssh_host)
    try:
        info = discover(a, ssh_host)
        seen = {}

        def confirm_a(plan):           # A has inspected the pristine host and planned its push
            assert sorted(plan.to_push) == [NEWMOD, SPEC]
            seen["b"] = apply_to_host(b, ssh_host, info, ps, pristine=read, home=sglpatch_home)
            return True

        with pytest.raises(DeployError) as ei:
            apply_to_host(a, ssh_host, info, ps, pristine=read, home=sglpatch_home, confirm=confirm_a)
        assert seen["b"].status == "applied"
        err = ei.value
        assert err.exit_code == 8 and getattr(err, "kind", None) == "changed", err
        assert "since this apply" in str(err) and SPEC in str(err) and "nothing was written" in str(err)
        assert seen["b"].deployment_id in str(err)

        st = host_status(a, ssh_host, info, ps)
        assert st.overall == "patched" and st.lock is None and st.journal is None
        assert [d["id"] for d in st.active] == [seen["b"].deployment_id]
        rb = rollback_host(a, ssh_host, info, home=sglpatch_home)
        assert rb.rolled_back == [seen["b"].deployment_id]
        assert _live(sglang_target, SPEC) == info.record[SPEC]
        assert not (Path(sglang_target.site_packages) / NEWMOD).exists()
        assert host_status(a, ssh_host, info, ps).overall == "pristine"
    finally:
        a.close()
        b.close()


def test_rollback_writes_the_restored_modules_bytecode_again(conn, ssh_host, sglang_target, sglpatch_home,
                                                             tmp_path):
    """Issue 18: apply purges the touched modules' __pycache__ entries, and rollback left them out,
    so the host's first import after a rollback compiled each one. Now the rollback compiles the
    restored modules again (as pip did at install): a valid timestamp pyc of the restored source."""
    import struct

    info = discover(conn, ssh_host)
    ps = make_patchset(tmp_path / "ps", Path(sglang_target.site_packages))
    spec_path = Path(sglang_target.site_packages) / SPEC
    res = apply_to_host(conn, ssh_host, info, ps, pristine=pristine_reader(sglang_target), home=sglpatch_home)
    cache = spec_path.parent / "__pycache__"
    assert not list(cache.glob("spec_info.*.pyc"))
    rb = rollback_host(conn, ssh_host, info, home=sglpatch_home)
    assert rb.rolled_back == [res.deployment_id]
    assert rb.bytecode["recompiled"] == [SPEC] and not rb.bytecode["failed"]
    major, minor = str(info.python_version).split(".")[:2]
    pycs = list(cache.glob("spec_info.*.pyc"))
    assert [p.name for p in pycs] == [f"spec_info.cpython-{major}{minor}.pyc"]   # the host Python's tag
    head = pycs[0].read_bytes()[:16]
    flags, mtime, size = struct.unpack("<III", head[4:16])
    st = spec_path.stat()
    assert flags == 0 and mtime == int(st.st_mtime) & 0xFFFFFFFF and size == st.st_size & 0xFFFFFFFF
    st_pyc = pycs[0].stat()
    assert (st_pyc.st_uid, st_pyc.st_gid) == (st.st_uid, st.st_gid)   # the SSH user's, as the install
    from rich.console import Console
    c = Console(width=200, record=True, file=open(os.devnull, "w"))
    c.print(rb)
    assert "1 restored module(s) compiled into __pycache__ again" in c.export_text()
    assert _live(sglang_target, SPEC) == info.record[SPEC]
