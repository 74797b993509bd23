"""The ``sglpatch`` command line end to end: real sshd on loopback, real sglang 0.5.23 venvs.

Each test writes its own hosts.yaml and calls the CLI's ``main`` in-process (exit codes and ``--json``
output are what a user and a CI script see).
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import json
import os
from pathlib import Path

import pytest
import yaml

from sglang_patcher.cli import main
from tests.support.inode_flags import chattr  # noqa: F401  (the fixture)

pytestmark = [pytest.mark.sglang]

VERSION = "0.5.23"


def write_hosts(path: Path, *hosts) -> Path:
    """hosts.yaml holding the given inventory Host objects."""
    data = {"hosts": {h.name: h.model_dump(exclude_none=True, exclude={"name"}) for h in hosts}}
    path.write_text(yaml.safe_dump(data))
    return path


def run_cli(capsys, *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def run_json(capsys, *args: str):
    code, out, err = run_cli(capsys, "--json", *args)
    try:
        return code, json.loads(out), err
    except ValueError:
        raise AssertionError(f"not JSON (exit {code}):\n{out}\n--- stderr\n{err}")


def record_hashes(site_packages: Path) -> dict[str, str]:
    """{path: hex sha256} from the installed distribution's RECORD (entries that carry a hash)."""
    record = next(site_packages.glob("sglang-*.dist-info")) / "RECORD"
    out = {}
    for row in csv.reader(io.StringIO(record.read_text())):
        if len(row) > 1 and row[1].startswith("sha256="):
            out[row[0]] = base64.urlsafe_b64decode(row[1][7:] + "==").hex()
    return out


def live_hash(site_packages: Path, rel: str) -> str | None:
    p = site_packages / rel
    return hashlib.sha256(p.read_bytes()).hexdigest() if p.exists() else None


def file_states(status_json) -> dict[str, str]:
    return {f["path"]: f["state"] for f in status_json["files"]}


def _ddtree_releases() -> list[str]:
    from sglang_patcher.patchset import load_patchset

    return load_patchset("ddtree").versions


@pytest.mark.parametrize("release", _ddtree_releases())
def test_diff_against_the_pypi_wheel_needs_no_ssh(capsys, sglpatch_home, release):
    """Every release the patchset targets: the offline dry-run renders, and git accepts its diff."""
    code, out, plain_err = run_cli(capsys, "diff", "ddtree", "--sglang", release)
    assert code == 0, plain_err
    assert "+    DDTREE = auto()" in out
    assert "sglang/srt/speculative/spec_info.py" in out

    code, data, err = run_json(capsys, "diff", "ddtree", "--sglang", release)
    assert code == 0, err
    assert data["revision"] >= 1
    assert "sglang/srt/speculative/spec_info.py" in data["files"]
    assert "+    DDTREE = auto()" in data["diff"]
    # the plain output holds every diff line whole, also the ones wider than the (80-column,
    # not a terminal) console: cropping made distinct -/+ lines print the same (new-user run)
    long_lines = [line for line in data["diff"].splitlines() if len(line) > 100]
    assert long_lines
    printed = set(out.splitlines())
    assert all(line in printed for line in long_lines)
    # stdout is the patch alone (`sglpatch diff ... > x.patch`); what it is goes to stderr
    assert out == data["diff"]
    assert "hunk(s) applied strictly" in plain_err and "pristine tree: sglang==" in plain_err
    # ...which `git apply --check` accepts against the pristine tree `patchset tree` names
    code, tree, _ = run_cli(capsys, "patchset", "tree", release)
    assert code == 0 and Path(tree.strip(), "sglang", "srt").is_dir(), tree
    import subprocess
    check = subprocess.run(["git", "apply", "--check", "-"], cwd=tree.strip(), input=out.encode(),
                           capture_output=True)
    assert check.returncode == 0, check.stderr.decode()


def test_diff_of_an_unsupported_release_lists_the_supported_ones(capsys, sglpatch_home):
    code, out, err = run_cli(capsys, "diff", "ddtree", "--sglang", "0.4.0")
    assert code == 3
    assert "0.4.0" in err and VERSION in err


def test_diff_needs_exactly_one_target(capsys, sglpatch_home):
    code, _, err = run_cli(capsys, "diff", "ddtree")
    assert code == 2 and "--sglang" in err


@pytest.mark.ssh
def test_the_whole_story_over_ssh(capsys, tmp_path, sglpatch_home, sshd, sglang_target):
    host = sshd.host_entry(sglang_target, name="gpu-test")
    hosts = write_hosts(tmp_path / "hosts.yaml", host)
    site = sglang_target.site_packages
    record = record_hashes(site)

    code, data, err = run_json(capsys, "--hosts", str(hosts), "hosts", "--check")
    assert code == 0, err
    assert data["hosts"]["gpu-test"]["ok"] is True
    assert data["hosts"]["gpu-test"]["sglang_version"] == VERSION

    code, data, err = run_json(capsys, "--hosts", str(hosts), "snapshot", "gpu-test")
    assert code == 0, err
    assert data["files"] > 1000 and data["round_trips"] <= 3

    code, data, err = run_json(capsys, "--hosts", str(hosts), "diff", "ddtree", "--host", "gpu-test")
    assert code == 0, err
    assert "+    DDTREE = auto()" in data["diff"]

    # without --yes and without a terminal, apply refuses rather than deploying unasked
    code, _, err = run_cli(capsys, "--hosts", str(hosts), "apply", "ddtree", "--host", "gpu-test")
    assert code == 2 and "--yes" in err
    assert all(live_hash(site, p) == record[p] for p in record if p.endswith("spec_info.py"))

    code, data, err = run_json(capsys, "--hosts", str(hosts), "apply", "ddtree", "--host",
                               "gpu-test", "--yes")
    assert code == 0, err
    assert data["status"] == "applied"
    assert data["checks"]["summary"]["L0"] == "passed", data["checks"]
    # this target has no torch: L1 must say skipped (never passed) and not fail the gate
    assert data["checks"]["summary"]["L1"] == "skipped", data["checks"]
    assert all(c["status"] == "skipped" and "skipped" in (c["detail"] + c["status"])
               for c in data["checks"]["checks"] if c["level"] == "L1"), data["checks"]

    code, data, err = run_json(capsys, "--hosts", str(hosts), "status", "--host", "gpu-test",
                               "--patchset", "ddtree")
    assert code == 0, err
    states = file_states(data)   # patched, but a file only an earlier revision installed: absent
    assert states and all(s.startswith("patched") for p, s in states.items() if p not in data["retired"]), states
    assert data["overall"] == "patched" and all(states[p] == "absent" for p in data["retired"]), data

    code, data, err = run_json(capsys, "--hosts", str(hosts), "apply", "ddtree", "--host",
                               "gpu-test", "--yes")
    assert code == 0, err
    assert data["status"] == "already_applied"

    code, data, err = run_json(capsys, "--hosts", str(hosts), "rollback", "--host", "gpu-test")
    assert code == 0, err

    code, data, err = run_json(capsys, "--hosts", str(hosts), "status", "--host", "gpu-test",
                               "--patchset", "ddtree")
    assert code == 0, err
    states = file_states(data)
    assert all(s in ("pristine", "absent") for s in states.values()), states
    for path in states:
        if path in record:
            assert live_hash(site, path) == record[path], path
        else:
            assert live_hash(site, path) is None, f"{path} was added and must be gone"


@pytest.mark.ssh
@pytest.mark.parametrize("case", ["immutable file", "directory the SSH user cannot write"])
def test_apply_refuses_files_it_cannot_replace_before_writing_anything_a_dry_run_too(
        capsys, tmp_path, sglpatch_home, sshd, sglang_target, chattr, case):
    """A file apply would replace is immutable (chattr +i: not even root may rename over it), or its
    directory is not writable by the SSH user: `hosts --check` says so, with why (the same host-side
    test), and `apply` — `--dry-run` too, which used to say it would write the files — refuses with
    exit 8 before anything is written, naming the host, the files and why, and what to do."""
    host = sshd.host_entry(sglang_target, name="gpu-test")
    h = ["--hosts", str(write_hosts(tmp_path / "hosts.yaml", host))]
    site = sglang_target.site_packages
    spec = "sglang/srt/speculative/spec_info.py"
    before = live_hash(site, spec)
    if case == "immutable file":
        chattr("+i", site / spec)
        blocked, why, says, hint = spec, "is immutable (chattr +i)", [f"{spec} is immutable (chattr +i)"], "chattr -i"
    else:
        os.chmod(site / "sglang/srt/speculative", 0o555)
        blocked, why = "sglang/srt/speculative", f"is not writable by {sshd.user} (owner {sshd.user}, mode 0555)"
        says = [f"12 file(s) in a directory not writable by {sshd.user} ({site}/sglang/srt/speculative {why})",
                "sglang/srt/speculative/ddtree_accept.py"]
        hint = f"give {sshd.user} write permission"
    try:
        code, data, err = run_json(capsys, *h, "hosts", "--check")    # not ok: exit 8, as apply gives
        assert code == 8 and data["hosts"]["gpu-test"]["writable"] is False, data
        assert data["ok"] is False and data["hosts"]["gpu-test"]["ok"] is False, data
        assert data["hosts"]["gpu-test"]["unwritable_why"] == {blocked: why}, data["hosts"]["gpu-test"]
        code, out, _ = run_cli(capsys, *h, "hosts", "--check")
        assert code == 8 and f"{blocked} {why}" in " ".join(out.split()), out

        for args in (["--dry-run"], ["--yes"]):
            code, data, err = run_json(capsys, *h, "apply", "ddtree", "--host", "gpu-test", *args)
            assert code == 8 and data["type"] == "AgentError", (args, data, err)
            assert data["error"].startswith("gpu-test: cannot apply ddtree r"), data["error"]
            assert "nothing was written" in data["error"] and hint in data["hint"], data
            for text in says:
                assert text in data["error"], (text, data["error"])
            assert live_hash(site, spec) == before
            assert not (site / ".sglpatch").exists(), "nothing written: no lock, journal, backup"
            assert not list(site.rglob(".*.sglpatch-*")), "nothing staged"
            assert not list((sglpatch_home / "deployments").rglob("*.json")), "no local record"
    finally:
        os.chmod(site / "sglang/srt/speculative", 0o755)


@pytest.mark.ssh
def test_rollback_refuses_a_file_made_immutable_after_the_apply_before_writing_anything(
        capsys, tmp_path, sglpatch_home, sshd, sglang_target, chattr):
    """New-user run: apply, then `chattr +i` on a patched file, then rollback. It restored 22 files,
    died on the 23rd with a raw PermissionError (exit 10) and left the host pending — journal, lock,
    one file still patched — and the next apply failed the same way. The rollback runs apply's
    preflight first: exit 8 naming the host, the file and why, the chattr hint; nothing written
    (every file still patched, no journal, no lock); apply is a clean no-op; cleared, it rolls back."""
    host = sshd.host_entry(sglang_target, name="gpu-test")
    h = ["--hosts", str(write_hosts(tmp_path / "hosts.yaml", host))]
    site = sglang_target.site_packages
    record = record_hashes(site)
    code, data, err = run_json(capsys, *h, "apply", "ddtree", "--host", "gpu-test", "--yes")
    assert code == 0 and data["status"] == "applied", err
    touched = sorted(data["plan"]["files"])
    patched = {p: live_hash(site, p) for p in touched}
    state = site / ".sglpatch"
    state_before = {p: p.read_bytes() for p in state.rglob("*") if p.is_file()}
    spec = "sglang/srt/speculative/spec_utils.py"
    chattr("+i", site / spec)

    code, data, err = run_json(capsys, *h, "rollback", "--host", "gpu-test")
    assert code == 8 and data["type"] == "AgentError", (data, err)
    assert data["error"].startswith("gpu-test: rollback: cannot roll back deployment "), data["error"]
    assert f"{spec} is immutable (chattr +i)" in data["error"] and "nothing was written" in data["error"], data
    assert "chattr -i" in data["hint"], data["hint"]
    assert {p: live_hash(site, p) for p in touched} == patched, "no file restored"
    assert {p: p.read_bytes() for p in state.rglob("*") if p.is_file()} == state_before, "no lock, no journal"
    assert not list(site.rglob(".*.sglpatch-*")), "nothing staged"

    code, data, err = run_json(capsys, *h, "apply", "ddtree", "--host", "gpu-test", "--yes")
    assert code == 0 and data["status"] == "already_applied", (data, err)

    import subprocess
    subprocess.run(["chattr", "-i", str(site / spec)], check=True)
    code, data, err = run_json(capsys, *h, "rollback", "--host", "gpu-test")
    assert code == 0, (data, err)
    assert all(live_hash(site, p) == record.get(p) for p in touched), "every file back to pristine"


@pytest.mark.ssh
@pytest.mark.parametrize("case", ["under an immutable directory", "in a directory the SSH user cannot write"])
def test_hosts_check_judges_the_state_dir_as_apply_does(capsys, tmp_path, sglpatch_home, sshd, sglang_target,
                                                        chattr, case):
    """The inventory's `state_dir:` where the SSH user cannot write it: `hosts --check` said
    "writable yes / ok" while `apply --dry-run` refused (exit 8, "cannot write the host's state
    dir"). The probe is given the host's state dir and judges it by the agent's own rule
    (access.state_dir_problem): not writable, not ok, with why and the hint; apply still refuses."""
    parent = sshd.home / f"state-parent-{os.getpid()}"
    parent.mkdir(exist_ok=True)
    os.chown(parent, sshd.uid, sshd.gid)
    state = parent / "sglpatch-state"
    try:
        if case == "under an immutable directory":
            chattr("+i", parent)
            why, hint = f"(checked {parent}, where it would be made) is immutable (chattr +i)", "chattr -i"
        else:
            os.chown(parent, 0, 0)
            os.chmod(parent, 0o755)
            why = f"(checked {parent}, where it would be made) is not writable by {sshd.user} (owner root, mode 0755)"
            hint = "set `state_dir:` for this host to a directory it can write"
        host = sshd.host_entry(sglang_target, name="gpu-test", state_dir=str(state))
        h = ["--hosts", str(write_hosts(tmp_path / "hosts.yaml", host))]
        code, data, err = run_json(capsys, *h, "hosts", "--check")
        got = data["hosts"]["gpu-test"]
        assert code == 8 and got["writable"] is False and got["ok"] is False and data["ok"] is False, (got, err)
        assert got["state_dir"] == str(state) and got["state_dir_why"] == why, got
        assert got["unwritable_count"] == 0 and got["unwritable"] == [], "the install itself is writable"
        code, out, _ = run_cli(capsys, *h, "hosts", "--check")
        flat = " ".join(out.split())
        assert code == 8 and "not ok" in flat and f"state dir {state} {why}" in flat, out
        assert f"not writable by {sshd.user}: its state dir" in flat and hint in flat, out
        code, data, err = run_json(capsys, *h, "apply", "ddtree", "--host", "gpu-test", "--dry-run")
        assert code == 8 and "cannot write the host's state dir" in data["error"], (data, err)
        assert str(parent) in data["error"], data["error"]
    finally:
        import subprocess
        subprocess.run(["chattr", "-i", str(parent)], check=False, capture_output=True)
        import shutil
        shutil.rmtree(parent, ignore_errors=True)


def test_a_rollback_of_stacked_deployments_checks_every_file_before_the_first_is_undone(
        capsys, tmp_path, sglpatch_home, local_target, chattr):
    """`rollback --to` the first of two stacked deployments (ddtree r5, then r6 over it) undoes r6,
    then r5. A file only r5 changed, made immutable, stopped r5's rollback after r6's had gone
    through; now every file the whole rollback would restore is checked first: exit 8 naming both
    deployments and the file, nothing written — both still active, every file as it was."""
    from sglang_patcher.inventory import Host

    h = ["--hosts", str(write_hosts(tmp_path / "hosts.yaml",
                                    Host(name="here", transport="local", python=str(local_target))))]
    site = local_target.site_packages
    code, first, err = run_json(capsys, *h, "apply", "ddtree@5", "--host", "here", "--yes")
    assert code == 0 and first["status"] == "applied", err
    code, second, err = run_json(capsys, *h, "apply", "ddtree", "--host", "here", "--yes")
    assert code == 0 and second["status"] == "applied", err
    changed_by_second = {p for p, f in second["plan"]["files"].items() if f["action"] != "none"}
    only_first = [p for p, f in sorted(first["plan"]["files"].items())
                  if f["action"] == "write" and p not in changed_by_second]
    assert only_first, "r6 left some file of r5 as r5 wrote it"
    touched = sorted(set(first["plan"]["files"]) | set(second["plan"]["files"]))
    live_before = {p: live_hash(site, p) for p in touched}
    chattr("+i", site / only_first[0])
    code, data, err = run_json(capsys, *h, "rollback", "--host", "here", "--to", first["deployment_id"])
    assert code == 8 and data["type"] == "AgentError", (data, err)
    assert data["error"].startswith(f"here: cannot roll back {second['deployment_id']}, {first['deployment_id']}: "), data
    assert f"{only_first[0]} is immutable (chattr +i)" in data["error"] and "nothing was written" in data["error"]
    assert "chattr -i" in data["hint"]
    assert {p: live_hash(site, p) for p in touched} == live_before, "nothing restored"
    code, data, err = run_json(capsys, *h, "status", "--host", "here")
    assert code == 0 and not (site / ".sglpatch" / "journal.json").exists(), (data, err)
    assert [d["phase"] for d in data["deployments"]][-2:] == ["verified", "verified"], data["deployments"]


def test_rollback_to_a_deployment_rolled_back_already_says_it_undid_the_later_one(
        capsys, tmp_path, sglpatch_home, local_target):
    """New-user pass: `rollback --to X` where X was rolled back already and Y was applied since
    undid Y (the host as before X, as documented) without a word about X. Now the result names X,
    when it was rolled back, and that Y is undone because it came after X; --json carries it too."""
    from sglang_patcher.inventory import Host

    h = ["--hosts", str(write_hosts(tmp_path / "hosts.yaml",
                                    Host(name="here", transport="local", python=str(local_target))))]
    code, x, err = run_json(capsys, *h, "apply", "ddtree", "--host", "here", "--yes")
    assert code == 0, err
    assert run_json(capsys, *h, "rollback", "--host", "here")[0] == 0
    code, y, err = run_json(capsys, *h, "apply", "ddtree", "--host", "here", "--yes")
    assert code == 0 and y["deployment_id"] != x["deployment_id"], err
    code, out, err = run_cli(capsys, *h, "rollback", "--host", "here", "--to", x["deployment_id"])
    said = " ".join(out.split())
    assert code == 0, err
    assert f"deployment {x['deployment_id']} (named by --to) was rolled back already at " in said, said
    assert f"so that the host is as before it: {y['deployment_id']}" in said, said
    code, data, _ = run_json(capsys, *h, "status", "--host", "here")
    assert [d["phase"] for d in data["deployments"]][-2:] == ["rolled_back", "rolled_back"], data["deployments"]
    # the same through --json, on a third deployment
    code, z, err = run_json(capsys, *h, "apply", "ddtree", "--host", "here", "--yes")
    code, data, err = run_json(capsys, *h, "rollback", "--host", "here", "--to", x["deployment_id"])
    assert code == 0 and data["rolled_back"] == [z["deployment_id"]], (data, err)
    assert data["to_rolled_back"]["id"] == x["deployment_id"] and data["to_rolled_back"]["rolled_back_at"], data
    # --to the active one itself says nothing of the kind
    code, z2, err = run_json(capsys, *h, "apply", "ddtree", "--host", "here", "--yes")
    code, data, err = run_json(capsys, *h, "rollback", "--host", "here", "--to", z2["deployment_id"])
    assert code == 0 and data["rolled_back"] == [z2["deployment_id"]] and data["to_rolled_back"] == {}, data


@pytest.mark.ssh
def test_rollback_without_host_takes_the_latest_deployment(capsys, tmp_path, sglpatch_home,
                                                          sshd, sglang_target):
    host = sshd.host_entry(sglang_target, name="gpu-test")
    hosts = write_hosts(tmp_path / "hosts.yaml", host)
    code, _, err = run_json(capsys, "--hosts", str(hosts), "apply", "ddtree", "--host", "gpu-test",
                            "--yes")
    assert code == 0, err
    code, _, err = run_cli(capsys, "--hosts", str(hosts), "rollback")
    assert code == 0, err
    assert "gpu-test" in err + _
    record = record_hashes(sglang_target.site_packages)
    p = "sglang/srt/speculative/spec_info.py"
    assert live_hash(sglang_target.site_packages, p) == record[p]


def test_the_whole_story_over_the_local_transport(capsys, tmp_path, sglpatch_home, local_target):
    from sglang_patcher.inventory import Host

    hosts = write_hosts(tmp_path / "hosts.yaml",
                        Host(name="here", transport="local", python=str(local_target)))
    site = local_target.site_packages
    record = record_hashes(site)
    code, data, err = run_json(capsys, "--hosts", str(hosts), "apply", "ddtree", "--host", "here",
                               "--yes")
    assert code == 0, err
    assert data["status"] == "applied"
    code, data, err = run_json(capsys, "--hosts", str(hosts), "status", "--host", "here")
    assert code == 0, err
    assert all(s.startswith("patched") for s in file_states(data).values())
    code, _, err = run_json(capsys, "--hosts", str(hosts), "rollback", "--host", "here")
    assert code == 0, err
    p = "sglang/srt/speculative/spec_info.py"
    assert live_hash(site, p) == record[p]


def test_apply_dry_run_shows_the_plan_and_the_whole_diff_and_writes_nothing(capsys, tmp_path, sglpatch_home,
                                                                          local_target):
    from sglang_patcher.inventory import Host

    hosts = write_hosts(tmp_path / "hosts.yaml",
                        Host(name="here", transport="local", python=str(local_target)))
    site = local_target.site_packages
    p = "sglang/srt/speculative/spec_info.py"
    before = live_hash(site, p)
    code, data, err = run_json(capsys, "--hosts", str(hosts), "apply", "ddtree", "--host", "here",
                               "--dry-run")
    assert code == 0, err
    assert data["status"] == "dry_run" and data["deployment_id"] is None
    assert "+    DDTREE = auto()" in data["diff"]
    # the human view: the plan table, then every diff line whole (as `diff` prints it)
    code, out, err = run_cli(capsys, "--hosts", str(hosts), "apply", "ddtree", "--host", "here", "--dry-run")
    assert code == 0, err
    assert "here: dry run (nothing written)" in out and p in out
    from sglang_patcher.deploy import diffstat  # the plan's "lines" column: + / − per file of the diff
    added, removed = diffstat(data["diff"])[p]
    assert added > 0 and f"+{added} −{removed}" in out, out[:3000]
    printed = set(out.splitlines())
    long_lines = [line for line in data["diff"].splitlines() if len(line) > 100]
    assert long_lines and all(line in printed for line in long_lines)
    assert "+    DDTREE = auto()" in printed
    assert live_hash(site, p) == before, "a dry run writes nothing"
    assert not any((site / ".sglpatch").rglob("*.json")), "no deployment record or journal"
    assert not any(site.rglob(".*.sglpatch-*")), "nothing staged"


def test_diff_against_a_host_names_the_files_apply_would_refuse_as_drifted_and_exits_7(capsys, tmp_path, sglpatch_home,
                                                                           local_target):
    from sglang_patcher.inventory import Host

    hosts = write_hosts(tmp_path / "hosts.yaml",
                        Host(name="here", transport="local", python=str(local_target)))
    code, data, err = run_json(capsys, "--hosts", str(hosts), "diff", "ddtree", "--host", "here")
    assert code == 0 and data["ok"] is True and "exit_code" not in data, err
    assert data["drifted"] == [] and data["host_plan"] == "apply"
    # 13: the twelve files revision 11 installs (six modules, six kernels) and revision 3's retired
    # kernel module, which the upgrade path knows about
    assert data["against"] == "host here (pristine bytes from the mirror; 13 file(s) the release does not have)", \
        data["against"]
    p = "sglang/srt/speculative/spec_utils.py"
    target = local_target.site_packages / p
    target.write_bytes(target.read_bytes() + b"\n# edited by hand on the host\n")
    code, data, err = run_json(capsys, "--hosts", str(hosts), "diff", "ddtree", "--host", "here")
    assert code == 7, err  # the diff is shown, but it does not apply cleanly: apply would refuse
    assert data["ok"] is False and data["exit_code"] == 7
    assert data["drifted"] == [p] and data["host_plan"] == "drift"
    assert "+    DDTREE = auto()" in data["diff"]
    code, out, err = run_cli(capsys, "--hosts", str(hosts), "diff", "ddtree", "--host", "here")
    assert code == 7, err
    assert "drifted on the host" in err and p in err


def test_drift_is_refused_then_forced(capsys, tmp_path, sglpatch_home, local_target):
    from sglang_patcher.inventory import Host

    hosts = write_hosts(tmp_path / "hosts.yaml",
                        Host(name="here", transport="local", python=str(local_target)))
    target = local_target.site_packages / "sglang/srt/speculative/spec_info.py"
    target.write_bytes(target.read_bytes() + b"\n# edited by hand on the host\n")
    drifted = hashlib.sha256(target.read_bytes()).hexdigest()
    code, _, err = run_cli(capsys, "--hosts", str(hosts), "apply", "ddtree", "--host", "here", "--yes")
    assert code == 7, err
    assert "spec_info.py" in err
    assert hashlib.sha256(target.read_bytes()).hexdigest() == drifted, "nothing may be written"


def test_bad_hosts_yaml_names_the_file_and_line(capsys, tmp_path, sglpatch_home):
    bad = tmp_path / "hosts.yaml"
    bad.write_text("hosts:\n  gpu:\n    transport: ssh\n    hostname: h\n    python: bin/python\n")
    code, _, err = run_cli(capsys, "--hosts", str(bad), "hosts")
    assert code == 2
    assert str(bad) in err and "line 5" in err and "absolute" in err


def test_a_host_name_without_any_inventory_says_so(capsys, tmp_path, monkeypatch, sglpatch_home):
    """No ./hosts.yaml, no --hosts, no $SGLPATCH_HOSTS: a host name is unknown because there is no
    inventory, and the hint says where one goes; `sandbox` still works without one."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("SGLPATCH_HOSTS", raising=False)
    code, data = run_json(capsys, "status", "--host", "gpu-9")[:2]
    assert code == 2 and data["error"].startswith("unknown host 'gpu-9': there is no inventory"), data
    assert "./hosts.yaml" in data["hint"] and "--host sandbox" in data["hint"]
    (tmp_path / "hosts.yaml").write_text("hosts:\n")  # an inventory that names no host
    code, data = run_json(capsys, "status", "--host", "gpu-9")[:2]
    assert code == 2 and "there is no inventory" not in data["error"] and "gpu-9" in data["error"], data


def test_unknown_host_lists_the_known_ones(capsys, tmp_path, sglpatch_home):
    from sglang_patcher.inventory import Host

    hosts = write_hosts(tmp_path / "hosts.yaml",
                        Host(name="alpha", transport="local", python="/usr/bin/python3"))
    code, _, err = run_cli(capsys, "--hosts", str(hosts), "status", "--host", "beta")
    assert code == 2 and "alpha" in err


@pytest.mark.ssh
def test_unknown_host_key_fails_closed(capsys, tmp_path, sglpatch_home, sshd, sglang_target):
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    host = sshd.host_entry(sglang_target, name="gpu-test", known_hosts=str(empty))
    hosts = write_hosts(tmp_path / "hosts.yaml", host)
    code, _, err = run_cli(capsys, "--hosts", str(hosts), "snapshot", "gpu-test")
    assert code == 5
    assert f"{sshd.host}:{sshd.port}" in err or f"[{sshd.host}]:{sshd.port}" in err


def test_interpreter_missing_is_a_discovery_error(capsys, tmp_path, sglpatch_home):
    from sglang_patcher.inventory import Host

    hosts = write_hosts(tmp_path / "hosts.yaml",
                        Host(name="here", transport="local", python="/nonexistent/bin/python"))
    code, _, err = run_cli(capsys, "--hosts", str(hosts), "snapshot", "here")
    assert code in (5, 6)
    assert "/nonexistent/bin/python" in err


def test_rollback_refuses_hand_edits_made_after_the_deploy_then_keeps_them_with_force(
        capsys, tmp_path, sglpatch_home, local_target):
    from sglang_patcher.inventory import Host

    hosts = write_hosts(tmp_path / "hosts.yaml",
                        Host(name="here", transport="local", python=str(local_target)))
    site = local_target.site_packages
    record = record_hashes(site)
    code, _, err = run_json(capsys, "--hosts", str(hosts), "apply", "ddtree", "--host", "here", "--yes")
    assert code == 0, err
    target = site / "sglang/srt/speculative/spec_utils.py"
    edited = target.read_bytes() + b"\n# an important hotfix made on the host\n"
    target.write_bytes(edited)

    code, _, err = run_cli(capsys, "--hosts", str(hosts), "rollback", "--host", "here")
    assert code == 7, err
    assert "spec_utils.py" in err
    assert target.read_bytes() == edited, "a refused rollback must change nothing"
    assert live_hash(site, "sglang/srt/speculative/spec_info.py") != record[
        "sglang/srt/speculative/spec_info.py"], "the other files stay deployed too"

    code, out, err = run_cli(capsys, "--hosts", str(hosts), "rollback", "--host", "here", "--force")
    assert code == 0, err
    for rel in ("sglang/srt/speculative/spec_utils.py", "sglang/srt/speculative/spec_info.py"):
        assert live_hash(site, rel) == record[rel]
    kept = list((site / ".sglpatch" / "backups").glob("*.drifted/sglang/srt/speculative/spec_utils.py"))
    assert len(kept) == 1 and kept[0].read_bytes() == edited, "the hand edit must not be lost"
    assert "its edited bytes were kept at" in " ".join(out.split()), out  # and the user is told where


def test_status_is_patched_after_a_rolled_back_revision_that_created_a_file(
        capsys, tmp_path, sglpatch_home, local_target):
    """A module created by a deployment that was rolled back is absent again — its pristine state —
    and must not turn the host's overall status into 'mixed'."""
    import shutil

    from sglang_patcher.inventory import Host
    from sglang_patcher.patchset_write import refresh_hashes
    from sglang_patcher.wheelcache import pristine_tree

    extra = tmp_path / "extra"
    (extra / "modules").mkdir(parents=True)
    (extra / "modules" / "sglpatch_extra.py").write_text("VALUE = 1\n")
    (extra / "patchset.yaml").write_text(
        "name: extra\nrevision: 1\ndescription: one new module\n"
        "targets:\n  \"0.5.23\":\n    series: []\n"
        "    new_files: {sglang/srt/speculative/sglpatch_extra.py: modules/sglpatch_extra.py}\n"
        "    pristine: {}\n    expected: {}\n")
    refresh_hashes(extra, VERSION, pristine_tree(VERSION).read)
    hosts = write_hosts(tmp_path / "hosts.yaml",
                        Host(name="here", transport="local", python=str(local_target)))
    h = ["--hosts", str(hosts)]
    assert run_json(capsys, *h, "apply", str(extra), "--host", "here", "--yes")[0] == 0
    assert run_json(capsys, *h, "rollback", "--host", "here")[0] == 0
    assert not (local_target.site_packages / "sglang/srt/speculative/sglpatch_extra.py").exists()
    code, data, err = run_json(capsys, *h, "apply", "ddtree", "--host", "here", "--yes")
    assert code == 0, err
    code, data, err = run_json(capsys, *h, "status", "--host", "here")
    assert code == 0, err
    assert data["overall"] == "patched", data
    # without --patchset, what the host carries is its active deployments (the rolled-back one is not)
    applied = next(d for d in data["deployments"] if d["phase"] not in ("rolled_back",))
    assert data["patchset"] is None and data["active"] == [
        {"id": applied["id"], "patchset": "ddtree", "revision": applied["revision"]}], data["active"]
    code, out, err = run_cli(capsys, *h, "status", "--host", "here")
    assert code == 0 and f"patched (ddtree r{applied['revision']})" in out, out


def test_a_broken_host_entry_does_not_stop_work_on_the_other_hosts(capsys, tmp_path, sglpatch_home,
                                                                   local_target):
    """An inventory with one valid host and one broken entry: commands on the valid host run
    (with a warning naming the broken one), the broken host's own command fails with its problem
    (exit 2), and `hosts` — the inventory check — still refuses the file."""
    from sglang_patcher.inventory import Host

    hosts = write_hosts(tmp_path / "hosts.yaml", Host(name="here", transport="local", python=str(local_target)))
    with open(hosts, "a") as f:
        f.write("  typo:\n    hostname: 10.0.0.2\n    pyton: /usr/bin/python3\n")
    h = ["--hosts", str(hosts)]
    code, data, err = run_json(capsys, *h, "status", "--host", "here")
    assert code == 0 and data["overall"] == "pristine", data
    assert "left out invalid host entry typo" in err and "sglpatch hosts" in err, err
    code, data, err = run_json(capsys, *h, "status", "--host", "typo")
    assert code == 2 and "host 'typo' is invalid" in data["error"] and "did you mean `python`" in data["error"]
    assert "left out" not in err  # no warning about the very host that was asked for
    code, data, _ = run_json(capsys, *h, "hosts")
    assert code == 2 and "invalid inventory" in data["error"], data


def test_json_errors_are_one_document_on_stdout(capsys, tmp_path, sglpatch_home):
    code, data, _ = run_json(capsys, "diff", "no-such-patchset", "--sglang", VERSION)
    assert code == 3
    assert data["ok"] is False and data["exit_code"] == 3 and "no-such-patchset" in data["error"]
    assert "__editable__" not in (data["hint"] or "")


def test_hosts_check_exits_non_zero_when_a_host_fails(capsys, tmp_path, sglpatch_home, local_target):
    from sglang_patcher.inventory import Host

    hosts = write_hosts(tmp_path / "hosts.yaml",
                        Host(name="good", transport="local", python=str(local_target)),
                        Host(name="bad", transport="local", python="/nonexistent/python"))
    code, data, _ = run_json(capsys, "--hosts", str(hosts), "hosts", "--check")
    assert code == 6, data
    assert data["hosts"]["good"]["ok"] is True and data["hosts"]["bad"]["ok"] is False
    hint = data["hosts"]["bad"]["hint"]
    code, out, _ = run_cli(capsys, "--hosts", str(hosts), "hosts", "--check")
    assert code == 6 and "hint:" in out and (not hint or hint.split()[0] in out), out  # the table shows it too


def test_an_interpreter_that_is_not_python_is_named_without_the_payload(capsys, tmp_path, sglpatch_home):
    from sglang_patcher.inventory import Host

    hosts = write_hosts(tmp_path / "hosts.yaml", Host(name="e", transport="local", python="/bin/echo"))
    code, _, err = run_cli(capsys, "--hosts", str(hosts), "snapshot", "e")
    assert code == 6 and "not a CPython" in err
    assert len(err) < 1000, err


def test_demo_refuses_an_unsupported_release_before_touching_the_sandbox(capsys, sglpatch_home):
    code, _, err = run_cli(capsys, "demo", "--sglang", "0.5.18")
    assert code == 3 and "0.5.23" in err
    assert not (sglpatch_home / "sandbox").exists()


def test_a_damaged_mirror_manifest_is_rebuilt(capsys, tmp_path, sglpatch_home, local_target):
    from sglang_patcher.inventory import Host

    hosts = write_hosts(tmp_path / "hosts.yaml",
                        Host(name="here", transport="local", python=str(local_target)))
    assert run_json(capsys, "--hosts", str(hosts), "snapshot", "here")[0] == 0
    manifest = next((sglpatch_home / "mirrors" / "here").glob("*/manifest.json"))
    manifest.write_text('{"files": 5}')
    code, data, err = run_json(capsys, "--hosts", str(hosts), "snapshot", "here")
    assert code == 0, err
    assert data["files"] > 1000


def test_an_older_revision_over_a_newer_one_is_refused_as_a_downgrade(capsys, tmp_path, sglpatch_home,
                                                                     local_target):
    from sglang_patcher.inventory import Host

    hosts = write_hosts(tmp_path / "hosts.yaml",
                        Host(name="here", transport="local", python=str(local_target)))
    h = ["--hosts", str(hosts)]
    assert run_json(capsys, *h, "apply", "ddtree", "--host", "here", "--yes")[0] == 0
    before = {p.name: p.read_bytes() for p in (local_target.site_packages / "sglang/srt/speculative").glob("*.py")}
    for extra in ([], ["--force"]):
        code, data, _ = run_json(capsys, *h, "apply", "ddtree@1", "--host", "here", "--yes", *extra)
        assert code == 8, data
        assert "downgrade is a rollback" in data["error"] and "rollback" in data["hint"]
    code, data, _ = run_json(capsys, *h, "diff", "ddtree@1", "--host", "here")  # diff says what apply would
    assert code == 8 and "downgrade is a rollback" in data["error"] and "drift" not in data["error"], data
    after = {p.name: p.read_bytes() for p in (local_target.site_packages / "sglang/srt/speculative").glob("*.py")}
    assert after == before, "a refused downgrade writes nothing"


def test_damaged_host_records_are_one_clear_error(capsys, tmp_path, sglpatch_home, local_target):
    from sglang_patcher.inventory import Host

    hosts = write_hosts(tmp_path / "hosts.yaml",
                        Host(name="here", transport="local", python=str(local_target)))
    h = ["--hosts", str(hosts)]
    assert run_json(capsys, *h, "apply", "ddtree@1", "--host", "here", "--yes")[0] == 0
    state = local_target.site_packages / ".sglpatch"
    (state / "journal.json").write_text("{oops")
    for cmd in (["apply", "ddtree@1", "--host", "here", "--yes"], ["rollback", "--host", "here"]):
        code, data, _ = run_json(capsys, *h, *cmd)
        assert code == 10, data
        assert "damaged deployment record" in data["error"] and "journal.json" in data["error"]
        assert "sglpatch status" in data["hint"]
    # status, where the hint sends the user, names the damaged record (not a bogus "pending")
    code, data, _ = run_json(capsys, *h, "status", "--host", "here")
    assert code == 0 and data["overall"] == "damaged" and data["journal"] is None, data
    assert [p.endswith("journal.json") for p in data["damaged"]] == [True]
    code, out, _ = run_cli(capsys, *h, "status", "--host", "here")
    assert code == 0 and "damaged deployment record" in out and "journal.json" in out, out
    (state / "journal.json").unlink()
    rec = next((state / "deployments").glob("*.json"))
    rec.write_text("{broken")
    code, data, _ = run_json(capsys, *h, "rollback", "--host", "here")
    assert code == 10 and rec.name in data["error"], data
    code, data, _ = run_json(capsys, *h, "status", "--host", "here")
    assert data["overall"] == "damaged" and [p.endswith(rec.name) for p in data["damaged"]] == [True], data
    assert all(d["id"] for d in data["deployments"])
    rec.unlink()  # moved aside: status is whole again
    code, data, _ = run_json(capsys, *h, "status", "--host", "here")
    assert data["damaged"] == [] and data["overall"] != "damaged", data


def test_rollback_with_nothing_deployed_says_so_and_where_to_look(capsys, tmp_path, sglpatch_home,
                                                                  local_target):
    """Rollback is idempotent: with nothing active (never deployed, or rolled back already) it
    exits 0, writes nothing and says so, naming the rolled-back deployment where there is one."""
    from sglang_patcher.inventory import Host

    hosts = write_hosts(tmp_path / "hosts.yaml",
                        Host(name="here", transport="local", python=str(local_target)))
    spec = local_target.site_packages / "sglang" / "srt" / "speculative"

    def live():
        return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in spec.glob("*.py")}

    h = ["--hosts", str(hosts)]
    before = live()
    code, data, _ = run_json(capsys, *h, "rollback", "--host", "here")
    assert code == 0 and data["rolled_back"] == [] and data["already"] == [] and data["files"] == {}, data
    code, out, _ = run_cli(capsys, *h, "rollback", "--host", "here")
    out = " ".join(out.split())
    assert code == 0 and "nothing to roll back" in out and "none was ever recorded" in out, out
    assert "sglpatch status --host here" in out
    assert live() == before  # nothing written
    assert run_json(capsys, *h, "apply", "ddtree", "--host", "here", "--yes")[0] == 0
    code, data, _ = run_json(capsys, *h, "rollback", "--host", "here")
    assert code == 0 and len(data["rolled_back"]) == 1 and live() == before, data
    did = data["rolled_back"][0]
    code, out, _ = run_cli(capsys, *h, "rollback", "--host", "here")  # a second time: said, not an error
    assert code == 0 and f"deployment {did} was rolled back already" in " ".join(out.split()), out
    code, data, _ = run_json(capsys, *h, "rollback", "--host", "here", "--to", did)
    assert code == 0 and data["already"] == [did] and data["rolled_back"] == [], data
    # a stack (an older revision, then the upgrade) rolled back newest first: the no-op names the
    # deployment rolled back last, the older one, not the latest started
    assert run_json(capsys, *h, "apply", "ddtree@6", "--host", "here", "--yes")[0] == 0
    assert run_json(capsys, *h, "apply", "ddtree", "--host", "here", "--yes")[0] == 0
    ids = [run_json(capsys, *h, "rollback", "--host", "here")[1]["rolled_back"] for _ in range(2)]
    assert all(len(i) == 1 for i in ids) and live() == before, ids
    code, data, _ = run_json(capsys, *h, "rollback", "--host", "here")
    assert code == 0 and data["already"] == ids[1] and data["rolled_back"] == [], (ids, data)


def test_a_host_record_lost_is_named_by_status_and_rollback_points_at_the_local_copy(capsys, tmp_path,
                                                                                     sglpatch_home, local_target):
    """The host's deployment record moved away while its files stay patched: status says so (not a
    bare "mixed"), rollback's hint names the local copy, and with it copied back the rollback works."""
    import shutil

    from sglang_patcher.inventory import Host

    hosts = write_hosts(tmp_path / "hosts.yaml",
                        Host(name="here", transport="local", python=str(local_target)))
    h = ["--hosts", str(hosts)]
    assert run_json(capsys, *h, "apply", "ddtree", "--host", "here", "--yes")[0] == 0
    records = local_target.site_packages / ".sglpatch" / "deployments"
    rec = next(records.glob("*.json"))
    moved = tmp_path / rec.name
    shutil.move(rec, moved)
    code, out, _ = run_cli(capsys, *h, "status", "--host", "here", "--patchset", "ddtree")
    assert code == 0 and "no active deployment record on the host names them" in " ".join(out.split()), out
    code, data, _ = run_json(capsys, *h, "rollback", "--host", "here")
    local = sglpatch_home / "deployments" / "here" / rec.name
    assert code == 10 and str(local) in data["hint"] and "copy the record back" in data["hint"], data
    assert "the host's record was lost" in data["error"] and "files still carry" in data["error"], data
    assert json.loads(local.read_text())["phase"] == "verified"  # its files are patched: not superseded
    shutil.copyfile(local, rec)  # what the hint says
    assert run_json(capsys, *h, "rollback", "--host", "here")[0] == 0
    assert run_json(capsys, *h, "status", "--host", "here", "--patchset", "ddtree")[1]["overall"] == "pristine"



def test_an_install_replaced_under_a_deployment_is_said_by_status_and_rollback_retires_its_record(
        capsys, tmp_path, sglpatch_home, local_target):
    """A patched install re-created (the demo's --with-deps rebuilt its sandbox; a reinstall): the
    host's records went with it, this machine's copy still said "active", and every `rollback` failed
    with exit 10, its hint telling to copy the record back onto a pristine install. Now status says
    the install was replaced; rollback says so, marks the local record superseded and exits 0; the
    next rollback and status are plain."""
    from sglang_patcher.inventory import Host

    hosts = write_hosts(tmp_path / "hosts.yaml", Host(name="here", transport="local", python=str(local_target)))
    h = ["--hosts", str(hosts)]
    code, data, err = run_json(capsys, *h, "apply", "ddtree", "--host", "here", "--yes")
    assert code == 0, err
    did = data["deployment_id"]
    local = sglpatch_home / "deployments" / "here" / f"{did}.json"
    local_target.reset()          # the install re-created: the release's files, no .sglpatch/ state
    assert not (local_target.site_packages / ".sglpatch").exists()

    for extra in ([], ["--patchset", "ddtree"]):
        code, out, err = run_cli(capsys, *h, "status", "--host", "here", *extra)
        assert code == 0, err
        assert str(local) in "".join(out.split()), out   # the path, wherever the console wrapped it
        out = " ".join(out.split())
        assert f"deployment {did} is active only in this machine's record" in out, out
        assert "the install it patched" in out and "was replaced (re-created or reinstalled)" in out, out
        assert "`sglpatch rollback --host here` marks that record superseded" in out, out
    code, data, _ = run_json(capsys, *h, "status", "--host", "here")
    assert data["overall"] == "pristine" and [r["id"] for r in data["lost_records"]] == [did], data
    assert data["lost_records"][0]["carried"] == [], data

    code, out, err = run_cli(capsys, *h, "rollback", "--host", "here")
    assert code == 0, out + err
    assert str(local) in "".join(out.split()), out
    out = " ".join(out.split())
    assert f"nothing to roll back — the install that deployment(s) {did} patched was replaced" in out, out
    assert "this machine's record of it," in out and "is now marked superseded" in out, out
    assert json.loads(local.read_text())["phase"] == "superseded"
    code, data, err = run_json(capsys, *h, "rollback", "--host", "here")   # a plain no-op from now on
    assert code == 0 and data["rolled_back"] == [] and data["superseded"] == {}, (data, err)
    assert run_json(capsys, *h, "rollback")[0] == 0                       # the host of the newest record
    code, data, _ = run_json(capsys, *h, "status", "--host", "here")
    assert code == 0 and data["lost_records"] == [] and data["overall"] == "pristine", data


def test_rollback_to_a_superseded_deployment_says_what_it_is_and_exits_0(capsys, tmp_path, sglpatch_home,
                                                                         local_target):
    """`rollback --to ID` of a deployment whose install was replaced said "no deployment" (exit 10).
    Now: unmarked yet, it is judged (no file carries its bytes), marked superseded and said; marked
    already, the record's reason and time are said, with the deployment active on the host now
    and what undoes it; exit 0 both times, as a plain rollback of a replaced install. An id only
    another host's records hold names that host (exit 10); an unknown id stays exit 10."""
    from sglang_patcher.inventory import Host

    hosts = write_hosts(tmp_path / "hosts.yaml", Host(name="here", transport="local", python=str(local_target)))
    h = ["--hosts", str(hosts)]
    code, data, err = run_json(capsys, *h, "apply", "ddtree", "--host", "here", "--yes")
    assert code == 0, err
    old = data["deployment_id"]
    local = sglpatch_home / "deployments" / "here" / f"{old}.json"
    local_target.reset()                      # the install replaced: its records went with it
    code, data, err = run_json(capsys, *h, "rollback", "--host", "here", "--to", old)
    assert code == 0 and data["rolled_back"] == [] and list(data["superseded"]) == [old], (data, err)
    assert json.loads(local.read_text())["phase"] == "superseded"
    code, data, err = run_json(capsys, *h, "apply", "ddtree", "--host", "here", "--yes")
    assert code == 0, err
    new = data["deployment_id"]
    code, out, err = run_cli(capsys, *h, "rollback", "--host", "here", "--to", old)
    assert code == 0, out + err
    assert str(local) in "".join(out.split()), out
    out = " ".join(out.split())
    assert f"nothing to roll back — deployment {old} was superseded" in out, out
    assert "was marked superseded at " in out and "the install it patched was replaced" in out, out
    assert f"active on the host now: {new}" in out and "`sglpatch rollback --host here` undoes the latest" in out
    code, data, _ = run_json(capsys, *h, "status", "--host", "here", "--patchset", "ddtree")
    assert data["overall"] == "patched", data            # the new deployment was left alone
    write_hosts(tmp_path / "hosts.yaml", Host(name="here", transport="local", python=str(local_target)),
                Host(name="twin", transport="local", python=str(local_target)))
    code, data, _ = run_json(capsys, *h, "rollback", "--host", "twin", "--to", old)
    assert code == 10 and "this machine's records name it as a deployment of here" in data["error"], data
    assert f"--host here --to {old}" in data["hint"], data
    code, data, _ = run_json(capsys, *h, "rollback", "--host", "here", "--to", "20990101T000000Z-nope")
    assert code == 10 and "no deployment 20990101T000000Z-nope on this host" in data["error"], data
    assert new in data["error"], data                    # the host's deployments are named


def test_rollback_of_files_already_back_to_their_originals_is_not_drift(capsys, tmp_path, sglpatch_home,
                                                                       local_target):
    from sglang_patcher.inventory import Host

    hosts = write_hosts(tmp_path / "hosts.yaml",
                        Host(name="here", transport="local", python=str(local_target)))
    h = ["--hosts", str(hosts)]
    site = local_target.site_packages
    record = record_hashes(site)
    assert run_json(capsys, *h, "apply", "ddtree@1", "--host", "here", "--yes")[0] == 0
    # someone restores one file to the release's bytes by hand (e.g. a reinstall)
    rel = "sglang/srt/speculative/spec_utils.py"
    local_target.reset()   # every sglang file back to pristine, the state dir removed...
    code, data, err = run_json(capsys, *h, "rollback", "--host", "here")
    # ...the records went with it: the install was replaced, nothing to roll back (its local record
    # is marked superseded; this was exit 10 for ever)
    assert code == 0 and len(data["superseded"]) == 1 and data["rolled_back"] == [], data
    assert run_json(capsys, *h, "apply", "ddtree@1", "--host", "here", "--yes")[0] == 0
    pristine = local_target.pristine / site.relative_to(local_target.venv) / rel
    (site / rel).write_bytes(pristine.read_bytes())
    code, data, err = run_json(capsys, *h, "rollback", "--host", "here")
    assert code == 0, data
    assert live_hash(site, rel) == record[rel]
    assert live_hash(site, "sglang/srt/speculative/spec_info.py") == record["sglang/srt/speculative/spec_info.py"]


def test_json_flag_is_accepted_after_the_subcommand_and_usage_errors_are_json(capsys, sglpatch_home):
    code, out, _ = run_cli(capsys, "status", "--json")
    assert code == 2
    data = json.loads(out)
    assert data["ok"] is False and "--host" in data["error"]

def test_json_success_documents_say_ok_true(capsys, tmp_path, sglpatch_home, monkeypatch):
    monkeypatch.chdir(tmp_path)
    other = tmp_path / "h.yaml"
    other.write_text("hosts:\n  box:\n    hostname: 127.0.0.1\n    python: /usr/bin/python3\n")
    code, out, _ = run_cli(capsys, "--json", "--hosts", str(other), "hosts")
    assert code == 0
    data = json.loads(out)
    assert data["ok"] is True and [h["name"] for h in data["hosts"]] == ["box"]


def test_hosts_option_is_accepted_after_the_subcommand(capsys, tmp_path, sglpatch_home, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no ./hosts.yaml: only the named file can give the host
    other = tmp_path / "other.yaml"
    other.write_text("hosts:\n  box:\n    hostname: 127.0.0.1\n    python: /usr/bin/python3\n")
    for args in (("hosts", "--hosts", str(other)), ("hosts", f"--hosts={other}"),
                 ("--json", "hosts", "--hosts", str(other))):
        code, out, err = run_cli(capsys, *args)
        assert code == 0, (args, err)
        assert "box" in out, args
    code, _, err = run_cli(capsys, "hosts", "--hosts", str(tmp_path / "missing.yaml"))
    assert code == 2 and "missing.yaml" in err and "before the" not in err


def test_hosts_without_an_inventory_lists_the_sandbox_and_a_directory_is_named(capsys, tmp_path,
                                                                              sglpatch_home, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("SGLPATCH_HOSTS", raising=False)
    code, data, _ = run_json(capsys, "hosts")
    assert code == 0 and [h["name"] for h in data["hosts"]] == ["sandbox"], data
    code, data, _ = run_json(capsys, "--hosts", str(tmp_path), "hosts")
    assert code == 2 and "is a directory" in data["error"], data
    (tmp_path / "hosts.yaml").write_text("hosts: [\n")  # a broken file is reported, not skipped
    code, data, _ = run_json(capsys, "hosts")
    assert code == 2 and "not valid YAML" in data["error"], data


def test_the_sandbox_not_built_yet_says_to_run_the_demo(capsys, tmp_path, sglpatch_home, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no hosts.yaml here: `sandbox` is the embedded default target
    code, _, err = run_cli(capsys, "status", "--host", "sandbox")
    assert code == 6, err
    assert "sglpatch demo" in err and "hosts.yaml" not in err


def test_patchset_refresh_refuses_an_unsupported_release_before_any_download(capsys, sglpatch_home):
    code, _, err = run_cli(capsys, "patchset", "refresh", "ddtree", "--sglang", "0.5.18")
    assert code == 3 and "0.5.18" in err and VERSION in err
    assert not any((sglpatch_home / "wheels").rglob("sglang-0.5.18*")), "nothing downloaded"


@pytest.mark.parametrize("args", [("hosts", "--hosts"), ("status", "--host", "sandbox", "--hosts")])
def test_hosts_option_without_a_file_says_it_needs_one(capsys, sglpatch_home, args):
    code, out, err = run_cli(capsys, *args)
    assert code == 2
    assert "'--hosts' requires an argument: the inventory file" in err
    assert "No such option" not in err and "Did you mean" not in err


@pytest.mark.parametrize("value,says", [("relhome", "must be an absolute path"), ("FILE", "is not a directory")])
def test_an_unusable_sglpatch_home_is_one_clear_error(capsys, tmp_path, monkeypatch, value, says):
    if value == "FILE":
        value = str(tmp_path / "a-file")
        Path(value).write_text("not a directory\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SGLPATCH_HOME", value)
    code, out, err = run_cli(capsys, "diff", "ddtree", "--sglang", "0.5.23")
    assert code == 2, err
    assert says in err and "SGLPATCH_HOME" in err and "Traceback" not in err
    left = sorted(p.name for p in tmp_path.iterdir())  # nothing written: no state dir anywhere here
    assert left == (["a-file"] if value.endswith("a-file") else [])


def test_output_that_cannot_be_written_is_one_clear_error(tmp_path, sglpatch_home):
    """stdout on a full device (/dev/full): one message on stderr, exit 1, no traceback — also
    with --json, whose error document cannot be written either."""
    import subprocess
    import sys

    if not os.path.exists("/dev/full"):
        pytest.skip("needs /dev/full")
    for extra in ([], ["--json"]):
        with open("/dev/full", "w") as full:
            p = subprocess.run([sys.executable, "-m", "sglang_patcher", *extra, "hosts"], stdout=full,
                               stderr=subprocess.PIPE, text=True, cwd=tmp_path, timeout=120)
        assert p.returncode == 1, p.stderr
        assert "No space left on device" in p.stderr and "Traceback" not in p.stderr, p.stderr


def test_hosts_with_an_empty_inventory_or_unused_tag_says_what_to_do(capsys, tmp_path, sglpatch_home, monkeypatch):
    """An empty hosts.yaml is allowed (exit 0, valid JSON) but not silent: stderr says it has no
    hosts and how to add one; a tag no host carries names the tags in use."""
    empty = tmp_path / "hosts.yaml"
    empty.write_text("")
    code, data, err = run_json(capsys, "--hosts", str(empty), "hosts")
    assert code == 0 and data == {"hosts": [], "ok": True}
    assert f"{empty}: no hosts" in err and "add one under `hosts:`" in err
    code, out, err = run_cli(capsys, "--hosts", str(empty), "hosts")
    assert code == 0 and "no hosts" in err
    repo_hosts = str(Path(__file__).resolve().parents[2] / "hosts.yaml")
    code, data, err = run_json(capsys, "--hosts", repo_hosts, "hosts", "--tag", "no-such-tag")
    assert code == 0 and data["hosts"] == [] and "no host is tagged 'no-such-tag'" in err and "tags in use" in err
    # no inventory at all (the embedded sandbox alone): an unused tag is said too (was: an empty table)
    from sglang_patcher.inventory import HOSTS_ENV
    nowhere = tmp_path / "nowhere"
    nowhere.mkdir()
    monkeypatch.chdir(nowhere)
    monkeypatch.delenv(HOSTS_ENV, raising=False)
    code, data, err = run_json(capsys, "hosts", "--tag", "no-such-tag")
    assert code == 0 and data["hosts"] == [], data
    assert "no host is tagged 'no-such-tag': there is no inventory, and the embedded sandbox's tags are sandbox" in err


def test_a_lost_host_backup_with_no_verified_source_restores_nothing_and_then_is_put_back(
        capsys, tmp_path, sglpatch_home, local_target):
    """A backup lost on the host whose original exists nowhere else (the file was edited by hand
    before a forced apply, so the wheel does not have it, and its local copy and the host's
    mirror are moved away): rollback refuses before touching any file (no half-restored install, no journal, no
    lock left), exit 10, naming the lost backup. With the local copy back, rollback puts it back on
    the host by itself (verified by the record's sha256) and completes, the hand edit restored."""
    import shutil

    from sglang_patcher.inventory import Host

    hosts = write_hosts(tmp_path / "hosts.yaml",
                        Host(name="here", transport="local", python=str(local_target)))
    h = ["--hosts", str(hosts)]
    sp = local_target.site_packages
    rel = "sglang/srt/speculative/spec_utils.py"
    target = sp / rel
    edited = target.read_bytes() + b"# a hand edit before the deploy\n"
    target.write_bytes(edited)
    assert run_json(capsys, *h, "apply", "ddtree", "--host", "here", "--yes", "--force")[0] == 0
    state = sp / ".sglpatch"
    did = next((state / "deployments").glob("*.json")).stem
    lost = state / "backups" / did / rel
    assert lost.read_bytes() == edited
    lost.unlink()
    # status names it before any rollback is tried (with and without a patchset to judge by)
    for extra in ([], ["--patchset", "ddtree"]):
        code, data, _ = run_json(capsys, *h, "status", "--host", "here", *extra)
        assert code == 0 and data["bad_backups"] == {did: {rel: str(lost)}}, data
        assert str(sglpatch_home / "backups" / "here" / did) in data["local_backups"][did], data
    code, out, _ = run_cli(capsys, *h, "status", "--host", "here")
    said = " ".join(out.split())   # wherever the console's width wrapped it
    assert f"deployment {did}: 1 backup(s) missing or damaged" in said and "rollback` puts them back" in said
    local_copy = sglpatch_home / "backups" / "here" / did / rel
    assert local_copy.read_bytes() == edited
    aside = tmp_path / "aside.py"
    shutil.move(local_copy, aside)
    mirror = sglpatch_home / "mirrors" / "here"
    assert (mirror / VERSION / "tree" / rel).read_bytes() == edited  # apply's snapshot holds it too
    shutil.move(mirror, tmp_path / "mirror-aside")
    other = "sglang/srt/speculative/spec_info.py"  # a release file: the wheel still has its original
    other_backup = state / "backups" / did / other
    original_other = other_backup.read_bytes()
    other_backup.unlink()
    (sglpatch_home / "backups" / "here" / did / other).unlink()
    before = {p: p.read_bytes() for p in (sp / "sglang").rglob("*.py")}
    code, data, _ = run_json(capsys, *h, "rollback", "--host", "here")
    assert code == 10, data
    assert str(lost) in data["error"] and "nothing was restored" in data["error"]
    assert str(other_backup) not in data["error"] and "1 other lost backup(s) were put back" in data["error"], data
    assert other_backup.read_bytes() == original_other, "the one that could be found is back on the host"
    assert f"no local copy of {rel} either" in data["hint"] and other not in data["hint"], data["hint"]
    assert {p: p.read_bytes() for p in (sp / "sglang").rglob("*.py")} == before, "nothing restored"
    assert not (state / "journal.json").exists() and not (state / "lock").exists() and not lost.exists()
    code, data, _ = run_json(capsys, *h, "status", "--host", "here")
    assert data["overall"] == "patched", data
    shutil.move(aside, local_copy)
    code, data, _ = run_json(capsys, *h, "rollback", "--host", "here")
    assert code == 0, data
    assert data["backups_put_back"] == {did: {rel: "local copies"}}, data  # the other was put back before
    assert target.read_bytes() == edited, "the original (the hand edit) is back"
    code, out, _ = run_cli(capsys, *h, "status", "--host", "here")
    assert code == 0 and "1 lost backup" not in out


def test_lost_host_backups_and_local_copies_are_put_back_from_the_release_wheel(capsys, tmp_path,
                                                                               sglpatch_home, local_target):
    """Every backup of a deployment gone from the host, every local copy and the host's mirror gone
    too: the originals were the release's files, so rollback takes them from the PyPI wheel (each checked
    against the record's sha256), puts them back on the host, and ends pristine."""
    import shutil

    from sglang_patcher.inventory import Host

    hosts = write_hosts(tmp_path / "hosts.yaml",
                        Host(name="here", transport="local", python=str(local_target)))
    h = ["--hosts", str(hosts)]
    assert run_json(capsys, *h, "apply", "ddtree", "--host", "here", "--yes")[0] == 0
    sp = local_target.site_packages
    did = next((sp / ".sglpatch" / "deployments").glob("*.json")).stem
    shutil.rmtree(sp / ".sglpatch" / "backups" / did)
    shutil.rmtree(sglpatch_home / "backups" / "here" / did)
    shutil.rmtree(sglpatch_home / "mirrors" / "here")  # apply's snapshot would serve them first
    code, data, _ = run_json(capsys, *h, "rollback", "--host", "here")
    assert code == 0, data
    got = data["backups_put_back"][did]
    assert got and set(got.values()) == {f"wheel sglang=={VERSION}"}, got
    record = record_hashes(sp)
    for rel in got:
        assert live_hash(sp, rel) == record[rel], rel
    code, data, _ = run_json(capsys, *h, "status", "--host", "here", "--patchset", "ddtree")
    assert data["overall"] == "pristine" and data["bad_backups"] == {}, data


def test_unwritable_local_records_stop_apply_and_rollback_before_the_host_changes(capsys, tmp_path,
                                                                                  sglpatch_home, local_target):
    """The local copies of records and backups are written after the host changes; when they
    cannot be (here: backups/HOST is a file), apply and rollback refuse first (exit 8, naming the
    directory) and the host is untouched — not pushed and left pending with a generic error."""
    from sglang_patcher.inventory import Host

    hosts = write_hosts(tmp_path / "hosts.yaml",
                        Host(name="here", transport="local", python=str(local_target)))
    h = ["--hosts", str(hosts)]
    sp = local_target.site_packages
    before = {p: p.read_bytes() for p in (sp / "sglang").rglob("*.py")}
    blocker = sglpatch_home / "backups" / "here"
    blocker.parent.mkdir(parents=True, exist_ok=True)
    blocker.write_text("not a directory")
    code, data, _ = run_json(capsys, *h, "apply", "ddtree", "--host", "here", "--yes")
    assert code == 8 and str(blocker) in data["error"] and "nothing was changed" in data["error"], data
    assert {p: p.read_bytes() for p in (sp / "sglang").rglob("*.py")} == before
    assert not (sp / ".sglpatch" / "journal.json").exists() and not (sp / ".sglpatch" / "lock").exists()
    assert run_json(capsys, *h, "apply", "ddtree", "--host", "here", "--dry-run")[0] == 0  # only looks
    blocker.unlink()
    assert run_json(capsys, *h, "apply", "ddtree", "--host", "here", "--yes")[0] == 0
    patched = {p: p.read_bytes() for p in (sp / "sglang").rglob("*.py")}
    rec_dir = sglpatch_home / "deployments" / "here"
    moved = rec_dir.with_name("here.moved")
    rec_dir.rename(moved)
    rec_dir.write_text("not a directory")
    code, data, _ = run_json(capsys, *h, "rollback", "--host", "here")
    assert code == 8 and str(rec_dir) in data["error"], data
    assert {p: p.read_bytes() for p in (sp / "sglang").rglob("*.py")} == patched
    rec_dir.unlink()
    moved.rename(rec_dir)
    assert run_json(capsys, *h, "rollback", "--host", "here")[0] == 0
    assert {p: p.read_bytes() for p in (sp / "sglang").rglob("*.py")} == before


def test_status_against_the_patchset_names_an_older_revision_whole(capsys, tmp_path, sglpatch_home, local_target):
    """Judged against ddtree (the newest revision), a host carrying r1 whole is 'older', every file
    at r1 — not 'mixed' with the files both revisions share credited to the newest; after the
    upgrade, 'patched'."""
    from sglang_patcher.inventory import Host
    from sglang_patcher.patchset import load_patchset

    newest = load_patchset("ddtree").revision
    assert newest >= 2

    hosts = write_hosts(tmp_path / "hosts.yaml",
                        Host(name="here", transport="local", python=str(local_target)))
    h = ["--hosts", str(hosts)]
    assert run_json(capsys, *h, "apply", "ddtree@1", "--host", "here", "--yes")[0] == 0
    code, data, _ = run_json(capsys, *h, "status", "--host", "here", "--patchset", "ddtree")
    assert code == 0 and data["overall"] == "older" and data["older_revision"] == 1, data["files"]
    assert {f["revision"] for f in data["files"] if f["state"] == "patched"} == {1}, data["files"]
    code, out, _ = run_cli(capsys, *h, "status", "--host", "here", "--patchset", "ddtree")
    assert f"older (r1 of ddtree; r{newest} is the newest" in out, out
    assert run_json(capsys, *h, "status", "--host", "here")[1]["overall"] == "patched"
    assert run_json(capsys, *h, "apply", "ddtree", "--host", "here", "--yes")[0] == 0
    code, data, _ = run_json(capsys, *h, "status", "--host", "here", "--patchset", "ddtree")
    assert data["overall"] == "patched", data   # every file at the newest, but one it no longer installs
    assert {f["revision"] for f in data["files"] if f["path"] not in data["retired"]} == {newest}, data
    assert all(f["state"] == "absent" for f in data["files"] if f["path"] in data["retired"]), data  # r1 had none


def test_declining_the_prompt_deploys_nothing_and_exits_1(capsys, tmp_path, sglpatch_home, local_target,
                                                          monkeypatch):
    """Answering no at 'Deploy to HOST?': the plan was shown once, nothing is written, stderr says
    so and the exit code is 1 (a script sees that nothing was deployed)."""
    import click

    from sglang_patcher.inventory import Host

    hosts = write_hosts(tmp_path / "hosts.yaml",
                        Host(name="here", transport="local", python=str(local_target)))
    sp = local_target.site_packages
    before = {p: p.read_bytes() for p in (sp / "sglang").rglob("*.py")}
    monkeypatch.setattr("sys.stdin.isatty", lambda: True)
    asked = []
    monkeypatch.setattr(click, "confirm", lambda text, **kw: asked.append(text) or False)
    code, out, err = run_cli(capsys, "--hosts", str(hosts), "apply", "ddtree", "--host", "here")
    assert code == 1 and asked == ["Deploy to here?"], (out, err)
    assert "not deployed: nothing was changed on here" in err
    assert out.count(" on here (sglang ") == 1 and "lines" in out, out  # the plan (its title), once
    assert {p: p.read_bytes() for p in (sp / "sglang").rglob("*.py")} == before
    assert not (sp / ".sglpatch" / "lock").exists()



@pytest.mark.parametrize("args,host", [
    (["apply", "ddtree", "--host", "gpu-7"], "gpu-7"),
    (["--hosts", "inv.yaml", "rollback", "--host=gpu-8"], "gpu-8"),
    (["--json", "apply", "ddtree"], "HOST"),
    (["diff", "ddtree", "--host", "gpu-7"], None),
    (["--hosts", "apply", "snapshot", "gpu-7"], None),  # an inventory file named "apply"
])
def test_interrupt_hint_names_the_host_and_only_for_apply_and_rollback(capsys, monkeypatch, args, host):
    """Ctrl-C (KeyboardInterrupt) anywhere in a command: exit 130, "Aborted."; apply and rollback
    point at the journal on the host the command line named, other commands change no host."""
    from sglang_patcher import cli as cli_module

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli_module.cli, "main", interrupted)
    code, out, err = run_cli(capsys, *args)
    assert code == 130 and err.startswith("Aborted.")
    if host is None:
        assert "hint" not in err and "journal" not in err
    else:
        assert f"sglpatch status --host {host}`" in err and f"rollback` on {host}" in err
        assert "--host HOST" not in err or host == "HOST"
    if "--json" in args:
        doc = json.loads(out)
        assert doc["exit_code"] == 130 and doc["type"] == "Aborted" and "journal" in doc["hint"]


def test_status_says_whether_a_lock_holder_is_gone(capsys, tmp_path, sglpatch_home, local_target):
    """A lock left by a killed sglpatch: status names the holder and says what happens next — a
    process of this machine that no longer runs is taken over by the next apply (which then
    succeeds); a holder on another machine needs --break-lock."""
    import socket
    import subprocess

    from sglang_patcher.deploy import make_holder
    from sglang_patcher.inventory import Host

    hosts = write_hosts(tmp_path / "hosts.yaml", Host(name="here", transport="local", python=str(local_target)))
    h = ["--hosts", str(hosts)]
    state = local_target.site_packages / ".sglpatch"
    state.mkdir(exist_ok=True)
    dead = subprocess.Popen(["true"])
    dead.wait()
    for holder, stale, words in (
            ({"host": socket.gethostname(), "pid": dead.pid}, True, "no longer runs on this machine"),
            ({"host": "elsewhere.example", "pid": 1}, False, "--break-lock")):
        (state / "lock").write_text(json.dumps({**make_holder("20261201T000000-dead"), **holder}))
        code, data, _ = run_json(capsys, *h, "status", "--host", "here")
        assert code == 0 and data["lock_stale"] is stale and data["lock"]["pid"] == holder["pid"], data
        code, out, _ = run_cli(capsys, *h, "status", "--host", "here")
        assert "locked by" in out and words in out, out
    code, data, _ = run_json(capsys, *h, "apply", "ddtree", "--host", "here", "--yes")
    assert code == 8 and "elsewhere.example" in data["error"] and "--break-lock" in data["hint"], data
    (state / "lock").write_text(json.dumps({**make_holder("20261201T000000-dead"),
                                           "host": socket.gethostname(), "pid": dead.pid}))
    code, data, _ = run_json(capsys, *h, "apply", "ddtree", "--host", "here", "--yes")
    assert code == 0, data
    assert not (state / "lock").exists()
    assert run_json(capsys, *h, "rollback", "--host", "here")[0] == 0


@pytest.mark.ssh
def test_break_lock_never_breaks_a_lock_whose_holder_still_runs(capsys, tmp_path, sglpatch_home, sshd,
                                                               sglang_target):
    """New-user run: the host lock's pid set to a live process, `rollback --break-lock` removed it
    and went ahead. --break-lock breaks only a lock whose holder is gone: a running holder is
    refused (exit 8) naming its pid, host and command and that it still runs, and what to do —
    by the client, and again by the agent on the host (asked directly). Once that process ends the
    lock is taken over without --break-lock; a lock whose pid now belongs to a process started
    after the lock was taken (pid reuse) is stale too."""
    import socket
    import subprocess

    from sglang_patcher.deploy import make_holder

    host = sshd.host_entry(sglang_target, name="gpu-test")
    h = ["--hosts", str(write_hosts(tmp_path / "hosts.yaml", host))]
    site = sglang_target.site_packages
    lock = site / ".sglpatch" / "lock"
    busy = subprocess.Popen(["sleep", "120"])
    try:
        holder = {**make_holder("20261201T000000Z-busy"), "host": socket.gethostname(), "pid": busy.pid}
        text = json.dumps(holder)
        patched = None
        for cmd in (["apply", "ddtree", "--host", "gpu-test", "--yes", "--break-lock"],
                    ["rollback", "--host", "gpu-test", "--break-lock"]):
            if patched is None:    # rollback: a deployment to roll back, then the busy lock again
                lock.parent.mkdir(exist_ok=True)
                os.chown(lock.parent, sshd.uid, sshd.gid)
            else:
                code, data, err = run_json(capsys, *h, "apply", "ddtree", "--host", "gpu-test", "--yes")
                assert code == 0, err
            patched = {p: live_hash(site, p) for p in run_json(capsys, "diff", "ddtree", "--sglang", VERSION)[1]["files"]}
            lock.write_text(text)
            os.chown(lock, sshd.uid, sshd.gid)
            code, data, err = run_json(capsys, *h, *cmd)
            assert code == 8 and data["type"] == "LockHeldError", (cmd, data, err)
            assert f"pid {busy.pid} (sleep 120), still runs on {socket.gethostname()}" in data["error"], data
            assert "--break-lock breaks only a lock whose holder no longer runs" in data["error"], data
            assert f"kill {busy.pid}" in data["hint"] and "wait" in data["hint"], data
            assert lock.read_text() == text, "the lock is kept"
            assert {p: live_hash(site, p) for p in patched} == patched, "nothing written"
            if cmd[0] == "apply":
                lock.unlink()
        code, out, _ = run_cli(capsys, *h, "status", "--host", "gpu-test")
        assert "still runs" in " ".join(out.split()), out

        # the agent on the host refuses too, when asked to break the lock directly
        from sglang_patcher.deploy import AgentLockHeldError
        from sglang_patcher.deploy.agent import agent_for
        from sglang_patcher.service import session
        with session(host) as (transport, info):
            agent = agent_for(transport, host, info)
            did = agent.history()["deployments"][-1]["id"]
            with pytest.raises(AgentLockHeldError) as ei:
                agent.rollback(did, {**make_holder(did), "pid": 1}, break_lock=True)
            assert ei.value.details.get("running") is True and "still runs" in ei.value.message, ei.value
            assert f"kill" in ei.value.hint, ei.value.hint
            with pytest.raises(AgentLockHeldError):
                agent.unlock({**make_holder(did), "pid": 1}, break_lock=True)
        assert lock.read_text() == text

        # a pid given to a process started after the lock was taken: that holder is gone
        lock.write_text(json.dumps({**holder, "started": "2020-01-01T00:00:00Z"}))
        code, data, err = run_json(capsys, *h, "status", "--host", "gpu-test")
        assert code == 0 and data["lock_stale"] is True and data["lock_running"] is False, data
        lock.write_text(text)
    finally:
        busy.kill()
        busy.wait()
    code, data, err = run_json(capsys, *h, "rollback", "--host", "gpu-test")   # gone: taken over by itself
    assert code == 0 and data["rolled_back"], (data, err)
    assert not lock.exists()


def test_status_of_a_host_without_records_judges_the_files_of_the_patchsets_for_its_release(
        capsys, tmp_path, sglpatch_home, local_target):
    """No sglpatch record on the host: status still decides by hashes, judging the files of every
    patchset that targets the release (here ddtree), and says so. A host patched whose records
    were lost reads "patched" (so `--expect pristine` fails), with what to do; a release no
    patchset supports reads "unknown" — never "pristine" with nothing checked."""
    import shutil
    from types import SimpleNamespace

    from sglang_patcher.deploy import StatusReport
    from sglang_patcher.inventory import Host
    from sglang_patcher.service_status import _status_without_records

    hosts = write_hosts(tmp_path / "hosts.yaml", Host(name="here", transport="local", python=str(local_target)))
    h = ["--hosts", str(hosts)]
    from sglang_patcher.patchset import load_patchset
    ps = load_patchset("ddtree")   # its files, and those only earlier revisions installed (r3's ddtree_kernels.py)
    touched = len(set(ps.touched_paths(VERSION)).union(*(h[VERSION] for h in ps.spec.history.values())))
    code, data, _ = run_json(capsys, *h, "status", "--host", "here")
    assert code == 0 and data["overall"] == "pristine" and len(data["files"]) == touched, data
    assert data["note"].startswith("no sglpatch deployment is recorded on this host; judged by the files of ddtree r"), data
    assert run_json(capsys, *h, "status", "--host", "here", "--expect", "pristine")[0] == 0
    code, data, _ = run_json(capsys, *h, "status", "--host", "here", "--patchset", "ddtree")
    assert data["note"] is None and len(data["files"]) == touched, data  # judged against the patchset: no note
    assert run_json(capsys, *h, "apply", "ddtree", "--host", "here", "--yes")[0] == 0
    shutil.move(local_target.site_packages / ".sglpatch", tmp_path / "records-aside")
    code, data, _ = run_json(capsys, *h, "status", "--host", "here", "--expect", "pristine")
    assert code == 1 and data["overall"] == "patched", data
    assert "no record of a deployment" in data["note"] and "rollback cannot undo" in data["note"], data["note"]
    shutil.move(tmp_path / "records-aside", local_target.site_packages / ".sglpatch")
    spec = local_target.site_packages / "sglang/srt/speculative/spec_info.py"
    patched = spec.read_bytes()
    assert run_json(capsys, *h, "rollback", "--host", "here")[0] == 0
    # a patched file copied in by hand on a host without records: apply takes it as it is (its
    # record does not name it), so after a rollback no record names it — it must still count
    shutil.rmtree(local_target.site_packages / ".sglpatch")
    spec.write_bytes(patched)
    assert run_json(capsys, *h, "apply", "ddtree", "--host", "here", "--yes")[0] == 0
    assert run_json(capsys, *h, "rollback", "--host", "here")[0] == 0
    code, data, _ = run_json(capsys, *h, "status", "--host", "here", "--expect", "pristine")
    assert code == 1 and data["overall"] == "mixed", data
    assert "sglang/srt/speculative/spec_info.py (patched ddtree r" in data["note"], data["note"]
    assert "no rollback will touch them" in data["note"], data["note"]
    bare = StatusReport(host="here", sglang_version="0.5.18", files=[], deployments=[], journal=None, lock=None)
    rep = _status_without_records(None, Host(name="here", transport="local", python=str(local_target)),
                                  SimpleNamespace(sglang_version="0.5.18"), bare)
    assert rep.overall == "unknown" and rep.note == (
        "no sglpatch deployment is recorded on this host and no patchset here supports sglang 0.5.18, so no "
        f"file was checked (supported: ddtree ({', '.join(ps.versions)}))"), rep.note


def test_status_expect_turns_the_state_into_the_exit_code(capsys, tmp_path, sglpatch_home, local_target):
    """--expect STATE: exit 0 when the host is in it, else 1 with the report printed as usual
    (one JSON document with ok false); without --expect status exits 0 whatever the state."""
    from sglang_patcher.inventory import Host

    hosts = write_hosts(tmp_path / "hosts.yaml", Host(name="here", transport="local", python=str(local_target)))
    h = ["--hosts", str(hosts), "status", "--host", "here", "--patchset", "ddtree"]
    code, data, _ = run_json(capsys, *h, "--expect", "patched")
    assert code == 1 and data["ok"] is False and data["overall"] == "pristine" and data["expected"] == "patched", data
    assert data["error"] == "here is pristine, not patched (--expect)" and data["exit_code"] == 1, data
    assert data["type"] == "ExpectationFailed" and data["hint"], data
    code, out, err = run_cli(capsys, *h, "--expect", "patched")
    assert code == 1 and "here is pristine, not patched (--expect)" in err and "pristine" in out
    assert run_json(capsys, *h, "--expect", "pristine")[0] == 0
    assert run_json(capsys, "--hosts", str(hosts), "apply", "ddtree", "--host", "here", "--yes")[0] == 0
    code, data, _ = run_json(capsys, *h, "--expect", "patched")
    assert code == 0 and data["ok"] is True, data
    assert run_json(capsys, *h)[0] == 0
    code, _, err = run_cli(capsys, *h, "--expect", "bogus")
    assert code == 2 and "pristine" in err and "patched" in err  # the choices are listed
    assert run_json(capsys, "--hosts", str(hosts), "rollback", "--host", "here")[0] == 0



def test_prune_on_a_host_never_deployed_is_nothing_to_prune_not_a_lock_error(capsys, tmp_path, sglpatch_home,
                                                                             local_target, sshd, sglang_target):
    """A fresh user's `sglpatch prune --host H` on a host never deployed said it could not take the
    lock in the state dir (owned by ?) and to set `sudo: true` (exit 8): the state dir does not
    exist. Nothing to prune, exit 0, over the local transport and over SSH; nothing is created."""
    from sglang_patcher.inventory import Host

    hosts = write_hosts(tmp_path / "hosts.yaml", Host(name="here", transport="local", python=str(local_target)),
                        sshd.host_entry(sglang_target, name="gpu-test"))
    for name, site in (("here", local_target.site_packages), ("gpu-test", sglang_target.site_packages)):
        code, out, err = run_cli(capsys, "--hosts", str(hosts), "prune", "--host", name)
        out = " ".join(out.split())
        assert code == 0, out + err
        assert f"{name}: nothing to prune — no sglpatch deployment is recorded on this host" in out, out
        assert "sudo" not in out + err and "lock" not in out + err, out + err
        code, data, err = run_json(capsys, "--hosts", str(hosts), "prune", "--host", name, "--keep", "0")
        assert code == 0 and data["pruned"] == [] and data["recorded"] == 0, (data, err)
        assert not (site / ".sglpatch").exists(), "prune created the host's state dir"


def test_prune_under_a_held_lock_says_nothing_to_prune_and_refuses_only_what_it_would_delete(
        capsys, tmp_path, sglpatch_home, local_target):
    """prune asked for the host's lock before it knew whether there was anything to delete: a held
    lock refused even "nothing to prune" (exit 8). Now, with a live process holding the lock,
    nothing to prune is said (exit 0); with backups to delete it is refused (exit 8) naming the
    deployment and the holder, and nothing is deleted."""
    import socket

    from sglang_patcher.inventory import Host

    hosts = write_hosts(tmp_path / "hosts.yaml", Host(name="here", transport="local", python=str(local_target)))
    h = ["--hosts", str(hosts)]
    for _ in range(2):
        assert run_json(capsys, *h, "apply", "ddtree", "--host", "here", "--yes")[0] == 0
        assert run_json(capsys, *h, "rollback", "--host", "here")[0] == 0
    lock = local_target.site_packages / ".sglpatch" / "lock"
    holder = {"user": "someone", "pid": os.getpid(), "host": socket.gethostname(), "started": "2026-01-01T00:00:00Z",
              "deployment": "20260101T000000Z-ddtree-r5-abcdef", "token": "another-run"}   # a live process
    lock.write_text(json.dumps(holder))
    backups = sorted((local_target.site_packages / ".sglpatch" / "backups").iterdir())
    code, out, err = run_cli(capsys, *h, "prune", "--host", "here", "--keep", "2")
    assert code == 0 and "here: nothing to prune" in " ".join(out.split()), out + err
    code, data, _ = run_json(capsys, *h, "prune", "--host", "here", "--keep", "1")
    assert code == 8 and data["type"] == "LockHeldError", data
    assert "cannot prune the backups of 1 rolled-back deployment(s)" in data["error"], data
    assert "someone@" in data["error"] and "nothing was deleted" in data["error"] and "--break-lock" in data["hint"]
    assert sorted((local_target.site_packages / ".sglpatch" / "backups").iterdir()) == backups
    assert json.loads(lock.read_text())["token"] == "another-run"     # the lock is the holder's still
    lock.unlink()
    code, data, _ = run_json(capsys, *h, "prune", "--host", "here", "--keep", "1")
    assert code == 0 and len(data["pruned"]) == 1, data


def test_prune_deletes_this_machines_backup_copies_of_superseded_deployments(capsys, tmp_path, sglpatch_home,
                                                                              local_target):
    """The local backup copies of a deployment whose install was replaced (record superseded) were
    never deleted. rollback now points at them and prune deletes them, whatever --keep says,
    listing each (dry run: would delete); the record stays, superseded, marked backups_pruned. An
    active deployment's local copies stay."""
    from sglang_patcher.inventory import Host

    hosts = write_hosts(tmp_path / "hosts.yaml", Host(name="here", transport="local", python=str(local_target)))
    h = ["--hosts", str(hosts)]
    code, data, err = run_json(capsys, *h, "apply", "ddtree", "--host", "here", "--yes")
    assert code == 0, err
    old = data["deployment_id"]
    copies = sglpatch_home / "backups" / "here" / old
    assert any(f.is_file() for f in copies.rglob("*")), "apply keeps local backup copies"
    local_target.reset()                                   # the install replaced
    code, out, err = run_cli(capsys, *h, "rollback", "--host", "here")
    assert code == 0, out + err
    assert str(copies) in "".join(out.split()) and "`sglpatch prune --host here` deletes them" in " ".join(out.split())
    code, data, err = run_json(capsys, *h, "apply", "ddtree", "--host", "here", "--yes")
    assert code == 0, err
    active = sglpatch_home / "backups" / "here" / data["deployment_id"]
    assert active.is_dir()

    code, out, err = run_cli(capsys, *h, "prune", "--host", "here", "--keep", "5", "--dry-run")
    said = " ".join(out.split())
    assert code == 0 and "would delete" in said and "superseded deployment(s)" in said, out + err
    assert str(copies) in "".join(out.split()) and copies.is_dir()
    code, data, err = run_json(capsys, *h, "prune", "--host", "here", "--keep", "5")
    assert code == 0 and data["pruned"] == [], (data, err)           # nothing rolled back on the host
    assert [g["id"] for g in data["superseded"]] == [old] and data["superseded"][0]["dir"] == str(copies), data
    size = sum(f.stat().st_size for f in active.rglob("*") if f.is_file())   # the same originals
    assert data["local_freed_bytes"] == data["superseded"][0]["bytes"] == size, data
    assert not copies.exists() and active.is_dir()
    rec = json.loads((sglpatch_home / "deployments" / "here" / f"{old}.json").read_text())
    assert rec["phase"] == "superseded" and rec["backups_pruned"], rec
    code, out, _ = run_cli(capsys, *h, "prune", "--host", "here")
    assert code == 0 and "nothing to prune" in out and "superseded" not in out, out
    assert run_json(capsys, *h, "rollback", "--host", "here")[0] == 0    # the active one is untouched


def test_prune_frees_the_backups_of_rolled_back_deployments(capsys, tmp_path, sglpatch_home, local_target):
    from sglang_patcher.inventory import Host

    hosts = write_hosts(tmp_path / "hosts.yaml", Host(name="here", transport="local", python=str(local_target)))
    h = ["--hosts", str(hosts)]
    for _ in range(2):
        assert run_json(capsys, *h, "apply", "ddtree", "--host", "here", "--yes")[0] == 0
        assert run_json(capsys, *h, "rollback", "--host", "here")[0] == 0
    code, out, _ = run_cli(capsys, *h, "prune", "--host", "here", "--keep", "1", "--dry-run")
    out = " ".join(out.split())
    assert code == 0 and "would free" in out and "the backups of 1 rolled-back deployment(s)" in out, out
    code, data, _ = run_json(capsys, *h, "prune", "--host", "here", "--keep", "1")
    assert code == 0 and len(data["pruned"]) == 1 and data["freed_bytes"] > 0 and not data["dry_run"], data
    assert not any(os.path.exists(d) for d in data["pruned"][0]["dirs"])
    code, out, _ = run_cli(capsys, *h, "prune", "--host", "here", "--keep", "1")
    assert code == 0 and "nothing to prune" in out
    # a new user's finding: after `--keep 0`, a later prune listed the deleted backups as kept
    kept_id = data["kept"][0]
    code, data, _ = run_json(capsys, *h, "prune", "--host", "here", "--keep", "0")
    assert code == 0 and [p["id"] for p in data["pruned"]] == [kept_id] and data["kept"] == [], data
    code, data, _ = run_json(capsys, *h, "prune", "--host", "here")
    assert code == 0 and data["pruned"] == [] and data["kept"] == [], data
    code, _, err = run_cli(capsys, *h, "prune", "--host", "here", "--keep", "-1")
    assert code == 2 and "--keep" in err


def test_prune_deletes_a_backup_folder_a_failed_push_left_that_no_record_names(capsys, tmp_path, sglpatch_home,
                                                                               local_target):
    """A failed push of an earlier sglpatch restored the host but left its backups under
    .sglpatch/backups/<id>/ with no record naming them: `prune` (any --keep) deletes such a folder
    when the host holds every byte of it elsewhere, and says so; a dry run only names it."""
    from sglang_patcher.inventory import Host

    h = ["--hosts", str(write_hosts(tmp_path / "hosts.yaml", Host(name="here", transport="local",
                                                                     python=str(local_target))))]
    site = local_target.site_packages
    spec = "sglang/srt/speculative/spec_info.py"
    left = site / ".sglpatch" / "backups" / "20250101T000000Z-ddtree-r5-0a0a0a"
    (left / spec).parent.mkdir(parents=True)
    (left / spec).write_bytes((site / spec).read_bytes())
    code, out, _ = run_cli(capsys, *h, "prune", "--host", "here", "--keep", "3", "--dry-run")
    out = " ".join(out.split())
    assert code == 0 and "would free" in out and "1 backup(s) no deployment record names" in out, out
    assert f"{left.name}: " in out and "would delete" in out and left.is_dir(), out
    code, data, _ = run_json(capsys, *h, "prune", "--host", "here", "--keep", "3")
    assert code == 0 and [o["id"] for o in data["orphans"]] == [left.name] and data["freed_bytes"] > 0, data
    assert data["orphans"][0]["files"] == [spec] and not left.exists()
    code, out, _ = run_cli(capsys, *h, "prune", "--host", "here")
    assert code == 0 and "nothing to prune" in out, out


def test_apply_refuses_a_partial_port_target_and_writes_nothing(capsys, tmp_path, sglpatch_home, local_target):
    """A target that `patchset port --partial` wrote (``left_out`` listed) is refused by apply
    (exit 3) naming patchset.yaml, the target and the change; deleting the list lets it through."""
    import shutil

    from sglang_patcher.inventory import Host
    from sglang_patcher.patchset import available_patchsets

    copy = tmp_path / "ddtree-ported"
    shutil.copytree(available_patchsets()["ddtree"], copy, ignore=shutil.ignore_patterns("history"))
    doc_path = copy / "patchset.yaml"
    doc = yaml.safe_load(doc_path.read_text())
    doc["name"] = "ddtree-ported"                 # another patchset, not an edited ddtree r<N>
    doc.pop("history", None)
    doc.pop("withdrawn", None)
    change = "sglang-0.5.23/0004-ddtree-validation.patch: sglang/srt/server_args.py hunk 2 (conflict)"
    doc["targets"]["0.5.23"]["left_out"] = [change]
    doc_path.write_text(yaml.safe_dump(doc, sort_keys=False))
    hosts = write_hosts(tmp_path / "hosts.yaml", Host(name="here", transport="local", python=str(local_target)))
    site = local_target.site_packages

    def tree() -> dict[str, str]:
        return {str(f): hashlib.sha256(f.read_bytes()).hexdigest() for f in (site / "sglang").rglob("*.py")}
    before = tree()
    code, data, err = run_json(capsys, "--hosts", str(hosts), "apply", str(copy), "--host", "here", "--yes")
    assert code == 3 and data["exit_code"] == 3, err
    assert str(doc_path) in data["error"] and "partial port" in data["error"] and change in data["error"], data
    assert "targets.0.5.23.left_out" in data["hint"], data
    assert tree() == before, "a refused apply writes nothing"
    assert not any((site / ".sglpatch").rglob("*.json")), "no deployment record"
    del doc["targets"]["0.5.23"]["left_out"]
    doc_path.write_text(yaml.safe_dump(doc, sort_keys=False))
    code, data, err = run_json(capsys, "--hosts", str(hosts), "apply", str(copy), "--host", "here", "--yes")
    assert code == 0 and data["status"] == "applied", err
