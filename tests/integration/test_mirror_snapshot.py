"""Snapshot of the real sglang 0.5.23 install: over real SSH and locally, incremental, by hash."""

from __future__ import annotations

import os
import shutil

import pytest

from sglang_patcher.discovery import discover
from sglang_patcher.errors import StateError
from sglang_patcher.manifest import sha256_file
from sglang_patcher.mirror import Mirror, snapshot
from sglang_patcher.transport import connect

pytestmark = [pytest.mark.sglang]


def _live_files(target) -> dict[str, str]:
    """Every mirrored file of the live install, hashed here: the ground truth."""
    out = {}
    for top in ("sglang", "sglang-0.5.23.dist-info"):
        for root, dirs, files in os.walk(target.site_packages / top):
            dirs[:] = [d for d in dirs if d != "__pycache__"]
            for f in files:
                if not f.endswith(".pyc"):
                    full = os.path.join(root, f)
                    out[os.path.relpath(full, target.site_packages)] = sha256_file(full)
    return out


def _assert_mirror_equals_live(mirror: Mirror, target) -> None:
    live = _live_files(target)
    assert {p: e.sha256 for p, e in mirror.manifest.files.items()} == live
    mirrored = {str(p.relative_to(mirror.tree)) for p in mirror.tree.rglob("*") if p.is_file()}
    assert mirrored == set(live)
    for p in ("sglang/srt/server_args.py", "sglang-0.5.23.dist-info/RECORD"):
        assert mirror.read(p) == (target.site_packages / p).read_bytes()


@pytest.mark.ssh
@pytest.mark.slow
def test_snapshot_over_ssh_then_incremental(ssh_host, sglang_target, sglpatch_home, capsys):
    with connect(ssh_host) as t:
        info = discover(t, ssh_host)
        full = snapshot(t, ssh_host, info)
        mirror = full.mirror
        assert mirror.root == sglpatch_home / "mirrors" / "sshd-test" / "0.5.23"
        # ~5,800 files in one round trip: the host sends each file once, hashing what it sends
        assert full.round_trips == 1 and full.files > 5000
        assert len(full.fetched) == full.files and full.unchanged == 0
        assert full.bytes_fetched > 100_000_000
        _assert_mirror_equals_live(mirror, sglang_target)
        states = mirror.record_states()
        assert states["sglang-0.5.23.dist-info/RECORD"] == "unhashed"
        assert {s for p, s in states.items() if not p.endswith("RECORD")} == {"pristine"}
        # every mirrored file hashes to the installed distribution's RECORD
        assert all(info.record[p] == e.sha256 for p, e in mirror.manifest.files.items()
                   if info.record.get(p))

        again = snapshot(t, ssh_host, info)
        assert again.round_trips == 1 and again.fetched == [] and again.unchanged == full.files

        # change one file, add one, delete one: only the changed and new ones travel
        changed = sglang_target.package_dir / "srt" / "speculative" / "spec_info.py"
        changed.write_text(changed.read_text() + "\n# local edit\n")
        added = sglang_target.package_dir / "srt" / "speculative" / "ddtree_new.py"
        added.write_text("X = 1\n")
        gone = sglang_target.package_dir / "lang" / "api.py"
        gone.unlink()
        os.chmod(sglang_target.package_dir / "version.py", 0o600)
        inc = snapshot(t, ssh_host, info)
        assert inc.round_trips == 2
        assert inc.fetched == ["sglang/srt/speculative/ddtree_new.py",
                               "sglang/srt/speculative/spec_info.py"]
        assert inc.deleted == ["sglang/lang/api.py"]
        assert not mirror.path_of("sglang/lang/api.py").exists()
        assert mirror.read("sglang/lang/api.py") is None
        assert mirror.manifest.files["sglang/version.py"].mode == 0o600
        _assert_mirror_equals_live(mirror, sglang_target)
        st = mirror.record_states()
        assert st["sglang/srt/speculative/spec_info.py"] == "modified"
        assert st["sglang/srt/speculative/ddtree_new.py"] == "unrecorded"
        assert st["sglang/lang/api.py"] == "missing"
    with capsys.disabled():
        print(f"\n[snapshot over loopback SSH] full: {full.files} files, "
              f"{full.bytes_fetched / 1e6:.1f} MB, {full.round_trips} round trips, "
              f"{full.seconds:.2f} s | no-op: {again.round_trips} round trip, {again.seconds:.2f} s"
              f" | 2 changed+1 deleted: {inc.round_trips} round trips, {inc.seconds:.2f} s")


def test_the_progress_of_a_snapshot_counts_each_file_sent_once(ssh_host, sglang_target, sglpatch_home):
    """The bytes a snapshot reports (its meter's total and what it advanced) are the sizes of the
    files that travelled, each once: the first snapshot's the whole install's, an incremental one's
    the changed files' — over real SSH, the tar stream gzipped as for a remote host."""
    from sglang_patcher.progress import Meter

    tasks = []

    class Recording(Meter):          # a meter that shows nothing and keeps each finished task
        def _close(self, task, failed):
            tasks.append(task)

    with connect(ssh_host) as t:
        info = discover(t, ssh_host)
        full = snapshot(t, ssh_host, info, compress=True, meter=Recording())
        sizes = {str(f.relative_to(full.mirror.tree)): f.stat().st_size
                 for f in full.mirror.tree.rglob("*") if f.is_file()}
        (task,) = tasks
        assert task.total_bytes == task.nbytes == sum(sizes.values()) == full.bytes_fetched, \
            (task.total_bytes, task.nbytes, sum(sizes.values()))
        assert task.total_files == task.files == len(sizes)
        changed = sglang_target.package_dir / "srt" / "speculative" / "spec_info.py"
        changed.write_text(changed.read_text() + "\n# local edit\n")
        tasks.clear()
        inc = snapshot(t, ssh_host, info, compress=True, meter=Recording())
        (task,) = tasks
        assert inc.fetched == ["sglang/srt/speculative/spec_info.py"]
        assert task.total_bytes == task.nbytes == changed.stat().st_size == inc.bytes_fetched
        assert task.total_files == task.files == 1


def test_snapshot_local_and_reopen(local_host, local_target, tmp_path):
    t = connect(local_host)
    info = discover(t, local_host)
    res = snapshot(t, local_host, info, home=tmp_path)
    assert res.round_trips == 1   # a first snapshot: one pack
    m = Mirror.open(tmp_path, "local-test", "0.5.23")
    assert len(m.manifest.files) == res.files
    assert m.dist_info == "sglang-0.5.23.dist-info"
    assert m.read("sglang/version.py") == (local_target.package_dir / "version.py").read_bytes()
    assert "sglang/version.py" in m and "nope.py" not in m
    assert res.to_dict()["round_trips"] == 1
    # 300 new files and 100 changed ones: still one hash and one tar
    extra = local_target.package_dir / "many"
    extra.mkdir()
    for i in range(300):
        (extra / f"f{i}.py").write_text(f"V = {i}\n")
    assert snapshot(t, local_host, info, home=tmp_path).round_trips == 2
    for i in range(0, 300, 3):
        (extra / f"f{i}.py").write_text(f"V = {i} + 1\n")
    many = snapshot(t, local_host, info, home=tmp_path)
    assert many.round_trips == 2 and len(many.fetched) == 100
    shutil.rmtree(extra)
    res = snapshot(t, local_host, info, home=tmp_path)
    assert len(res.deleted) == 300 and res.files == len(m.manifest.files)
    # a damaged mirror file is noticed on read, and the next snapshot repairs it
    p = m.path_of("sglang/version.py")
    p.write_text("tampered")
    with pytest.raises(StateError, match="does not match its manifest"):
        Mirror.open(tmp_path, "local-test", "0.5.23").read("sglang/version.py")
    p.write_text("tampered-and-longer-than-before" * 100)
    fix = snapshot(t, local_host, info, home=tmp_path)
    assert fix.fetched == ["sglang/version.py"]
    assert fix.mirror.read("sglang/version.py") == (local_target.package_dir / "version.py").read_bytes()
    # a stray file in the tree (an interrupted earlier run) is removed
    stray = m.tree / "sglang" / ".stray.sglpatch-tmp"
    stray.write_text("x")
    snapshot(t, local_host, info, home=tmp_path)
    assert not stray.exists()
    # a damaged manifest is an error on open, and the next snapshot rebuilds it
    m.manifest_path.write_text("{not json")
    with pytest.raises(StateError, match="not a valid sglpatch manifest"):
        Mirror.open(tmp_path, "local-test", "0.5.23").manifest
    rebuilt = snapshot(t, local_host, info, home=tmp_path)
    assert len(rebuilt.fetched) == rebuilt.files == res.files


def test_mirror_open_without_snapshot_says_what_to_do(tmp_path):
    with pytest.raises(StateError) as ei:
        Mirror.open(tmp_path, "gpu1", "0.5.23")
    assert "sglpatch snapshot gpu1" in ei.value.hint


def test_mirror_rejects_unsafe_paths(tmp_path):
    m = Mirror(tmp_path, "h", "1")
    for bad in ("/etc/passwd", "../x", "a/../../b", "a//b", "./a", ""):
        with pytest.raises(ValueError):
            m.path_of(bad)


@pytest.mark.ssh
@pytest.mark.slow
def test_root_owned_install_through_sudo(sshd, sglang_target, ssh_user_sudo, tmp_path):
    """A root-owned install: the login user can read but not write it; with `sudo: true` the
    probe and the snapshot run as root through `sudo -n`."""
    for top in ("sglang", "sglang-0.5.23.dist-info"):
        root_dir = sglang_target.site_packages / top
        os.chown(root_dir, 0, 0)
        for p in root_dir.rglob("*"):
            os.lchown(p, 0, 0)
    plain = sshd.host_entry(sglang_target)
    with connect(plain) as t:
        info = discover(t, plain)
    assert not info.writable and info.unwritable_count > 5000 and info.user == sshd.user

    elevated = sshd.host_entry(sglang_target, sudo=True)
    with connect(elevated) as t:
        info = discover(t, elevated)
        assert info.user == "root" and info.writable
        assert t.is_loopback
        res = snapshot(t, elevated, info, home=tmp_path, compress=True)   # the gzip path, over SSH
    assert res.round_trips == 1 and res.files > 5000
    assert res.mirror.read("sglang/version.py") == (sglang_target.package_dir / "version.py").read_bytes()


def test_another_deployments_staged_files_are_not_mirrored(local_host, local_target, tmp_path):
    """A deployment stages new files beside their targets as .<name>.sglpatch-<id> and renames
    them; a snapshot taken meanwhile (a second apply racing the first) must not list them, or it
    fails reading one that is already gone (found by a new-user run: two applies at once)."""
    t = connect(local_host)
    info = discover(t, local_host)
    staged = local_target.package_dir / "srt" / ".server_args.py.sglpatch-20261130T000000-abcd"
    staged.write_text("half-way through another deployment\n")
    try:
        res = snapshot(t, local_host, info, home=tmp_path)
        m = Mirror.open(tmp_path, "local-test", "0.5.23")
        assert not any(".sglpatch-" in p for p in m.manifest.files)
        assert res.files == len(m.manifest.files)
    finally:
        staged.unlink()


def test_a_file_vanishing_during_the_snapshot_is_one_clear_error(local_host, local_target):
    """The real probe's tar op asked for a file that no longer exists (the install changed between
    listing and reading): one error naming host and file that says what happened and what to do
    (a StateError, as for a file whose bytes changed meanwhile) — not the remote command line."""
    from sglang_patcher.mirror import _check_tar
    from sglang_patcher.remote.launcher import run_script

    t = connect(local_host)
    info = discover(t, local_host)
    res = run_script(t, info.interpreter, "probe", "tar", {"site_packages": info.site_packages},
                     stdin=b'["sglang/srt/gone_meanwhile.py"]')
    with pytest.raises(StateError) as ei:
        _check_tar("local-test", res)
    msg = str(ei.value)
    assert "local-test" in msg and "sglang/srt/gone_meanwhile.py" in msg and "changed" in msg
    assert "base64" not in msg and "python" not in msg
    assert "status --host local-test" in (ei.value.hint or "")


def _hash_op(site, **extra):
    import sys

    from sglang_patcher.remote.launcher import call_json
    from sglang_patcher.transport.local import LocalTransport
    out = call_json(LocalTransport("h"), sys.executable, "probe", "hash",
                    {"site_packages": str(site), "package": "sglang", **extra})
    return {p: sha for p, sha, _size, _mode in out["files"]}, out["cache"]


def test_the_hosts_hash_cache_stats_unchanged_files_and_reads_every_changed_one(tmp_path, monkeypatch):
    """The probe's hash cache (issue 18: a re-snapshot read every file on the host): an unchanged
    file is stat'ed, not read; an edit that keeps size and mtime (ctime moves), a file replaced by
    rename (inode), and a file changed within the racy window are read again; a damaged or
    unwritable cache only costs the reads. The hashes always equal the files' own."""
    import hashlib
    import os

    site = tmp_path / "site"
    files = {"sglang/a.py": b"A = 1\n", "sglang/sub/b.py": b"B = 2\n", "sglang/c.py": b"C = 3\n"}
    for rel, data in files.items():
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_bytes(data)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))

    def truth():
        return {rel: hashlib.sha256((site / rel).read_bytes()).hexdigest() for rel in files}

    hashes, c = _hash_op(site, cache=True, racy_s=0)
    assert hashes == truth() and (c["hits"], c["hashed"]) == (0, 3)
    hashes, c = _hash_op(site, cache=True, racy_s=0)
    assert hashes == truth() and (c["hits"], c["hashed"]) == (3, 0)

    a = site / "sglang/a.py"                    # same size, mtime put back: only ctime tells
    st = a.stat()
    a.write_bytes(b"A = 9\n")
    os.utime(a, ns=(st.st_atime_ns, st.st_mtime_ns))
    b = site / "sglang/sub/b.py"                # same bytes, same mtime, a new inode
    st_b = b.stat()
    tmp = b.with_name(".b.tmp")
    tmp.write_bytes(files["sglang/sub/b.py"])
    os.utime(tmp, ns=(st_b.st_atime_ns, st_b.st_mtime_ns))
    os.replace(tmp, b)
    hashes, c = _hash_op(site, cache=True, racy_s=0)
    assert hashes == truth() and hashes["sglang/a.py"] == hashlib.sha256(b"A = 9\n").hexdigest()
    assert (c["hits"], c["hashed"]) == (1, 2)

    (site / "sglang/c.py").write_bytes(b"C = 4\n")     # just now: never recorded with the 2 s window
    for _ in range(2):
        hashes, c = _hash_op(site, cache=True)
        assert hashes == truth() and c["hashed"] >= 1

    cache_files = list((tmp_path / "cache" / "sglpatch").iterdir())
    assert len(cache_files) == 1
    if os.geteuid() == 0:                       # a cache another user owns is not believed
        _hash_op(site, cache=True, racy_s=0)
        os.chown(cache_files[0], 65534, 65534)
        hashes, c = _hash_op(site, cache=True, racy_s=0)
        assert hashes == truth() and c["hits"] == 0
    cache_files[0].write_text("{not json")
    hashes, c = _hash_op(site, cache=True, racy_s=0)
    assert hashes == truth() and c["hits"] == 0
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache_files[0]))   # a file: no cache dir can be made
    hashes, c = _hash_op(site, cache=True, racy_s=0)
    assert hashes == truth() and c["hits"] == 0
    hashes, c = _hash_op(site)                                  # asked for none: none
    assert hashes == truth() and c == {"hits": 0, "hashed": 3, "enabled": False}

    # the cache of an install that is gone (a removed venv) goes with the next save of another
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache2"))
    import shutil
    other = tmp_path / "other"
    shutil.copytree(site, other)
    _hash_op(site, cache=True, racy_s=0)
    _hash_op(other, cache=True, racy_s=0)
    assert len(list((tmp_path / "cache2" / "sglpatch").iterdir())) == 2
    shutil.rmtree(other)
    (site / "sglang/c.py").write_bytes(b"C = 5\n")            # something to save
    _hash_op(site, cache=True, racy_s=0)
    left = list((tmp_path / "cache2" / "sglpatch").iterdir())
    assert len(left) == 1 and str(site) in left[0].read_text()[:4096]


def test_an_interrupted_first_snapshot_keeps_what_it_fetched_and_the_next_fetches_the_rest(
        local_host, local_target, tmp_path):
    """Ctrl-C half-way through a first snapshot (issue 18: it printed only "Aborted."): the meter
    says the mirror is partial and that the next snapshot completes it; the files fetched so far stay
    (not a mirror yet: Mirror.open refuses it), also those of a resuming run interrupted again, and
    the next snapshot fetches only the rest."""
    from sglang_patcher.progress import PlainMeter

    class CtrlC(PlainMeter):
        def _make(self, *a):
            task = super()._make(*a)
            advance = task.advance

            def interrupting(**kw):
                advance(**kw)
                if task.files >= 2000:
                    raise KeyboardInterrupt
            task.advance = interrupting
            return task

    lines: list[str] = []
    t = connect(local_host)
    info = discover(t, local_host)
    with pytest.raises(KeyboardInterrupt):
        snapshot(t, local_host, info, home=tmp_path, meter=CtrlC(lines.append))
    assert "interrupted after 2000/" in lines[-1]
    assert "the mirror is partial: 2000 of" in lines[-1] and "the next snapshot of local-test fetches only the rest" \
        in lines[-1]
    with pytest.raises(StateError):
        Mirror.open(tmp_path, "local-test", "0.5.23")
    # interrupted again while resuming (new-user pass: the second run's files were not kept, the
    # third fetched them again): the partial manifest grows by what each run fetched
    lines.clear()
    with pytest.raises(KeyboardInterrupt):
        snapshot(t, local_host, info, home=tmp_path, meter=CtrlC(lines.append))
    assert "interrupted after 2000/" in lines[-1] and "the mirror is partial: 4000 of" in lines[-1], lines[-1]
    with pytest.raises(StateError):
        Mirror.open(tmp_path, "local-test", "0.5.23")
    rest = snapshot(t, local_host, info, home=tmp_path)
    assert rest.unchanged == 4000 and len(rest.fetched) == rest.files - 4000 and rest.round_trips == 2
    _assert_mirror_equals_live(rest.mirror, local_target)
    assert not (rest.mirror.root / "manifest.partial.json").exists()


def test_the_snapshot_command_shows_progress_on_stderr(capsys, tmp_path, local_target, monkeypatch):
    """Not a terminal: plain lines on stderr (files, bytes, rate), the result alone on stdout."""
    import json

    import yaml

    from sglang_patcher.cli import main
    monkeypatch.setenv("SGLPATCH_HOME", str(tmp_path / "home"))
    inv = tmp_path / "hosts.yaml"
    inv.write_text(yaml.safe_dump({"hosts": {"loc": {"transport": "local", "python": str(local_target)}}}))
    capsys.readouterr()
    assert main(["--hosts", str(inv), "--json", "snapshot", "loc"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["round_trips"] == 1
    said = [ln for ln in err.splitlines() if ln.startswith("snapshot loc (first, whole install): ")]
    assert said[0].endswith(" ahead") and "files" in said[0] and "MiB" in said[0]
    assert " files, " in said[-1] and " MiB in " in said[-1] and "MiB/s)" in said[-1]
