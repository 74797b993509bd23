"""``sglpatch check`` and ``apply --gate`` end to end: a real sshd on loopback, a host venv holding
the CPU SGLang server environment, the tiny model fixtures, real ``launch_server`` processes.

The sglpatch CLI runs as a subprocess (as a user runs it), so Ctrl-C and a killed client are real
signals. After every test no server that sglpatch started may still run on the host.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.live.test_live_negative_controls import FAULTS, inject
from tests.support import live_env, venvs
from tests.support.live_sglang import ModelFixture, free_port

REPO = Path(__file__).resolve().parents[2]


def cpu_serve_profile(fx: ModelFixture, port: int | str, **over: object) -> dict:
    """The serve profile of a CPU test host (the platform plugin's environment and flags)."""
    args: list[str] = []
    for key, value in live_env.CPU_ENGINE_ARGS.items():
        flag = "--" + key.replace("_", "-")
        args += [flag] if value is True else [flag, str(value)]
    profile = {"model": str(fx.target), "draft_model": str(fx.drafts[4]), "port": port,
               "env": dict(live_env.PLATFORM_ENV), "start_timeout": 600,
               "args": args + ["--speculative-draft-attention-backend", "triton"],
               "ddtree": {"budget": 8}, "max_new_tokens": 12}
    profile.update(over)
    return profile


class SshHost:
    """One inventory host reaching a working copy of the live venv over the real sshd."""

    def __init__(self, sshd, venv: venvs.TargetVenv, where: Path, name: str) -> None:
        self.sshd, self.venv, self.name = sshd, venv, name
        self.home = where / "sglpatch-home"
        self.home.mkdir(parents=True, exist_ok=True)
        self.hosts = where / "hosts.yaml"

    def write(self, serve: dict) -> None:
        entry = self.sshd.host_entry(self.venv, name=self.name).model_dump(exclude_none=True, exclude={"name"})
        entry["serve"] = serve
        self.hosts.write_text(yaml.safe_dump({"hosts": {self.name: entry}}))

    def env(self) -> dict[str, str]:
        return dict(os.environ, SGLPATCH_HOME=str(self.home), SGLPATCH_HOSTS=str(self.hosts))

    def run(self, *args: str, timeout: float = 1500) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "sglang_patcher", *args], capture_output=True,
                              text=True, env=self.env(), timeout=timeout, cwd=REPO)

    def popen(self, *args: str) -> subprocess.Popen[str]:
        return subprocess.Popen([sys.executable, "-m", "sglang_patcher", *args], stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, env=self.env(), cwd=REPO)

    @property
    def servers_dir(self) -> Path:
        return self.venv.site_packages / ".sglpatch" / "servers"

    def records(self) -> list[dict]:
        return [json.loads(p.read_text()) for p in sorted(self.servers_dir.glob("*.json"))]

    def running(self) -> list[dict]:
        out = []
        for rec in self.records():
            try:
                os.killpg(int(rec["pgid"]), 0)
                out.append(rec)
            except ProcessLookupError:
                pass
        return out

    def wait_for_record(self, timeout: float = 120) -> dict:
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            recs = self.records()
            if recs:
                return recs[0]
            time.sleep(0.5)
        raise AssertionError(f"no server record appeared in {self.servers_dir}")

    def kill_all(self) -> None:
        for rec in self.running():
            try:
                os.killpg(int(rec["pgid"]), signal.SIGKILL)
            except ProcessLookupError:
                pass


def _ssh_venv(sshd, pristine: Path, tmp_path_factory, name: str) -> venvs.TargetVenv:
    parent = sshd.home / "venvs" if os.geteuid() == 0 else tmp_path_factory.mktemp(f"ssh-{name}")
    parent.mkdir(parents=True, exist_ok=True)
    if os.geteuid() == 0:
        os.chown(parent, sshd.uid, sshd.gid)
    return venvs.clone_venv(pristine, parent / f"{name}-{os.getpid()}", sshd.uid, sshd.gid, share_deps=True)


@pytest.fixture(scope="module")
def patched_ssh_host(sshd, live_pristine, live_models, tmp_path_factory) -> SshHost:
    """An SSH host whose live venv carries ddtree (applied over SSH by the CLI)."""
    venv = _ssh_venv(sshd, live_pristine, tmp_path_factory, "live-check")
    h = SshHost(sshd, venv, tmp_path_factory.mktemp("live-check"), "live-ssh")
    h.write(cpu_serve_profile(live_models["trained"], f"{free_port()}-{free_port() + 20}"))
    applied = h.run("apply", "ddtree", "--host", h.name, "--yes", "--json")
    assert applied.returncode == 0, applied.stdout[-3000:] + applied.stderr[-3000:]
    yield h
    h.kill_all()
    venvs.remove_venv(venv.venv, background=True)


@pytest.fixture
def host(patched_ssh_host: SshHost, live_models) -> SshHost:
    patched_ssh_host.write(cpu_serve_profile(live_models["trained"], f"{free_port()}-{free_port() + 20}"))
    yield patched_ssh_host
    left = patched_ssh_host.running()
    patched_ssh_host.kill_all()
    assert not left, f"sglpatch left servers running on the host: {left}"


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


def test_a_server_that_cannot_start_fails_l2_with_its_log(host: SshHost, live_models) -> None:
    host.write(cpu_serve_profile(live_models["random"], free_port(), model="/nonexistent/model"))
    proc = host.run("check", "--host", host.name, "--level", "2", "--json")
    assert proc.returncode == 9, proc.stdout[-3000:]
    (l2,) = [c for c in _doc(proc)["checks"] if c["level"] == "L2"]
    assert l2["status"] == "failed" and "exited before it was ready" in l2["detail"], l2
    assert "server log" in l2["detail"] and "/nonexistent/model" in l2["detail"], l2["detail"][-2000:]


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
    host.write(cpu_serve_profile(live_models["random"], f"{free_port()}-{free_port() + 5}"))
    client = host.popen("check", "--host", host.name, "--level", "2")
    rec = host.wait_for_record()
    time.sleep(3)                                  # the server is loading
    client.send_signal(signal.SIGINT)
    out, _ = client.communicate(timeout=180)
    assert client.returncode == 130, out[-3000:]
    assert not host.running(), f"server {rec['name']} still runs after Ctrl-C"


def test_a_leftover_server_is_named_then_stopped(host: SshHost, live_models) -> None:
    host.write(cpu_serve_profile(live_models["random"], f"{free_port()}-{free_port() + 5}"))
    client = host.popen("check", "--host", host.name, "--level", "2")
    rec = host.wait_for_record()
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
    venv = _ssh_venv(sshd, live_pristine, tmp_path_factory, "live-gate")
    h = SshHost(sshd, venv, tmp_path_factory.mktemp("live-gate"), "live-gate")
    try:
        h.write(cpu_serve_profile(live_models["random"], free_port(), model="/nonexistent/model"))
        proc = h.run("apply", "ddtree", "--host", h.name, "--yes", "--gate", "check:2")
        assert proc.returncode == 9, proc.stdout[-3000:] + proc.stderr[-3000:]
        assert "gate check:2 failed" in proc.stderr and "rolled back" in proc.stderr, proc.stderr[-3000:]
        status = h.run("status", "--host", h.name, "--json")
        assert _doc(status)["overall"] == "pristine", status.stdout[-2000:]
        assert not h.running()
    finally:
        h.kill_all()
        venvs.remove_venv(venv.venv, background=True)
