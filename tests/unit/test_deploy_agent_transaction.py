"""The deploy transaction end to end over the local transport, on a small release tree.

Real parts: a patchset directory on disk loaded by ``load_patchset``, the strict applier, the host
agent run by this machine's interpreter, L0/L1 run for real. Every outcome is checked by sha256.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from sglang_patcher.deploy import apply_to_host, host_status, make_holder, plan_apply, rollback_host
from sglang_patcher.errors import CheckFailedError, DriftError, LockHeldError
from sglang_patcher.patchset import load_patchset
from sglang_patcher.transport.local import LocalTransport
from tests.support.inode_flags import chattr  # noqa: F401  (the fixture)

VERSION = "9.9.9"
SPEC = "sglang/srt/spec.py"
ARGS = "sglang/srt/args.py"
NEWMOD = "sglang/srt/speculative/ddx_info.py"
RELEASE = {
    SPEC: b"class Algo:\n    NONE = 0\n    EAGLE = 1\n\n\ndef names():\n    return ['NONE', 'EAGLE']\n",
    ARGS: b"DEFAULTS = {\n    'topk': 1,\n}\n",
    "sglang/srt/speculative/__init__.py": b"",
}
PATCH_R1 = """--- a/sglang/srt/spec.py
+++ b/sglang/srt/spec.py
@@ -1,7 +1,8 @@
 class Algo:
     NONE = 0
     EAGLE = 1
+    DDX = 2
 
 
 def names():
-    return ['NONE', 'EAGLE']
+    return ['NONE', 'EAGLE', 'DDX']
"""
PATCH_R2_ARGS = """--- a/sglang/srt/args.py
+++ b/sglang/srt/args.py
@@ -1,3 +1,4 @@
 DEFAULTS = {
     'topk': 1,
+    'ddx_budget': 8,
 }
"""
L1_OK = """
import json, sys
sys.path.insert(0, sys.argv[1]) if len(sys.argv) > 1 else None
print(json.dumps({"checks": [{"name": "marker", "status": "passed", "detail": ""},
                             {"name": "gpu", "status": "skipped", "detail": "no GPU here"}]}))
"""
L1_FAIL = """
import json
print(json.dumps({"checks": [{"name": "from_string('DDX')", "status": "failed",
                              "detail": "ValueError: unknown algorithm DDX"}]}))
"""


def sha(b):
    return None if b is None else hashlib.sha256(b).hexdigest()


def make_patchset(root: Path, *, revision=1, l1=L1_OK, with_args=False, history=None) -> Path:
    """Write a patchset dir whose hashes are computed by rendering it (as `refresh` would)."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "series").mkdir(exist_ok=True)
    (root / "modules").mkdir(exist_ok=True)
    (root / "checks").mkdir(exist_ok=True)
    (root / "series/0001-spec.patch").write_text(PATCH_R1)
    series = ["series/0001-spec.patch"]
    if with_args:
        (root / "series/0002-args.patch").write_text(PATCH_R2_ARGS)
        series.append("series/0002-args.patch")
    (root / "modules/ddx_info.py").write_text(f"REVISION = {revision}\n")
    (root / "checks/l1.py").write_text(l1)
    spec = {"name": "ddx", "revision": revision, "description": "test patchset",
            "targets": {VERSION: {"series": series, "new_files": {NEWMOD: "modules/ddx_info.py"},
                                  "pristine": {}, "expected": {}}},
            "checks": {"l1": "checks/l1.py"}, "history": history or {}}
    (root / "patchset.yaml").write_text(yaml.safe_dump(spec))
    ps = load_patchset(root)
    res = ps.render(VERSION, lambda p: RELEASE.get(p), check_hashes=False)
    t = spec["targets"][VERSION]
    for p, ch in res.files.items():
        t["pristine"][p] = sha(RELEASE.get(p))
        t["expected"][p] = sha(ch.new)
    (root / "patchset.yaml").write_text(yaml.safe_dump(spec))
    return root


@pytest.fixture
def env(tmp_path):
    sp = tmp_path / "host" / "site-packages"
    for rel, data in RELEASE.items():
        (sp / rel).parent.mkdir(parents=True, exist_ok=True)
        (sp / rel).write_bytes(data)
    mirror = tmp_path / "mirror"
    for rel, data in RELEASE.items():
        (mirror / rel).parent.mkdir(parents=True, exist_ok=True)
        (mirror / rel).write_bytes(data)

    def read_mirror(p):
        f = mirror / p
        return f.read_bytes() if f.exists() else None

    host = SimpleNamespace(name="unit-host", python=sys.executable, sudo=False, state_dir=None)
    info = SimpleNamespace(interpreter=sys.executable, sglang_version=VERSION, site_packages=str(sp),
                           record={p: sha(d) for p, d in RELEASE.items()})
    ps = load_patchset(make_patchset(tmp_path / "ps1"))
    return SimpleNamespace(sp=sp, mirror=mirror, read=read_mirror, host=host, info=info, ps=ps,
                           home=tmp_path / "home", tmp=tmp_path, t=LocalTransport("unit-host"))


def live(env, rel):
    f = env.sp / rel
    return sha(f.read_bytes()) if f.exists() else None


def assert_release(env):
    for rel, data in RELEASE.items():
        assert live(env, rel) == sha(data), rel
    assert not (env.sp / NEWMOD).exists()


def apply(env, ps=None, **kw):
    return apply_to_host(env.t, env.host, env.info, ps or env.ps, pristine=kw.pop("pristine", env.read),
                         home=env.home, **kw)


def test_apply_status_noop_rollback_status(env):
    res = apply(env)
    assert res.status == "applied" and res.round_trips == 5
    assert res.checks.gate_passed and res.checks.level_status("L1") == "partial"
    assert live(env, NEWMOD) == sha(b"REVISION = 1\n")
    st = host_status(env.t, env.host, env.info, env.ps)
    assert st.overall == "patched"
    assert {f.path: (f.state, f.patchset, f.revision) for f in st.files} == {
        SPEC: ("patched", "ddx", 1), NEWMOD: ("patched", "ddx", 1)}
    assert [d["phase"] for d in st.deployments] == ["verified"]
    assert st.deployments[0]["checks"]["L0"] == "passed"
    local = json.loads(Path(res.local_record).read_text())
    assert local["phase"] == "verified"
    assert (env.home / "backups/unit-host" / res.deployment_id / SPEC).read_bytes() == RELEASE[SPEC]

    again = apply(env)
    assert again.status == "already_applied" and again.round_trips == 1
    assert again.plan.kind == "noop"

    rb = rollback_host(env.t, env.host, env.info, home=env.home)
    assert rb.rolled_back == [res.deployment_id]
    assert_release(env)
    st = host_status(env.t, env.host, env.info)  # no patchset: judged by RECORD and the records
    assert st.overall == "pristine"
    assert all(f.live == f.record for f in st.files if f.state == "pristine")
    assert json.loads(Path(res.local_record).read_text())["phase"] == "rolled_back"


def test_dry_run_writes_nothing(env):
    res = apply(env, dry_run=True)
    assert res.status == "dry_run" and "+    DDX = 2" in res.plan.diff
    assert set(res.plan.to_push) == {SPEC, NEWMOD}
    assert_release(env)
    assert not (env.sp / ".sglpatch").exists()


@pytest.mark.parametrize("dry_run", [True, False])
def test_a_file_the_push_could_not_replace_is_refused_by_the_plan_before_anything_is_written(env, chattr, dry_run):
    """An immutable file among those the apply would write: the plan refuses — a dry run too, which
    used to say it would write them — with exit 8, naming the host, the file and why, and how to
    clear the flag; nothing is written on the host or here. A file the plan does not touch may stay
    immutable."""
    from sglang_patcher.errors import DeployError

    chattr("+i", env.sp / SPEC, env.sp / ARGS)       # ARGS: not touched by this patchset
    with pytest.raises(DeployError) as ei:
        apply(env, dry_run=dry_run)
    err = ei.value
    assert err.exit_code == 8 and err.kind == "not_writable", err
    assert err.message.startswith("unit-host: cannot apply ddx r1: 1 of the 2 file(s)"), err.message
    assert f"{SPEC} is immutable (chattr +i)" in err.message and ARGS not in err.message, err.message
    assert "nothing was written" in err.message and "chattr -i" in err.hint, err.hint
    assert err.details["files"].keys() == {SPEC} and err.details["kinds"] == ["immutable"]
    assert_release(env)
    assert not (env.sp / ".sglpatch").exists() and not list(env.home.rglob("*.json"))
    # once the flag is cleared the same apply goes through
    import subprocess
    subprocess.run(["chattr", "-i", str(env.sp / SPEC)], check=True)
    assert apply(env, dry_run=dry_run).status == ("dry_run" if dry_run else "applied")
    if not dry_run:   # a host already carrying the revision: nothing to write, so nothing to refuse
        chattr("+i", env.sp / SPEC, env.sp / ".sglpatch")     # the state dir too: not written by a no-op
        assert apply(env).status == "already_applied"


def test_an_apply_whose_push_fails_mid_way_leaves_no_backup_no_record_names(env, monkeypatch):
    """The push fails at its second rename (as over a file made immutable after the plan): the host
    is as before — every file restored, no backup folder left under .sglpatch/backups/ that no
    record names, no journal, no lock — and prune has nothing to do."""
    from sglang_patcher.deploy import prune_host
    from sglang_patcher.errors import DeployError

    monkeypatch.setenv("SGLPATCH_AGENT_FAIL", "commit:2")
    with pytest.raises(DeployError) as ei:
        apply(env)
    assert ei.value.kind == "push_failed" and "every file was restored" in ei.value.message, ei.value
    assert_release(env)
    assert not (env.sp / ".sglpatch").exists()
    monkeypatch.delenv("SGLPATCH_AGENT_FAIL")
    res = prune_host(env.t, env.host, env.info, keep=0, home=env.home)
    assert res.pruned == [] and res.orphans == [] and res.orphans_kept == []
    st = host_status(env.t, env.host, env.info, env.ps)
    assert st.overall == "pristine" and st.deployments == [] and st.lock is None and st.journal is None


def test_drift_is_refused_with_the_files_named_then_forced(env):
    (env.sp / SPEC).write_bytes(RELEASE[SPEC] + b"# hand edit\n")
    with pytest.raises(DriftError) as ei:
        apply(env)
    assert SPEC in str(ei.value) and "--force" in str(ei.value)
    assert not (env.sp / NEWMOD).exists()
    res = apply(env, force=True)
    assert res.status == "applied" and res.record["forced"]
    # the drifted original is kept (fetched from the host's backup for the local copy)
    assert (env.home / "backups/unit-host" / res.deployment_id / SPEC).read_bytes().endswith(b"# hand edit\n")
    rollback_host(env.t, env.host, env.info, home=env.home)
    assert (env.sp / SPEC).read_bytes() == RELEASE[SPEC] + b"# hand edit\n"


def test_failed_smoke_check_rolls_back_by_itself(env):
    bad = load_patchset(make_patchset(env.tmp / "psbad", l1=L1_FAIL))
    with pytest.raises(CheckFailedError) as ei:
        apply(env, ps=bad)
    msg = str(ei.value)
    assert "rolled back" in msg and "unknown algorithm DDX" in msg
    assert_release(env)
    st = host_status(env.t, env.host, env.info, bad)
    assert st.overall == "pristine" and st.deployments[-1]["phase"] == "rolled_back"
    assert st.lock is None and st.journal is None


def test_upgrade_from_an_earlier_revision(env):
    r1 = apply(env)
    h1 = {p: f["after"] for p, f in r1.record["files"].items()}
    ps2 = load_patchset(make_patchset(env.tmp / "ps2", revision=2, with_args=True,
                                      history={1: {VERSION: h1}}))
    # the mirror was re-snapshotted after r1 went on: it holds patched files now
    for rel in (SPEC,):
        (env.mirror / rel).write_bytes((env.sp / rel).read_bytes())
    plan = plan_apply(env.t, env.host, env.info, ps2, pristine=env.read, home=env.home)
    assert plan.kind == "upgrade"
    assert plan.files[NEWMOD].state == "older" and plan.files[NEWMOD].found_revision == 1
    assert plan.files[SPEC].state == "patched"  # same bytes in r1 and r2: left alone
    assert plan.files[ARGS].state == "pristine"
    assert plan.pristine_sources[SPEC] == "local backups"
    res = apply(env, ps=ps2)
    assert res.status == "applied"
    assert host_status(env.t, env.host, env.info, ps2).overall == "patched"
    assert live(env, NEWMOD) == sha(b"REVISION = 2\n")
    # roll back to before r1: both deployments, newest first
    rb = rollback_host(env.t, env.host, env.info, r1.deployment_id, home=env.home)
    assert rb.rolled_back == [res.deployment_id, r1.deployment_id]
    assert_release(env)


def test_pristine_from_host_backups_when_mirror_and_local_copies_are_patched(env):
    r1 = apply(env)
    (env.mirror / SPEC).write_bytes((env.sp / SPEC).read_bytes())
    import shutil
    shutil.rmtree(env.home / "backups")
    plan = plan_apply(env.t, env.host, env.info, env.ps, pristine=env.read, home=env.home)
    assert plan.kind == "noop" and plan.pristine_sources[SPEC] == "host backups"


@pytest.mark.parametrize("point,expect", [("commit:1", "resumed"), ("pushed:0", "resumed"),
                                          ("stage:1", "applied")])
def test_interrupted_apply_is_finished_or_undone_by_the_next_run(env, monkeypatch, point, expect):
    monkeypatch.setenv("SGLPATCH_AGENT_CRASH", point)
    with pytest.raises(Exception):
        apply(env)
    monkeypatch.delenv("SGLPATCH_AGENT_CRASH")
    st = host_status(env.t, env.host, env.info, env.ps)
    assert st.overall == "pending" and st.journal is not None and st.lock is not None
    # the lock's holder is this test process, which is alive: the next run must not take it over...
    with pytest.raises(LockHeldError):
        apply(env)
    # ...until that process is gone (simulated by the lock naming a pid that does not run)
    lock = env.sp / ".sglpatch/lock"
    holder = json.loads(lock.read_text())
    holder["pid"] = 2 ** 22 + 12345
    lock.write_text(json.dumps(holder))
    res = apply(env)
    assert res.status == expect
    assert res.recovered and ("resumed" in res.recovered[0] or "rolled back" in res.recovered[0])
    st = host_status(env.t, env.host, env.info, env.ps)
    assert st.overall == "patched" and st.lock is None and st.journal is None
    # a resumed deployment keeps local copies of its originals too (the backup_missing hint uses them)
    did = res.deployment_id
    rec = json.loads((env.home / "deployments" / env.host.name / f"{did}.json").read_text())
    for p, f in rec["files"].items():
        if f.get("before") is not None:
            local = env.home / "backups" / env.host.name / did / p
            assert hashlib.sha256(local.read_bytes()).hexdigest() == f["before"], p


@pytest.mark.parametrize("point", ["pushed:0", "commit:1"])
def test_dry_run_on_an_interrupted_deployment_says_so_and_changes_nothing(env, monkeypatch, point):
    """A pending journal (files already written or half committed) is never "already applied"
    in a dry run: the status is dry_run and the note says what a real run would do."""
    monkeypatch.setenv("SGLPATCH_AGENT_CRASH", point)
    with pytest.raises(Exception):
        apply(env)
    monkeypatch.delenv("SGLPATCH_AGENT_CRASH")
    before = {p: live(env, p) for p in (SPEC, NEWMOD)}
    journal = (env.sp / ".sglpatch/journal.json").read_bytes()
    res = apply(env, dry_run=True)
    assert res.status == "dry_run"
    assert res.recovered and "was interrupted in phase" in res.recovered[0] and "resumes it" in res.recovered[0]
    assert {p: live(env, p) for p in (SPEC, NEWMOD)} == before
    assert (env.sp / ".sglpatch/journal.json").read_bytes() == journal
    assert host_status(env.t, env.host, env.info, env.ps).overall == "pending"


@pytest.mark.parametrize("force", [False, True])
def test_rollback_refuses_a_deployment_made_on_another_release(env, force):
    """SGLang reinstalled at another release under a deployment (pip replaced the files): its
    backups are the old release's bytes, so rollback — --force included — refuses, names both
    releases and the files the deployment added, and writes nothing."""
    from sglang_patcher.errors import StateError

    res = apply(env)
    live_before = {p: live(env, p) for p in (SPEC, NEWMOD)}
    env.info.sglang_version = "9.9.10"  # what discovery reports after the reinstall
    assert f"deployment {res.deployment_id} was made on sglang {VERSION}" in _text(
        host_status(env.t, env.host, env.info))
    with pytest.raises(StateError) as ei:
        rollback_host(env.t, env.host, env.info, home=env.home, force=force)
    msg, hint = ei.value.message, ei.value.hint
    assert f"deployment {res.deployment_id} was made on sglang {VERSION}" in msg and "now has sglang 9.9.10" in msg
    assert "nothing was changed" in msg and NEWMOD in hint and f"deployments/{res.deployment_id}.json" in hint
    assert {p: live(env, p) for p in (SPEC, NEWMOD)} == live_before
    assert not (env.sp / ".sglpatch/journal.json").exists() and not (env.sp / ".sglpatch/lock").exists()
    env.info.sglang_version = VERSION  # the release it was made on: the rollback goes through
    assert rollback_host(env.t, env.host, env.info, home=env.home).rolled_back == [res.deployment_id]
    assert_release(env)


def test_lock_held_by_another_deploy_names_it_and_break_lock(env):
    other = make_holder("someone-elses-deploy")
    other.update(user="alice", host="laptop-7", pid=4242)
    (env.sp / ".sglpatch").mkdir()
    (env.sp / ".sglpatch/lock").write_text(json.dumps(other))
    with pytest.raises(LockHeldError) as ei:
        apply(env)
    assert "alice@laptop-7 pid 4242" in str(ei.value) and "--break-lock" in str(ei.value)
    assert_release(env)
    res = apply(env, break_lock=True)
    assert res.status == "applied"
    assert host_status(env.t, env.host, env.info, env.ps).lock is None


def _text(renderable) -> str:
    from rich.console import Console
    c = Console(width=110, record=True, file=open(os.devnull, "w"))
    c.print(renderable)
    return c.export_text()


def test_results_render_and_serialise(env):
    res = apply(env)
    text = _text(res)
    assert "applied" in text and res.deployment_id in text and "5 round trips" in text
    assert SPEC in text and "skipped" in text  # the L1 check that skipped is shown as skipped
    j = json.loads(json.dumps(res.to_json()))
    assert j["checks"]["summary"]["L1"] == "partial" and j["plan"]["kind"] == "apply"
    st = host_status(env.t, env.host, env.info, env.ps)
    text = _text(st)
    assert "patched" in text and "verified" in text and res.deployment_id in text
    assert json.loads(json.dumps(st.to_json()))["overall"] == "patched"
    rb = rollback_host(env.t, env.host, env.info, home=env.home)
    assert res.deployment_id in _text(rb) and json.loads(json.dumps(rb.to_json()))["rolled_back"]


def test_status_without_patchset_shows_an_interrupted_deployment(env, monkeypatch):
    monkeypatch.setenv("SGLPATCH_AGENT_CRASH", "commit:1")
    with pytest.raises(Exception):
        apply(env)
    monkeypatch.delenv("SGLPATCH_AGENT_CRASH")
    st = host_status(env.t, env.host, env.info)
    assert st.overall == "pending" and {f.path for f in st.files} == {SPEC, NEWMOD}
    assert "interrupted in phase committing" in _text(st)
    rb = rollback_host(env.t, env.host, env.info, home=env.home, break_lock=True)
    assert rb.rolled_back == [st.journal["id"]]
    assert_release(env)


def test_host_state_dir_outside_site_packages(env):
    state = env.tmp / "elsewhere" / "sglpatch-state"
    env.host.state_dir = str(state)
    res = apply(env)
    assert res.status == "applied"
    assert not (env.sp / ".sglpatch").exists()
    assert (state / "deployments" / f"{res.deployment_id}.json").is_file()
    assert (state / "backups" / res.deployment_id / SPEC).read_bytes() == RELEASE[SPEC]
    assert host_status(env.t, env.host, env.info, env.ps).overall == "patched"
    rollback_host(env.t, env.host, env.info, home=env.home)
    assert_release(env)


CRASH_POINTS = ["partial:1", "stage:1", "partial:2", "stage:2", "commit:1", "commit:2", "pushed:0"]


@pytest.mark.parametrize("point", CRASH_POINTS)
@pytest.mark.parametrize("then", ["apply", "rollback"])
def test_every_interruption_point_is_recoverable(env, monkeypatch, point, then):
    """Kill the agent at each point of a push; the next apply ends patched, a rollback ends pristine,
    and at no point does any file under its real name hold anything but its old or new bytes."""
    monkeypatch.setenv("SGLPATCH_AGENT_CRASH", point)
    with pytest.raises(Exception):
        apply(env)
    monkeypatch.delenv("SGLPATCH_AGENT_CRASH")
    assert live(env, SPEC) in (sha(RELEASE[SPEC]), env.ps.target(VERSION).expected[SPEC])
    assert live(env, NEWMOD) in (None, sha(b"REVISION = 1\n"))
    if then == "apply":
        res = apply(env, break_lock=True)
        assert res.status in ("applied", "resumed") and res.recovered
        assert host_status(env.t, env.host, env.info, env.ps).overall == "patched"
    else:
        rollback_host(env.t, env.host, env.info, home=env.home, break_lock=True)
        assert_release(env)
    st = host_status(env.t, env.host, env.info, env.ps)
    assert st.lock is None and st.journal is None
    assert not [p for p in env.sp.rglob("*") if ".sglpatch-" in p.name]


def test_missing_backups_hint_copies_locally_or_by_scp(tmp_path):
    """The hint names each local copy and where it goes: a plain path on a local host, HOST:path
    (e.g. with scp) on a remote one; a backup with no local copy is named as lost."""
    from sglang_patcher.deploy.rollback import missing_backups_hint as _missing_backups_hint

    keep = tmp_path / "backups" / "gpu-1" / "d1" / "a.py"
    keep.parent.mkdir(parents=True)
    keep.write_text("x")
    backups = {"a.py": "/site/.sglpatch/backups/d1/a.py", "b.py": "/site/.sglpatch/backups/d1/b.py"}
    remote = _missing_backups_hint(tmp_path, "gpu-1", "d1", backups)
    local = _missing_backups_hint(tmp_path, "gpu-1", "d1", backups, local=True)
    assert f"copy {keep} to gpu-1:/site/.sglpatch/backups/d1/a.py (e.g. with scp)" in remote
    assert f"copy {keep} to /site/.sglpatch/backups/d1/a.py, then rerun" in local and "scp" not in local
    assert "no local copy of b.py either" in remote and "no local copy of b.py either" in local
    # many files with local copies: one directory copy, not a command per file
    many = {f"sglang/m{i}.py": f"/site/.sglpatch/backups/d2/sglang/m{i}.py" for i in range(11)}
    for rel in many:
        f = tmp_path / "backups" / "gpu-1" / "d2" / rel
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text("x")
    d2 = tmp_path / "backups" / "gpu-1" / "d2"
    remote = _missing_backups_hint(tmp_path, "gpu-1", "d2", many)
    local = _missing_backups_hint(tmp_path, "gpu-1", "d2", many, local=True)
    assert remote.count("copy") == 1 and f"scp -r {d2}/. gpu-1:/site/.sglpatch/backups/d2/" in remote, remote
    assert local.count("copy") == 1 and f"cp -r {d2}/. /site/.sglpatch/backups/d2/" in local, local


@pytest.mark.parametrize("then", ["rollback", "apply"])
def test_an_interrupted_rollback_is_finished_by_the_next_run(env, monkeypatch, then):
    """Kill the agent after the first file a rollback restores: the host says pending (journal
    rolling_back, no file holds anything but its old or new bytes); the next rollback completes it
    and ends pristine; an apply first finishes that rollback (never a push over a half-restored
    install) and then deploys."""
    res = apply(env)
    assert res.status == "applied"
    monkeypatch.setenv("SGLPATCH_AGENT_CRASH", "restore:1")
    with pytest.raises(Exception):
        rollback_host(env.t, env.host, env.info, home=env.home)
    monkeypatch.delenv("SGLPATCH_AGENT_CRASH")
    assert live(env, SPEC) in (sha(RELEASE[SPEC]), env.ps.target(VERSION).expected[SPEC])
    st = host_status(env.t, env.host, env.info, env.ps)
    assert st.overall == "pending" and st.journal["phase"] == "rolling_back", st.to_json()
    if then == "rollback":
        rollback_host(env.t, env.host, env.info, home=env.home, break_lock=True)
        assert_release(env)
    else:
        res = apply(env, break_lock=True)
        assert res.status == "applied" and res.recovered and "rolled back" in res.recovered[0], res
        assert host_status(env.t, env.host, env.info, env.ps).overall == "patched"
    st = host_status(env.t, env.host, env.info, env.ps)
    assert st.lock is None and st.journal is None
    assert not [p for p in env.sp.rglob("*") if ".sglpatch-" in p.name]


def test_prune_deletes_only_rolled_back_backups_beyond_keep(env):
    """Three deployments rolled back and one active: prune --keep 1 deletes the backups of the two
    oldest rolled-back ones (their records stay, marked), keeps the newest rolled-back one's and
    never touches the active one's; a dry run deletes nothing; the active one still rolls back."""
    from sglang_patcher.deploy import prune_host

    backups = env.sp / ".sglpatch/backups"
    done = []
    for _ in range(3):
        did = apply(env).deployment_id
        rollback_host(env.t, env.host, env.info, home=env.home)
        done.append(did)
    active = apply(env).deployment_id
    assert all((backups / d).is_dir() for d in done + [active])
    dry = prune_host(env.t, env.host, env.info, keep=1, dry_run=True)
    assert dry.dry_run and [p["id"] for p in dry.pruned] == done[:2] and dry.freed_bytes > 0
    assert all((backups / d).is_dir() for d in done + [active])  # nothing deleted
    local = env.home / "backups" / env.host.name
    assert all((local / d).is_dir() for d in done)
    res = prune_host(env.t, env.host, env.info, keep=1, home=env.home)
    assert [p["id"] for p in res.pruned] == done[:2] and res.kept == [done[2]]
    assert [(local / d).is_dir() for d in done] == [False, False, True]  # the local copies go too
    assert res.freed_bytes == dry.freed_bytes
    assert not (backups / done[0]).exists() and not (backups / done[1]).exists()
    assert (backups / done[2]).is_dir() and (backups / active).is_dir()
    for d in done[:2]:
        assert json.loads((env.sp / ".sglpatch/deployments" / f"{d}.json").read_text())["backups_pruned"]
    assert prune_host(env.t, env.host, env.info, keep=1).pruned == []  # again: nothing left to prune
    st = host_status(env.t, env.host, env.info, env.ps)
    assert st.overall == "patched" and st.lock is None and st.bad_backups == {}
    rollback_host(env.t, env.host, env.info, home=env.home)
    assert_release(env)
    assert [p["id"] for p in prune_host(env.t, env.host, env.info, keep=0).pruned] == [done[2], active]
    with pytest.raises(ValueError):
        prune_host(env.t, env.host, env.info, keep=-1)


def test_host_backups_reader_skips_pruned_and_missing_backups(env):
    """After a prune, a pristine read that reaches the host's backups passes over the pruned
    deployment (and one whose backups vanished) to one that still has them; never an error."""
    from sglang_patcher.deploy import prune_host
    from sglang_patcher.deploy.agent import agent_for as _agent_for
    from sglang_patcher.deploy.pristine import HostBackups as _HostBackups

    first = apply(env).deployment_id
    rollback_host(env.t, env.host, env.info, home=env.home)
    second = apply(env).deployment_id
    assert [p["id"] for p in prune_host(env.t, env.host, env.info, keep=0, home=env.home).pruned] == [first]
    records = {d["id"]: d for d in host_status(env.t, env.host, env.info).deployments}
    assert records[first]["backups_pruned"]
    agent = _agent_for(env.t, env.host, env.info)
    want = {SPEC: sha(RELEASE[SPEC])}
    assert _HostBackups(agent, [records[first], records[second]], want)(SPEC) == RELEASE[SPEC]
    vanished = {**records[first], "backups_pruned": None}  # a record that does not say so: backup_tar fails
    assert _HostBackups(agent, [vanished, records[second]], want)(SPEC) == RELEASE[SPEC]
    assert _HostBackups(agent, [vanished], want)(SPEC) is None


def test_prune_refuses_a_pending_deployment(env, monkeypatch):
    from sglang_patcher.deploy import prune_host
    from sglang_patcher.errors import SglpatchError

    monkeypatch.setenv("SGLPATCH_AGENT_CRASH", "pushed:0")
    with pytest.raises(Exception):
        apply(env)
    monkeypatch.delenv("SGLPATCH_AGENT_CRASH")
    lock = env.sp / ".sglpatch/lock"
    holder = json.loads(lock.read_text())
    holder["pid"] = 2 ** 22 + 12345  # the crashed run's process is gone
    lock.write_text(json.dumps(holder))
    with pytest.raises(SglpatchError) as ei:
        prune_host(env.t, env.host, env.info, keep=0)
    assert "pending" in ei.value.message, ei.value.message
    assert (env.sp / ".sglpatch/journal.json").exists()


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="needs /proc")
def test_a_lock_holder_that_exited_unreaped_is_stale_and_a_running_one_is_not():
    """A killed sglpatch whose parent has not reaped it yet (a zombie) holds nothing: its lock is
    taken over like a dead process's; a running process's lock is not."""
    import socket
    import subprocess
    import time

    from sglang_patcher.deploy import holder_is_stale

    here = socket.gethostname()
    alive = subprocess.Popen(["sleep", "30"])
    done = subprocess.Popen(["true"])
    try:
        for _ in range(200):  # until `true` has exited (a zombie: not waited for yet)
            with open(f"/proc/{done.pid}/stat", "rb") as f:
                if f.read().rsplit(b")", 1)[1][1:2] == b"Z":
                    break
            time.sleep(0.01)
        assert holder_is_stale({"host": here, "pid": done.pid})
        assert not holder_is_stale({"host": here, "pid": alive.pid})
        assert not holder_is_stale({"host": "elsewhere.example", "pid": done.pid})
    finally:
        alive.kill()
        alive.wait()
        done.wait()


def test_put_backups_takes_only_the_recorded_originals(env):
    """The agent's put_backups writes a lost backup only when its bytes are the original the
    deployment's record names (its ``before`` sha256) and the deployment is still active; bytes
    of another file, a path the deployment did not replace and a rolled-back deployment are refused
    with nothing written. Accepted bytes land where rollback reads them, and the rollback works."""
    from sglang_patcher.deploy.agent import agent_for as _agent_for
    from sglang_patcher.errors import SglpatchError

    res = apply(env)
    did = res.deployment_id
    backup = env.sp / ".sglpatch" / "backups" / did / SPEC
    backup.unlink()
    agent = _agent_for(env.t, env.host, env.info)
    holder = make_holder(did)
    for contents in ({SPEC: RELEASE[SPEC] + b"# not the original\n"}, {NEWMOD: b"REVISION = 1\n"}):
        with pytest.raises(SglpatchError, match="not an original"):
            agent.put_backups(did, contents, holder)
        assert not backup.exists()
    st = host_status(env.t, env.host, env.info, env.ps)
    assert st.lock is None and st.bad_backups == {did: {SPEC: str(backup)}}
    agent.put_backups(did, {SPEC: RELEASE[SPEC]}, holder)
    assert backup.read_bytes() == RELEASE[SPEC]
    rb = rollback_host(env.t, env.host, env.info, home=env.home)
    assert rb.rolled_back == [did] and rb.backups_put_back == {}
    assert_release(env)
    with pytest.raises(SglpatchError, match="only an active deployment"):
        agent.put_backups(did, {SPEC: RELEASE[SPEC]}, holder)


def test_rollback_puts_back_lost_backups_from_the_local_copies(env):
    """A backup gone from the host but kept locally (as every deployment's originals are): the
    rollback puts it back (checked by sha256 on both sides) and restores the release."""
    res = apply(env)
    (env.sp / ".sglpatch" / "backups" / res.deployment_id / SPEC).unlink()
    rb = rollback_host(env.t, env.host, env.info, home=env.home)
    assert rb.rolled_back == [res.deployment_id]
    assert rb.backups_put_back == {res.deployment_id: {SPEC: "local copies"}}
    assert_release(env)


def test_a_local_record_left_behind_by_an_interrupted_run_is_brought_up_to_the_host(env):
    """A rollback interrupted after the host rolled back and before the local copy was rewritten
    (Ctrl-C there) leaves the copy saying "verified". The next rollback or apply reads the host's
    records and rewrites the copy: the host's records are the truth."""
    res = apply(env)
    rollback_host(env.t, env.host, env.info, home=env.home)
    local = Path(res.local_record)
    stale = dict(json.loads(local.read_text()), phase="verified")
    local.write_text(json.dumps(stale))
    again = rollback_host(env.t, env.host, env.info, home=env.home)
    assert again.rolled_back == [] and again.already == [res.deployment_id]
    assert json.loads(local.read_text())["phase"] == "rolled_back"
    local.write_text(json.dumps(stale))
    assert apply(env).status == "applied"
    assert json.loads(local.read_text())["phase"] == "rolled_back"


def test_rollback_without_a_host_passes_over_local_records_that_are_not_records(tmp_path):
    """``rollback`` without --host takes the host of the newest local record; a file there that
    is JSON but not an object (hand-edited, foreign) is passed over, not a traceback."""
    from sglang_patcher.errors import StateError
    from sglang_patcher.service_rollback import latest_deployment_host

    d = tmp_path / "deployments"
    (d / "gpu-1").mkdir(parents=True)
    (d / "gpu-1" / "20261201T000000Z-ddtree-r2-aaaaaa.json").write_text(
        json.dumps({"id": "20261201T000000Z-ddtree-r2-aaaaaa", "host": "gpu-1"}))
    (d / "gpu-2").mkdir()
    (d / "gpu-2" / "20261201T090000Z-ddtree-r2-bbbbbb.json").write_text("[]")
    assert latest_deployment_host(tmp_path) == "gpu-1"
    (d / "gpu-1" / "20261201T000000Z-ddtree-r2-aaaaaa.json").write_text('"a string"')
    with pytest.raises(StateError, match="no local deployment records"):
        latest_deployment_host(tmp_path)


def test_the_plan_names_the_patchset_as_given_and_shows_the_appliers_notes(env):
    """Issue 18: the plan's `sglpatch diff ...` hint named the current revision's name even for a
    patchset given as a directory (or NAME@REV); `apply` did not show the CRLF note `diff` shows."""
    series = env.ps.root / "series/0001-spec.patch"
    series.write_bytes(series.read_bytes().replace(b"\n", b"\r\n"))   # converted in transit
    ps = load_patchset(env.ps.root)
    res = apply(env, ps=ps)
    assert res.status == "applied"
    text = _text(res)
    assert f"sglpatch diff {env.ps.root} --host unit-host" in " ".join(text.split())
    assert "note:" in text and "CRLF" in text


def test_the_plan_names_an_earlier_revision_of_a_named_patchset_as_name_at_revision():
    from sglang_patcher.deploy.plan import patchset_arg
    assert patchset_arg(load_patchset("ddtree")) == "ddtree"
    assert patchset_arg(load_patchset("ddtree@1")) == "ddtree@1"


def test_a_dry_run_prints_the_diff_first_and_the_plan_last(env):
    """Issue 18: `apply --dry-run` printed the whole diff after the plan, burying it; the diff now
    comes first (every line still printed) and the plan closes the output."""
    text = _text(apply(env, dry_run=True))
    assert text.index("+    DDX = 2") < text.index("unit-host: dry run (nothing written)") < text.rindex(SPEC)
    assert "(the diff above:" in text


def test_a_dry_run_says_what_would_be_written_and_an_apply_what_was(env):
    """A fresh user read "1 file(s) written" under `apply --dry-run`, which writes nothing: the
    plan of a dry run (and the prompt's) says the files would be written; an apply that went
    through says they were."""
    dry = _text(apply(env, dry_run=True))
    assert "file(s) would be written" in dry and "file(s) written" not in dry, dry
    assert live(env, SPEC) == sha(RELEASE[SPEC])
    res = apply(env)
    assert "would be written" in _text(res.plan)  # the plan alone, as the prompt shows it
    done = _text(res)
    assert "file(s) written" in done and "would be written" not in done, done


def test_prune_names_the_edited_copies_a_forced_rollback_kept_before_deleting_them(env):
    """`rollback --force` keeps a file's edited bytes under backups/<id>.drifted/; prune deleted
    them with the backups and said nothing. The dry run and the prune name them (count and paths)
    and the prune still deletes them; a deployment without such copies says nothing of them."""
    from sglang_patcher.deploy import prune_host

    forced = apply(env).deployment_id
    (env.sp / SPEC).write_bytes((env.sp / SPEC).read_bytes() + b"# edited on the host\n")
    rollback_host(env.t, env.host, env.info, home=env.home, force=True)
    drifted = env.sp / ".sglpatch" / "backups" / f"{forced}.drifted"
    assert (drifted / SPEC).is_file()
    plain = apply(env).deployment_id
    rollback_host(env.t, env.host, env.info, home=env.home)
    dry = prune_host(env.t, env.host, env.info, keep=0, dry_run=True, home=env.home)
    assert dry.drifted == {forced: [SPEC]} and dry.to_json()["drifted_copies"] == 1
    text = " ".join(_text(dry).split())
    assert "with 1 edited copy of files that `rollback --force` kept" in text, text
    assert f"would delete 1 edited copy kept by `rollback --force` ({forced}.drifted/): {SPEC}" in text, text
    assert (drifted / SPEC).is_file()
    res = prune_host(env.t, env.host, env.info, keep=0, home=env.home)
    assert [p["id"] for p in res.pruned] == [forced, plain] and res.drifted == {forced: [SPEC]}
    text = " ".join(_text(res).split())
    assert f"deleted 1 edited copy kept by `rollback --force` ({forced}.drifted/): {SPEC}" in text, text
    assert text.count("edited cop") == 2  # the head and the forced one's line; none for the plain one
    assert not drifted.exists()
    assert_release(env)


def test_the_plan_caption_accounts_for_every_row():
    """A fresh user counted 26 rows under "25 file(s) written": the row left was a module only an
    earlier revision touched, already at rest (action none). The caption's counts add up to the
    rows: written, deleted, left as they are."""
    from sglang_patcher.deploy.results import DeployPlan, FilePlan
    diff = ("--- a/pkg/a.py\n+++ b/pkg/a.py\n@@ -1 +1,2 @@\n x\n+y\n"
            "--- a/pkg/gone.py\n+++ /dev/null\n@@ -1 +0,0 @@\n-z\n")
    files = {"pkg/a.py": FilePlan("pkg/a.py", "pristine", "1" * 64, "1" * 64, "2" * 64, action="write"),
             "pkg/gone.py": FilePlan("pkg/gone.py", "pristine", "3" * 64, "3" * 64, None, action="delete"),
             "pkg/old.py": FilePlan("pkg/old.py", "pristine", "4" * 64, "4" * 64, "4" * 64)}
    plan = DeployPlan(host="h", patchset="ddtree", revision=8, sglang_version="0.5.23", files=files, diff=diff)
    text = " ".join(_text(plan.render(written=True)).split())
    assert "1 file(s) written, 1 deleted, 1 left as they are (action none)" in text, text
    assert "+1 −1 lines" in text, text
    files.pop("pkg/old.py")
    files.pop("pkg/gone.py")
    text = " ".join(_text(plan.render()).split())
    assert "1 file(s) would be written; it differs from pristine by +1 −0 lines" in text and "left as" not in text, text


def test_rollback_json_rounds_its_seconds_as_apply_does():
    from sglang_patcher.deploy.results import RollbackResult
    r = RollbackResult("h", ["d1"], {"a.py": None}, round_trips=1, seconds=1.23456789)
    assert r.to_json()["seconds"] == 1.235 and r.to_json()["rolled_back"] == ["d1"]
    assert "(1 round trip, 1.23 s)" in " ".join(_text(r).split())
