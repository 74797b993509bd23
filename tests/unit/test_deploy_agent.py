"""The host-side deploy agent, run for real through the launcher over the local transport.

Every test works on a temp site-packages tree and checks files by sha256 afterwards. Interruptions
are real: the agent process dies (``os._exit``) at a chosen point via ``SGLPATCH_AGENT_CRASH``, or
the upload is a truncated tar.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from sglang_patcher.deploy import (AgentClient, AgentDriftError, AgentError, AgentLockHeldError,
                                   AgentStateError, make_holder, payload_tar)
from sglang_patcher.remote import launcher
from sglang_patcher.transport.local import LocalTransport
from tests.support.inode_flags import chattr  # noqa: F401  (the fixture)

ORIG = {
    "sglang/srt/a.py": b"A = 1\n",
    "sglang/srt/b.py": b"B = 2\n",
    "sglang/srt/c.py": b"C = 3\n",
}
NEW = {
    "sglang/srt/a.py": b"A = 10\n",
    "sglang/srt/b.py": b"B = 20\n",
    "sglang/srt/new_dir/d.py": b"D = 4\n",
}


def sha(b: bytes | None) -> str | None:
    return None if b is None else hashlib.sha256(b).hexdigest()


def live(root: Path, rel: str) -> str | None:
    p = root / rel
    return sha(p.read_bytes()) if p.exists() else None


@pytest.fixture
def tree(tmp_path):
    root = tmp_path / "site-packages"
    for rel, data in ORIG.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    cache = root / "sglang/srt/__pycache__"
    cache.mkdir()
    for n in ("a.cpython-311.pyc", "a.cpython-312.opt-1.pyc", "c.cpython-311.pyc", "ab.cpython-311.pyc"):
        (cache / n).write_bytes(b"stale")
    return root


@pytest.fixture
def agent(tree):
    return AgentClient(LocalTransport("testhost"), sys.executable, str(tree))


def spec_for(new=NEW, delete=(), allowed=None):
    files = {}
    for rel, data in new.items():
        files[rel] = {"action": "write", "sha256": sha(data), "mode": None,
                      "allowed": allowed.get(rel) if allowed else [sha(ORIG.get(rel)), sha(data)]}
    for rel in delete:
        files[rel] = {"action": "delete", "sha256": None, "mode": None, "allowed": [sha(ORIG[rel]), None]}
    return files


def dep(did="20260101T000000Z-test-r1-aaaaaa"):
    return {"id": did, "patchset": "test", "revision": 1, "sglang_version": "0.0.0"}


def do_push(agent, did="20260101T000000Z-test-r1-aaaaaa", holder=None, new=NEW, **kw):
    holder = holder or make_holder(did)
    out = agent.push(dep(did), spec_for(new, kw.pop("delete", ())), dict(new), holder, **kw)
    return out, holder


def temps(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if ".sglpatch-" in p.name]


def test_push_finish_rollback_round_trip(agent, tree):
    out, holder = do_push(agent, delete=["sglang/srt/c.py"])
    rec = out["deployment"]
    assert rec["phase"] == "pushed"
    for rel, data in NEW.items():
        assert live(tree, rel) == sha(data)
    assert not (tree / "sglang/srt/c.py").exists()
    assert rec["files"]["sglang/srt/a.py"]["before"] == sha(ORIG["sglang/srt/a.py"])
    assert rec["files"]["sglang/srt/new_dir/d.py"]["before"] is None
    assert temps(tree) == []
    # backups carry the originals; the lock is still held until finish
    assert (tree / ".sglpatch/backups" / rec["id"] / "sglang/srt/a.py").read_bytes() == ORIG["sglang/srt/a.py"]
    ins = agent.inspect(list(NEW))
    assert ins["lock"]["token"] == holder["token"]
    assert ins["journal"]["phase"] == "pushed"

    fin = agent.finish(rec["id"], holder, checks={"L0": "passed"})
    assert fin["deployment"]["phase"] == "verified"
    ins = agent.inspect(list(NEW))
    assert ins["lock"] is None and ins["journal"] is None
    assert [d["phase"] for d in ins["deployments"]] == ["verified"]

    rb = agent.rollback(rec["id"], make_holder(rec["id"]))
    assert rb["deployment"]["phase"] == "rolled_back"
    for rel, data in ORIG.items():
        assert live(tree, rel) == sha(data)
    assert not (tree / "sglang/srt/new_dir").exists()
    ins = agent.inspect(list(NEW))
    assert ins["lock"] is None and ins["journal"] is None
    assert agent.history()["deployments"][0]["phase"] == "rolled_back"


def test_owner_and_mode_kept(agent, tree):
    a = tree / "sglang/srt/a.py"
    os.chmod(a, 0o640)
    if os.geteuid() == 0:
        os.chown(a, 1234, 2345)
    out, holder = do_push(agent)
    st = a.stat()
    assert stat.S_IMODE(st.st_mode) == 0o640
    if os.geteuid() == 0:
        assert (st.st_uid, st.st_gid) == (1234, 2345)
    agent.rollback(out["deployment"]["id"], holder)
    st = a.stat()
    assert stat.S_IMODE(st.st_mode) == 0o640 and a.read_bytes() == ORIG["sglang/srt/a.py"]
    if os.geteuid() == 0:
        assert (st.st_uid, st.st_gid) == (1234, 2345)


def test_mode_change_from_the_patchset(agent, tree):
    files = spec_for({"sglang/srt/a.py": NEW["sglang/srt/a.py"]})
    files["sglang/srt/a.py"]["mode"] = 0o755
    holder = make_holder("x")
    agent.push(dep(), files, {"sglang/srt/a.py": NEW["sglang/srt/a.py"]}, holder)
    assert stat.S_IMODE((tree / "sglang/srt/a.py").stat().st_mode) == 0o755
    agent.rollback(dep()["id"], holder)
    assert stat.S_IMODE((tree / "sglang/srt/a.py").stat().st_mode) == 0o644


def test_hardlinked_target_is_not_written_through(agent, tree, tmp_path):
    other = tmp_path / "elsewhere.py"
    os.link(tree / "sglang/srt/a.py", other)
    ino = other.stat().st_ino
    do_push(agent)
    assert other.read_bytes() == ORIG["sglang/srt/a.py"]
    assert (tree / "sglang/srt/a.py").read_bytes() == NEW["sglang/srt/a.py"]
    assert (tree / "sglang/srt/a.py").stat().st_ino != ino
    assert other.stat().st_nlink == 1


def test_pycache_of_touched_modules_purged(agent, tree):
    do_push(agent, new={"sglang/srt/a.py": NEW["sglang/srt/a.py"]})
    left = sorted(p.name for p in (tree / "sglang/srt/__pycache__").iterdir())
    assert left == ["ab.cpython-311.pyc", "c.cpython-311.pyc"]


def test_lock_held_names_holder_and_break_lock(agent, tree):
    out, holder = do_push(agent)  # lock held until finish
    with pytest.raises(AgentLockHeldError) as ei:
        do_push(agent, did="20260101T000001Z-test-r1-bbbbbb")
    msg = str(ei.value)
    assert holder["user"] in msg and str(holder["pid"]) in msg and out["deployment"]["id"] in msg
    assert "--break-lock" in msg
    assert ei.value.details["holder"]["token"] == holder["token"]
    # another client cannot finish with a foreign token, but can break the lock explicitly
    other = make_holder("other")
    with pytest.raises(AgentLockHeldError):
        agent.unlock(other)
    assert agent.unlock(other, break_lock=True)["released"] is True
    assert agent.inspect([])["lock"] is None


def test_second_push_refused_while_journal_pending(agent, tree):
    out, holder = do_push(agent)
    agent.unlock(holder)  # lock gone, but the deployment was never verified
    with pytest.raises(AgentError) as ei:
        do_push(agent, did="20260101T000001Z-test-r1-bbbbbb", new={"sglang/srt/c.py": b"C=9\n"})
    assert ei.value.kind == "journal_pending"
    assert ei.value.details["journal"]["id"] == out["deployment"]["id"]
    assert agent.inspect([])["lock"] is None  # the refused push released the lock it took


def test_drift_refused_then_forced(agent, tree):
    (tree / "sglang/srt/b.py").write_bytes(b"B = 'hand edit'\n")
    with pytest.raises(AgentDriftError) as ei:
        do_push(agent)
    assert list(ei.value.details["files"]) == ["sglang/srt/b.py"]
    assert live(tree, "sglang/srt/a.py") == sha(ORIG["sglang/srt/a.py"])  # nothing written
    assert agent.inspect([])["lock"] is None
    out, holder = do_push(agent, force=True)
    assert out["deployment"]["forced"] is True
    assert (tree / ".sglpatch/backups" / out["deployment"]["id"] / "sglang/srt/b.py").read_bytes() == \
        b"B = 'hand edit'\n"


def test_push_is_a_compare_and_swap_on_the_hashes_the_plan_saw(agent, tree):
    """Each file's ``expect`` (the live hash the client's plan saw) is checked under the lock before
    any write, and --force does not override it: a host that moved on since the plan (another apply
    in between) refuses the push whole."""
    files = spec_for()
    for rel in files:
        files[rel]["expect"] = sha(ORIG.get(rel))
    (tree / "sglang/srt/b.py").write_bytes(NEW["sglang/srt/b.py"])  # another run wrote it meanwhile
    for force in (False, True):
        with pytest.raises(AgentError) as ei:
            agent.push(dep(), files, dict(NEW), make_holder("x"), force=force)
        assert ei.value.kind == "changed" and ei.value.exit_code == 8
        assert ei.value.details["files"] == {"sglang/srt/b.py": {"planned": sha(ORIG["sglang/srt/b.py"]),
                                                                 "live": sha(NEW["sglang/srt/b.py"])}}
        assert "nothing was written" in str(ei.value) and "another apply" in ei.value.hint
        assert live(tree, "sglang/srt/a.py") == sha(ORIG["sglang/srt/a.py"])
        assert not (tree / "sglang/srt/new_dir").exists() and not temps(tree)
        assert agent.inspect([])["lock"] is None and agent.inspect([])["journal"] is None
    files["sglang/srt/b.py"]["expect"] = sha(NEW["sglang/srt/b.py"])  # the plan saw what is there
    out = agent.push(dep(), files, dict(NEW), make_holder("x"))
    assert out["deployment"]["files"]["sglang/srt/b.py"]["before"] == sha(NEW["sglang/srt/b.py"])


def test_no_space_checked_before_the_first_write(agent, tree):
    with pytest.raises(AgentError) as ei:
        do_push(agent, reserve_bytes=1 << 62)
    assert ei.value.kind == "no_space"
    assert not (tree / ".sglpatch").exists()
    assert all(live(tree, r) == sha(d) for r, d in ORIG.items())


class _AsNobody(LocalTransport):
    """Runs the agent as uid/gid 65534 through setpriv (the test runs as root)."""

    def run(self, argv, **kw):
        return super().run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *argv], **kw)


def test_write_permission_checked_before_the_first_write():
    base = Path(tempfile.mkdtemp(prefix="sglpatch-perm-"))
    try:
        os.chmod(base, 0o755)
        root = base / "site-packages"
        for rel, data in ORIG.items():
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_bytes(data)
        if os.geteuid() == 0:
            if not shutil.which("setpriv") or not os.access("/usr/bin/python3", os.X_OK):
                pytest.skip("needs setpriv and /usr/bin/python3 to drop root")
            for d in [root, *root.rglob("*")]:
                os.chmod(d, 0o755 if d.is_dir() else 0o644)
            client = AgentClient(_AsNobody("permhost"), "/usr/bin/python3", str(root))
        else:
            for d in [root, *root.rglob("*")]:
                if d.is_dir():
                    os.chmod(d, 0o555)
            client = AgentClient(LocalTransport("permhost"), sys.executable, str(root))
        with pytest.raises(AgentError) as ei:
            do_push(client)
        assert ei.value.kind == "not_writable"
        assert "sglang/srt/a.py" in str(ei.value) and "sudo" in str(ei.value)
        assert not (root / ".sglpatch").exists()
        assert all(live(root, r) == sha(d) for r, d in ORIG.items())
    finally:
        for d in base.rglob("*"):
            if d.is_dir():
                os.chmod(d, 0o755)
        shutil.rmtree(base)


@pytest.mark.parametrize("flag,where,kind", [("+i", "sglang/srt/b.py", "immutable"),
                                              ("+a", "sglang/srt/b.py", "append_only"),
                                              ("+i", "sglang/srt", "immutable")])
def test_files_that_cannot_be_replaced_are_reported_by_inspect_and_refused_before_any_write(agent, tree, chattr,
                                                                                           flag, where, kind):
    """An immutable or append-only file (or directory): not even root may rename over it. inspect
    says which files and why (the client's plan refuses on it, a dry run too); push refuses before
    its first write — no state dir, no backup, no temp file — and its hint says what to do."""
    chattr(flag, tree / where)
    ins = agent.inspect(sorted(NEW))
    hit = {"sglang/srt/b.py"} if where.endswith(".py") else {"sglang/srt/a.py", "sglang/srt/b.py",
                                                             "sglang/srt/new_dir/d.py"}
    assert set(ins["blocked"]) == hit, ins["blocked"]
    assert all(p["kind"] == kind and "chattr " + flag in p["line"] for ps in ins["blocked"].values() for p in ps)
    assert ins["state_blocked"] is None
    with pytest.raises(AgentError) as ei:
        do_push(agent)
    err = ei.value
    assert err.kind == "not_writable" and "chattr " + flag in str(err) and "sglang/srt/b.py" in str(err), err
    assert f"chattr -{flag[1]}" in err.hint, err.hint
    assert len(err.details["problems"]) == len(hit)
    assert not (tree / ".sglpatch").exists() and temps(tree) == []
    assert all(live(tree, r) == sha(d) for r, d in ORIG.items())


def test_a_push_that_fails_mid_way_is_undone_and_leaves_nothing_behind(agent, tree, monkeypatch):
    """The second rename fails (as over an immutable file) after the first went through: every file
    is restored and no backup, journal, lock, temp file or directory of that push is left — no
    backup folder that no record names. On a host with history only that push's backups go."""
    monkeypatch.setenv("SGLPATCH_AGENT_FAIL", "commit:2")
    with pytest.raises(AgentError) as ei:
        do_push(agent)
    assert ei.value.kind == "push_failed" and "every file was restored" in str(ei.value), ei.value
    assert "Operation not permitted" in str(ei.value)
    assert all(live(tree, r) == sha(d) for r, d in ORIG.items())
    assert not (tree / "sglang/srt/new_dir").exists() and temps(tree) == []
    assert not (tree / ".sglpatch").exists(), sorted(map(str, (tree / ".sglpatch").rglob("*")))

    monkeypatch.delenv("SGLPATCH_AGENT_FAIL")    # a host with history: one deployment, rolled back
    first, holder = do_push(agent, did="20260101T000000Z-test-r1-bbbbbb")
    agent.finish(first["deployment"]["id"], holder)
    agent.rollback(first["deployment"]["id"], make_holder("rb"))
    state = tree / ".sglpatch"
    before = sorted(p.relative_to(state) for p in state.rglob("*") if p.name != "lock")
    monkeypatch.setenv("SGLPATCH_AGENT_FAIL", "commit:2")
    with pytest.raises(AgentError):
        do_push(agent, did="20260101T000000Z-test-r1-cccccc")
    assert sorted(p.relative_to(state) for p in state.rglob("*")) == before
    assert [p.name for p in (state / "backups").iterdir()] == ["20260101T000000Z-test-r1-bbbbbb"]
    ins = agent.inspect([])
    assert ins["journal"] is None and ins["lock"] is None


def test_prune_deletes_a_backup_no_record_names_when_the_host_holds_its_bytes_elsewhere(agent, tree):
    """Backups an earlier sglpatch left behind after a failed push (no record, no journal names
    them): prune deletes them whatever --keep says — a dry run only names them — when every file
    in them is the live file or a recorded deployment's backup; one holding bytes found nowhere else
    on the host (the originals of a deployment whose record was lost) is kept and named."""
    backups = tree / ".sglpatch" / "backups"
    left = backups / "20250101T000000Z-ddtree-r5-0a0a0a"      # the failed push restored a.py and b.py
    for rel in ("sglang/srt/a.py", "sglang/srt/b.py"):
        (left / rel).parent.mkdir(parents=True, exist_ok=True)
        (left / rel).write_bytes(ORIG[rel])
    lost = backups / "20250101T000000Z-ddtree-r5-1b1b1b"      # a record lost: a.py's original only here
    (lost / "sglang/srt").mkdir(parents=True)
    (lost / "sglang/srt/a.py").write_bytes(b"A = 0  # the original of a lost deployment\n")
    (backups / "not-a-deployment!").mkdir()                  # not ours: never touched

    dry = agent.prune(3, make_holder(None), dry_run=True)
    assert [o["id"] for o in dry["orphans"]] == [left.name] and left.is_dir()
    assert dry["orphans"][0]["files"] == ["sglang/srt/a.py", "sglang/srt/b.py"]
    assert [(o["id"], o["alone"]) for o in dry["orphans_kept"]] == [(lost.name, ["sglang/srt/a.py"])]
    out = agent.prune(3, make_holder(None))
    assert [o["id"] for o in out["orphans"]] == [left.name] and out["pruned"] == []
    assert not left.exists() and (lost / "sglang/srt/a.py").exists() and (backups / "not-a-deployment!").is_dir()
    assert agent.inspect([])["lock"] is None
    # once a recorded deployment's backup holds those bytes too, the tree goes
    (tree / "sglang/srt/a.py").write_bytes(b"A = 0  # the original of a lost deployment\n")
    rec, holder = do_push(agent, new={"sglang/srt/a.py": b"A = 10\n"}, force=True)
    agent.finish(rec["deployment"]["id"], holder)
    again = agent.prune(3, make_holder(None))
    assert [o["id"] for o in again["orphans"]] == [lost.name] and again["orphans_kept"] == [] and not lost.exists()
    assert (backups / rec["deployment"]["id"] / "sglang/srt/a.py").exists()


def test_truncated_upload_writes_nothing(agent, tree):
    holder = make_holder("t")
    tar = payload_tar(dict(NEW))
    cut = tar.index(b"B = 20") + 3  # inside the second member's data
    args = agent._args({"deployment": dep(), "files": spec_for(), "holder": holder})
    res = launcher.run_script(agent.transport, sys.executable, "deploy_agent", "push", args,
                              stdin=tar[:cut])
    assert res.exit_code == 3
    out = json.loads(res.stdout)
    assert out["kind"] == "bad_payload"
    assert all(live(tree, r) == sha(d) for r, d in ORIG.items())
    assert temps(tree) == [] and not (tree / ".sglpatch").exists()


@pytest.mark.parametrize("point", ["stage:1", "partial:2"])
def test_killed_while_staging_leaves_targets_whole_and_rolls_back(agent, tree, monkeypatch, point):
    monkeypatch.setenv("SGLPATCH_AGENT_CRASH", point)
    with pytest.raises(Exception) as ei:
        do_push(agent)
    assert "137" in str(ei.value)
    monkeypatch.delenv("SGLPATCH_AGENT_CRASH")
    # no truncated file under any real name
    assert all(live(tree, r) == sha(d) for r, d in ORIG.items())
    assert not (tree / "sglang/srt/new_dir/d.py").exists()
    assert temps(tree)  # the staged (or half-written) temp file is there, under its temp name
    ins = agent.inspect(list(NEW))
    assert ins["journal"]["phase"] == "staging" and ins["lock"] is not None
    assert ins["temps"]
    # the next run cannot finish it (files missing) and rolls back, taking over the dead lock
    holder = make_holder(ins["journal"]["id"])
    with pytest.raises(AgentError) as ei:
        agent.resume(ins["journal"]["id"], holder, break_lock=True)
    assert ei.value.kind == "not_resumable"
    agent.rollback(ins["journal"]["id"], holder, break_lock=True)
    assert all(live(tree, r) == sha(d) for r, d in ORIG.items())
    assert temps(tree) == [] and not (tree / "sglang/srt/new_dir").exists()
    ins = agent.inspect([])
    assert ins["lock"] is None and ins["journal"] is None


def test_killed_while_committing_is_resumed(agent, tree, monkeypatch):
    monkeypatch.setenv("SGLPATCH_AGENT_CRASH", "commit:1")
    with pytest.raises(Exception):
        do_push(agent)
    monkeypatch.delenv("SGLPATCH_AGENT_CRASH")
    ins = agent.inspect(list(NEW))
    j = ins["journal"]
    assert j["phase"] == "committing"
    # every target is either its old or its new version, never anything else
    for rel in NEW:
        assert live(tree, rel) in (sha(ORIG.get(rel)), sha(NEW[rel]))
    holder = make_holder(j["id"])
    out = agent.resume(j["id"], holder, break_lock=True)
    assert out["resumed"] == "committed" and out["deployment"]["phase"] == "pushed"
    assert all(live(tree, r) == sha(d) for r, d in NEW.items()) and temps(tree) == []
    agent.finish(j["id"], holder)
    assert agent.inspect([])["lock"] is None


def test_pushed_not_verified_is_seen_by_the_next_run(agent, tree, monkeypatch):
    monkeypatch.setenv("SGLPATCH_AGENT_CRASH", "pushed:0")
    with pytest.raises(Exception):
        do_push(agent)
    monkeypatch.delenv("SGLPATCH_AGENT_CRASH")
    ins = agent.inspect(list(NEW))
    assert ins["journal"]["phase"] == "pushed"
    holder = make_holder(ins["journal"]["id"])
    out = agent.resume(ins["journal"]["id"], holder, break_lock=True)
    assert out["resumed"] == "already pushed"
    agent.rollback(ins["journal"]["id"], holder)
    assert all(live(tree, r) == sha(d) for r, d in ORIG.items())


def test_rollback_refuses_a_deployment_that_is_not_the_latest(agent, tree):
    out1, h1 = do_push(agent, new={"sglang/srt/a.py": NEW["sglang/srt/a.py"]})
    agent.finish(out1["deployment"]["id"], h1)
    newer = {"sglang/srt/a.py": b"A = 100\n"}
    files = spec_for(newer, allowed={"sglang/srt/a.py": [sha(NEW["sglang/srt/a.py"])]})
    h2 = make_holder("2")
    agent.push(dep("20260101T000009Z-test-r2-cccccc"), files, newer, h2)
    agent.finish("20260101T000009Z-test-r2-cccccc", h2)
    with pytest.raises(AgentError) as ei:
        agent.rollback(out1["deployment"]["id"], make_holder("x"))
    assert ei.value.kind == "not_latest"
    agent.rollback("20260101T000009Z-test-r2-cccccc", make_holder("x"))
    assert live(tree, "sglang/srt/a.py") == sha(NEW["sglang/srt/a.py"])
    agent.rollback(out1["deployment"]["id"], make_holder("x"))
    assert live(tree, "sglang/srt/a.py") == sha(ORIG["sglang/srt/a.py"])


def test_rollback_of_unknown_deployment(agent):
    with pytest.raises(AgentStateError) as ei:
        agent.rollback("nope", make_holder("x"))
    assert ei.value.kind == "not_found"


def test_symlink_target_refused(agent, tree):
    (tree / "sglang/srt/a.py").unlink()
    (tree / "sglang/srt/a.py").symlink_to(tree / "sglang/srt/c.py")
    with pytest.raises(AgentError) as ei:
        do_push(agent)
    assert ei.value.kind == "not_regular"


@pytest.mark.parametrize("bad", ["../evil.py", "/etc/passwd", "sglang/../../x", ".sglpatch/lock"])
def test_unsafe_paths_refused(agent, bad):
    with pytest.raises(AgentError) as ei:
        agent.inspect([bad])
    assert ei.value.kind == "bad_path"


def test_compile_op(agent, tree):
    (tree / "sglang/srt/bad.py").write_bytes(b"def f(:\n")
    out = agent.compile(["sglang/srt/a.py", "sglang/srt/bad.py"])
    assert out["results"]["sglang/srt/a.py"]["status"] == "passed"
    assert out["results"]["sglang/srt/bad.py"]["status"] == "failed"
    assert "bad.py" in out["results"]["sglang/srt/bad.py"]["detail"]
    assert not (tree / "sglang/srt/__pycache__/bad.cpython-311.pyc").exists()


def test_backup_tar_and_round_trips(agent, tree):
    t = agent.transport
    before = t.round_trips
    out, holder = do_push(agent)
    assert t.round_trips - before == 1
    backups = agent.backup_tar(out["deployment"]["id"])
    assert backups == {r: ORIG[r] for r in ("sglang/srt/a.py", "sglang/srt/b.py")}


@pytest.mark.parametrize("flag,where,kind", [("+i", "sglang/srt/b.py", "immutable"),
                                              ("+a", "sglang/srt/new_dir/d.py", "append_only"),
                                              ("+i", "sglang/srt", "immutable")])
def test_a_rollback_refuses_files_it_could_not_restore_or_delete_before_any_write(agent, tree, chattr,
                                                                                   flag, where, kind):
    """A file a rollback would restore (or delete: one the deployment added) made immutable or
    append-only after the apply, or its directory: the agent's rollback runs the push's preflight
    first and refuses whole (not_writable, exit 8: each file and why, the chattr hint) — no file
    restored, no lock, no journal, the record still verified — instead of failing on the n-th rename
    and leaving the host half rolled back; once the flag is cleared it rolls back in full."""
    out, holder = do_push(agent)
    did = out["deployment"]["id"]
    agent.finish(did, holder)
    state = tree / ".sglpatch"
    before = {p: p.read_bytes() for p in state.rglob("*") if p.is_file()}
    chattr(flag, tree / where)
    with pytest.raises(AgentError) as ei:
        agent.rollback(did, make_holder(did))
    err = ei.value
    assert err.kind == "not_writable" and err.exit_code == 8, err
    assert f"cannot roll back deployment {did}" in err.message and "nothing was written" in err.message, err.message
    says = {"sglang/srt/b.py": "sglang/srt/b.py is immutable (chattr +i)",
            "sglang/srt/new_dir/d.py": "sglang/srt/new_dir/d.py is append-only (chattr +a)",
            "sglang/srt": f"sglang/srt/a.py: directory {tree / 'sglang/srt'} is immutable (chattr +i)"}[where]
    assert says in err.message, err.message
    assert f"chattr -{flag[1]}" in err.hint, err.hint
    assert all(p.read_bytes() == data for p, data in before.items()), "the state dir is as it was"
    assert sorted(p for p in state.rglob("*") if p.is_file()) == sorted(before), "no lock, no journal"
    assert all(live(tree, rel) == sha(data) for rel, data in NEW.items()), "every file still deployed"
    assert temps(tree) == []
    assert agent.history()["deployments"][0]["phase"] == "verified"
    subprocess.run(["chattr", "-" + flag[1], str(tree / where)], check=True)
    agent.rollback(did, make_holder(did))
    assert all(live(tree, rel) == sha(data) for rel, data in ORIG.items())
    assert not (tree / "sglang/srt/new_dir/d.py").exists()


def test_a_rollback_the_os_stops_mid_way_says_why_in_words_and_keeps_its_journal(agent, tree, monkeypatch):
    """A rename of a rollback's restore refused by the OS after its preflight passed (a race): the
    error says which rename and what the OS refused — not a raw PermissionError repr — and the
    journal is left, so the next rollback finishes it (the journal recovery is as before)."""
    out, holder = do_push(agent)
    did = out["deployment"]["id"]
    agent.finish(did, holder)
    monkeypatch.setenv("SGLPATCH_AGENT_FAIL", "restore:2")
    with pytest.raises(AgentStateError) as ei:
        agent.rollback(did, make_holder(did))
    err = ei.value
    assert err.kind == "rollback_failed" and err.exit_code == 10, err
    assert "was refused by the OS (Operation not permitted" in err.message, err.message
    assert "PermissionError" not in err.message and "[Errno" not in err.message, err.message
    assert "the journal" in err.message and "rerun" in err.hint, err
    assert agent.history()["journal"]["phase"] == "rolling_back"
    monkeypatch.delenv("SGLPATCH_AGENT_FAIL")
    rb = agent.rollback(did, make_holder(did), break_lock=True)
    assert rb["deployment"]["phase"] == "rolled_back"
    assert all(live(tree, rel) == sha(data) for rel, data in ORIG.items())
    assert agent.history()["journal"] is None


def test_an_os_refusal_names_the_flag_that_caused_it(tmp_path, chattr):
    """explain_os_error on real refusals: a rename over an immutable file, a file created in an
    immutable directory — the OS's reason, then why by access's test, with the kind for the hint."""
    from sglang_patcher.remote.deploy_agent.preflight import explain_os_error

    target = tmp_path / "spec_utils.py"
    target.write_text("x = 1\n")
    tmp = tmp_path / ".spec_utils.py.sglpatch-x"
    tmp.write_text("x = 2\n")
    chattr("+i", target)
    with pytest.raises(PermissionError) as ei:
        os.replace(tmp, target)
    text, kinds = explain_os_error(ei.value)
    assert text == (f"renaming {tmp} over {target} was refused by the OS (Operation not permitted): "
                    f"{target} is immutable (chattr +i)"), text
    assert kinds == ["immutable"]
    locked = tmp_path / "locked"
    locked.mkdir()
    chattr("+i", locked)
    with pytest.raises(PermissionError) as ei:
        (locked / "new.py").write_text("")
    text, kinds = explain_os_error(ei.value)
    assert text.endswith(f"directory {locked} is immutable (chattr +i)") and kinds == ["immutable"], text
