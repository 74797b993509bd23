"""A host reached over the real loopback sshd whose venv is a working copy of the live CPU SGLang
venv, for the live tests of ``sglpatch check`` / ``bench`` / ``apply --gate`` (fixtures in
``tests/live/conftest.py``). The sglpatch CLI runs as a subprocess, as a user runs it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml

from tests.support import live_env, venvs
from tests.support.live_sglang import ModelFixture, free_port

REPO = Path(__file__).resolve().parents[2]


def port_range(n: int = 20) -> str:
    """LOW-HIGH: a free port and the next ``n`` (the server agent takes the first free one)."""
    low = min(free_port(), 65535 - n)
    return f"{low}-{low + n}"


def cpu_serve_profile(fx: ModelFixture, port: int | str, **over: object) -> dict:
    """The serve profile of a CPU test host (the platform plugin's environment and flags)."""
    args: list[str] = []
    for key, value in live_env.CPU_ENGINE_ARGS.items():
        flag = "--" + key.replace("_", "-")
        args += [flag] if value is True else [flag, str(value)]
    profile = {"model": str(fx.target), "draft_model": str(fx.drafts[4]), "port": port,
               "env": dict(live_env.PLATFORM_ENV), "start_timeout": 600,
               "args": args + ["--speculative-draft-attention-backend", "triton"],
               "ddtree": {"budget": 8}, "max_new_tokens": 8}
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
        """The CLI as a child process; stdout and stderr apart (``communicate()`` returns both).

        The child starts with SIGINT at its default action, as in a terminal: a test run in the
        background (``cmd &``, nohup, some CI runners) has SIGINT ignored, the child would inherit
        that and Python would then never raise KeyboardInterrupt for a Ctrl-C."""
        return subprocess.Popen([sys.executable, "-m", "sglang_patcher", *args], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=self.env(), cwd=REPO,
                                preexec_fn=_default_sigint)

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

    def wait_for_record(self, before: list[dict], timeout: float = 120) -> dict:
        """The first server record that is not in ``before`` (taken before the client started):
        a record an earlier test left behind must not count as this client's server."""
        seen = {r["name"] for r in before}
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            fresh = [r for r in self.records() if r["name"] not in seen]
            if fresh:
                return fresh[0]
            time.sleep(0.5)
        raise AssertionError(f"no new server record appeared in {self.servers_dir}")

    def kill_all(self) -> None:
        for rec in self.running():
            try:
                os.killpg(int(rec["pgid"]), signal.SIGKILL)
            except ProcessLookupError:
                pass


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def ssh_venv(sshd, pristine: Path, tmp_path_factory, name: str) -> venvs.TargetVenv:
    parent = sshd.home / "venvs" if os.geteuid() == 0 else tmp_path_factory.mktemp(f"ssh-{name}")
    parent.mkdir(parents=True, exist_ok=True)
    if os.geteuid() == 0:
        os.chown(parent, sshd.uid, sshd.gid)
    return venvs.clone_venv(pristine, parent / f"{name}-{os.getpid()}", sshd.uid, sshd.gid, share_deps=True)
