"""README command 1's main job (`sglpatch demo`) on the embedded default target, for real:
a local venv with the sglang 0.5.23 wheel from PyPI, the ddtree patchset applied and rolled back."""

from __future__ import annotations

import hashlib
import json

import pytest

from sglang_patcher.cli import main
from sglang_patcher.sandbox import sandbox_dir

pytestmark = [pytest.mark.sglang, pytest.mark.slow]


def test_demo_tells_the_whole_story_and_leaves_the_sandbox_pristine(capsys, sglpatch_home):
    code = main(["demo"])
    out, err = capsys.readouterr()
    assert code == 0, out + err
    for step in ("snapshot", "diff", "apply", "status", "apply again", "rollback",
                 "done: applied, verified, and rolled back to pristine"):
        assert step in out, step
    assert "DDTREE" in out

    # the sandbox is back to the wheel's RECORD
    site = next(sandbox_dir().glob("lib/python3*/site-packages"))
    rel = "sglang/srt/speculative/spec_info.py"
    record = next(site.glob("sglang-*.dist-info")).joinpath("RECORD").read_text()
    line = next(l for l in record.splitlines() if l.startswith(rel + ","))
    import base64
    want = base64.urlsafe_b64decode(line.split(",")[1][7:] + "==").hex()
    assert hashlib.sha256((site / rel).read_bytes()).hexdigest() == want

    # a second run reuses the sandbox and ends the same way; --json gives one document
    code = main(["--json", "demo"])
    out, err = capsys.readouterr()
    assert code == 0, err
    data = json.loads(out)
    assert data["apply"]["status"] == "applied"
    assert data["reapply"]["status"] == "already_applied"
    assert data["sandbox_before"] == "pristine" and "already carries" not in err

    # a deployment of the user's own on the sandbox (here r1): the demo refuses before any step
    # changes it, and says how to clear it
    assert main(["apply", "ddtree@1", "--host", "sandbox", "--yes"]) == 0
    before = hashlib.sha256((site / rel).read_bytes()).hexdigest()
    capsys.readouterr()
    code = main(["demo"])
    out, err = capsys.readouterr()
    assert code == 8, out + err
    assert "sandbox: carries" in err and "sglpatch rollback --host sandbox" in err
    assert hashlib.sha256((site / rel).read_bytes()).hexdigest() == before
    assert main(["rollback", "--host", "sandbox"]) == 0
    assert hashlib.sha256((site / rel).read_bytes()).hexdigest() == want

    # a file edited by hand, no deployment behind it: named, and the hint is the rebuild (a
    # rollback has nothing to take off)
    (site / rel).write_bytes((site / rel).read_bytes() + b"# hand edit\n")
    capsys.readouterr()
    code = main(["demo"])
    out, err = capsys.readouterr()
    err = " ".join(err.split())
    assert code == 8 and rel in err and "edited by hand" in err and "rollback" not in err, err
    assert f"delete {sandbox_dir()}" in err


def test_a_demo_that_builds_its_sandbox_again_retires_the_records_of_the_patched_one(capsys, sglpatch_home):
    """A fresh user applied ddtree to the sandbox, then ran `sglpatch demo --with-deps`: the demo
    deleted the patched venv and built it again, the local record still said "active", and every
    `sglpatch rollback` failed (exit 10) from then on. The rebuild now marks that record superseded
    and says so, the demo runs through, and rollback has nothing to do (exit 0). The rebuild is
    forced here as --with-deps (or another --sglang) forces it: the venv's marker names another
    build than the one asked for."""
    from sglang_patcher.sandbox import ensure_sandbox

    ensure_sandbox(log=lambda line: None)
    capsys.readouterr()
    code = main(["--json", "apply", "ddtree", "--host", "sandbox", "--yes"])
    out, err = capsys.readouterr()
    assert code == 0, err
    did = json.loads(out)["deployment_id"]
    local = sglpatch_home / "deployments" / "sandbox" / f"{did}.json"
    (sandbox_dir() / ".sglpatch-ready").write_text("0.5.23 (another build)\n")

    code = main(["demo"])
    out, err = capsys.readouterr()
    assert code == 0, out + err
    said = " ".join(out.split())
    assert f"the install that deployment(s) {did} patched is gone" in said, said[:3000]
    assert "marked superseded, not active — nothing to roll back" in said, said[:3000]
    rec = json.loads(local.read_text())
    assert rec["phase"] == "superseded" and rec["superseded"]["phase"] == "verified", rec
    code = main(["rollback"])           # the host of the newest local record: the sandbox
    out, err = capsys.readouterr()
    assert code == 0 and "nothing to roll back" in out, out + err
