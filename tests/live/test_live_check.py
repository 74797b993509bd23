"""``sglpatch check`` and ``apply --gate`` end to end: a real sshd on loopback, a host venv holding
the CPU SGLang server environment, the tiny model fixtures, real ``launch_server`` processes.

The sglpatch CLI runs as a subprocess (as a user runs it), so Ctrl-C and a killed client are real
signals. After every test no server that sglpatch started may still run on the host.
"""

from __future__ import annotations

import json
import signal
import socket
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from tests.live.test_live_negative_controls import FAULTS, inject
from tests.support import venvs
from tests.support.live_sglang import ModelFixture, free_port
from tests.support.live_ssh import SshHost, cpu_serve_profile, port_range, ssh_venv


def _prompts(tmp_path: Path, fx: ModelFixture, n: int = 2) -> Path:
    p = tmp_path / "prompts.json"
    p.write_text(json.dumps(list(fx.prompts[1:1 + n])))
    return p


def _doc(proc: subprocess.CompletedProcess[str]) -> dict:
    return json.loads(proc.stdout)


def test_check_level_3_passes_on_the_patched_host(host: SshHost, live_models, tmp_path: Path) -> None:
    proc = host.run("check", "--host", host.name, "--level", "3", "--json",
                    "--prompts", str(_prompts(tmp_path, live_models["trained"])))
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    doc = _doc(proc)
    status = {(c["level"], c["name"]): c["status"] for c in doc["checks"]}
    assert doc["passed"] and doc["level"] == 3, status
    assert status[("L2", "server start (DDTREE)")] == "passed"
    assert status[("L3", "DFLASH tokens equal the target's")] == "passed"
    assert status[("L3", "DDTREE tokens equal the target's")] == "passed"
    assert any(c["level"] == "L1" and c["status"] == "passed" for c in doc["checks"])
    # a serving install has SGLang's model stack: L1's checks that import it run (not skipped) there
    assert status[("L1", "other verify widths run eagerly beside the CUDA graphs")] == "passed", status
    assert status[("L1", "KV reservation is block + max(block, budget + 1)")] == "passed", status
    arms = {a["algorithm"]: a for a in doc["arms"]}
    assert set(arms) == {"none", "DFLASH", "DDTREE"}
    assert all(a and a >= 1.0 for a in arms["DDTREE"]["accept_lengths"]), arms["DDTREE"]
    assert arms["DDTREE"]["output_ids"] == arms["none"]["output_ids"]


def test_check_level_3_fails_when_ddtree_gives_other_tokens(host: SshHost, live_models, tmp_path: Path) -> None:
    """Negative control: a wrong accept rule injected into the host's installed module."""
    fault = FAULTS["walk-off-by-one"]
    module = host.venv.site_packages / "sglang" / "srt" / "speculative" / fault.module
    original = module.read_bytes()
    try:
        inject(host.venv.venv, fault)
        proc = host.run("check", "--host", host.name, "--level", "3", "--json",
                        "--prompts", str(_prompts(tmp_path, live_models["trained"])))
    finally:
        module.write_bytes(original)
        for pyc in (module.parent / "__pycache__").glob(f"{module.stem}.*.pyc"):
            pyc.unlink()
    assert proc.returncode == 9, proc.stdout[-3000:]
    doc = _doc(proc)
    status = {c["name"]: c["status"] for c in doc["checks"] if c["level"] == "L3"}
    assert status["DDTREE tokens equal the target's"] == "failed", status
    assert status["DFLASH tokens equal the target's"] == "passed", status
    assert doc["ok"] is False and doc["exit_code"] == 9 and "DDTREE" in doc["error"]


def _not_a_model() -> str:
    """An empty directory the SSH user can read: a model path that exists (sglpatch's own check
    passes) but from which the server cannot start."""
    d = tempfile.mkdtemp(prefix="sglpatch-not-a-model-", dir="/tmp")
    Path(d).chmod(0o755)
    return d


def test_a_server_that_cannot_start_fails_l2_with_its_log(host: SshHost, live_models) -> None:
    bad = _not_a_model()
    try:
        host.write(cpu_serve_profile(live_models["random"], free_port(), model=bad))
        proc = host.run("check", "--host", host.name, "--level", "2", "--json")
    finally:
        shutil.rmtree(bad, ignore_errors=True)
    assert proc.returncode == 9, proc.stdout[-3000:]
    (l2,) = [c for c in _doc(proc)["checks"] if c["level"] == "L2"]
    assert l2["status"] == "failed" and "exited before it was ready" in l2["detail"], l2
    assert "server log" in l2["detail"] and bad in l2["detail"], l2["detail"][-2000:]


def test_a_model_path_missing_on_the_host_is_said_before_any_server(host: SshHost, live_models) -> None:
    host.write(cpu_serve_profile(live_models["random"], free_port(), model="/nonexistent/model"))
    proc = host.run("check", "--host", host.name, "--level", "2", "--json")
    assert proc.returncode == 2, proc.stdout[-3000:]
    doc = _doc(proc)
    assert "serve.model /nonexistent/model does not exist" in doc["error"], doc
    assert not host.running()


def test_a_port_in_use_is_named(host: SshHost, live_models) -> None:
    port = free_port()
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("0.0.0.0", port))
        s.listen()
        host.write(cpu_serve_profile(live_models["random"], port))
        proc = host.run("check", "--host", host.name, "--level", "2", "--json")
    assert proc.returncode == 9, proc.stdout[-3000:]
    (l2,) = [c for c in _doc(proc)["checks"] if c["level"] == "L2"]
    assert f"port {port} in use" in l2["detail"], l2


def test_ctrl_c_during_l2_stops_the_server(host: SshHost, live_models) -> None:
    host.write(cpu_serve_profile(live_models["random"], port_range(5)))
    before = host.records()
    client = host.popen("check", "--host", host.name, "--level", "2")
    rec = host.wait_for_record(before)
    time.sleep(3)                                  # the server is loading
    client.send_signal(signal.SIGINT)
    out, err = client.communicate(timeout=180)
    assert client.returncode == 130, (out + err)[-3000:]
    assert not host.running(), f"server {rec['name']} still runs after Ctrl-C"


def test_a_leftover_server_is_named_then_stopped(host: SshHost, live_models) -> None:
    host.write(cpu_serve_profile(live_models["random"], port_range(5)))
    before = host.records()
    client = host.popen("check", "--host", host.name, "--level", "2")
    rec = host.wait_for_record(before)
    client.kill()                                  # the client dies without stopping anything
    client.communicate(timeout=60)
    assert host.running(), "the server should outlive a killed client (a leftover)"
    proc = host.run("check", "--host", host.name, "--level", "2", "--json")
    assert proc.returncode == 9, proc.stdout[-3000:]
    detail = " ".join(c["detail"] for c in _doc(proc)["checks"] if c["level"] == "L2")
    assert rec["name"] in detail and "still runs" in detail and "--stop-leftovers" in detail, detail
    proc = host.run("check", "--host", host.name, "--level", "2", "--stop-leftovers", "--json")
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert not host.running()


def test_a_failed_gate_rolls_the_deployment_back(sshd, live_pristine, live_models, tmp_path_factory) -> None:
    venv = ssh_venv(sshd, live_pristine, tmp_path_factory, "live-gate")
    h = SshHost(sshd, venv, tmp_path_factory.mktemp("live-gate"), "live-gate")
    try:
        bad = _not_a_model()
        h.write(cpu_serve_profile(live_models["random"], free_port(), model=bad))
        proc = h.run("apply", "ddtree", "--host", h.name, "--yes", "--gate", "check:2")
        shutil.rmtree(bad, ignore_errors=True)
        assert proc.returncode == 9, proc.stdout[-3000:] + proc.stderr[-3000:]
        assert "gate check:2 failed" in proc.stderr and "rolled back" in proc.stderr, proc.stderr[-3000:]
        status = h.run("status", "--host", h.name, "--json")
        assert _doc(status)["overall"] == "pristine", status.stdout[-2000:]
        assert not h.running()
    finally:
        h.kill_all()
        venvs.remove_venv(venv.venv, background=True)
