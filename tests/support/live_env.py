"""The live tests' CPU SGLang server environment: build it, clone it, run SGLang in it.

A pristine venv (``pip install --no-deps sglang==0.5.23``, then the pinned CPU server set of
``tests/live/requirements-sglang-0.5.23-cpu-server.txt``, then the platform plugin of
``tests/live/cpu_platform/``) is built once under :func:`tests.support.venvs.cache_root` and
reused while the requirements and the plugin's files are unchanged (they are in the cache key).
About 2.7 GB and 1.5-3 min of pip on a fresh machine (CPU torch and triton are most of it).

``python -m tests.support.live_env build`` builds it (``scripts/setup.sh`` calls this, so the
README's test command and CI build it before pytest starts) and prints where it is.

SGLang runs there with :data:`PLATFORM_ENV` (the plugin selected, Triton interpreted) and
:data:`CPU_ENGINE_ARGS` (float32 on the CPU; triton attention for target and draft, which run
under the interpreter; no CUDA graphs).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from tests.support import venvs

REPO = Path(__file__).resolve().parents[2]
LIVE_DIR = REPO / "tests" / "live"
REQUIREMENTS = LIVE_DIR / f"requirements-sglang-{venvs.SGLANG_VERSION}-cpu-server.txt"


def requirements_file(version: str = venvs.SGLANG_VERSION) -> Path:
    """The pinned CPU server set for SGLang ``version`` (may not exist: no live venv there)."""
    return LIVE_DIR / f"requirements-sglang-{version}-cpu-server.txt"


def live_releases() -> list[str]:
    """The SGLang releases with a CPU server set here, 0.5.23 first."""
    found = sorted(p.name[len("requirements-sglang-"):-len("-cpu-server.txt")]
                   for p in LIVE_DIR.glob("requirements-sglang-*-cpu-server.txt"))
    return sorted(found, key=lambda v: v != venvs.SGLANG_VERSION)
PLUGIN_DIR = LIVE_DIR / "cpu_platform"
# Installed beside the plugin: an import hook that makes PyPI's CUDA torchvision importable with
# CPU torch in every interpreter of the venv (see cpu_platform/.../torchvision_hook.py).
PTH_NAME = "sglpatch_cpu_platform.pth"
PTH_LINE = "import sglpatch_cpu_platform.torchvision_hook\n"

PLATFORM_ENV = {"SGLANG_PLATFORM": "sglpatch_cpu", "TRITON_INTERPRET": "1"}
CPU_ENGINE_ARGS = {
    "device": "cpu",
    "dtype": "float32",
    "attention_backend": "triton",
    "disable_cuda_graph": True,
    "mem_fraction_static": 0.3,
    "max_total_tokens": 4096,
    "max_running_requests": 8,
    "skip_server_warmup": True,
    "random_seed": 0,
    "log_level": "warning",
}
SPECULATIVE_DRAFT_ARGS = {"speculative_draft_attention_backend": "triton"}


@dataclass(frozen=True)
class LiveVenv:
    """A working copy of the live venv: its interpreter and its directory."""

    python: str
    venv: Path

    @property
    def site_packages(self) -> Path:
        return venvs.site_packages_of(self.venv)


def file_digest(path: Path) -> str:
    """sha256 (hex, 16 chars) of one file's bytes."""
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


def fingerprint(version: str = venvs.SGLANG_VERSION) -> str:
    """sha256 (hex, 16 chars) over the release's requirements file and every plugin file."""
    h = hashlib.sha256()
    files = [requirements_file(version)] + sorted(
        p for p in PLUGIN_DIR.rglob("*")
        if p.is_file() and not any(part == "__pycache__" or part == "build" or part.endswith(".egg-info")
                                   for part in p.relative_to(PLUGIN_DIR).parts))
    for f in files:
        h.update(f.relative_to(REPO).as_posix().encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def _install_plugin(vpy: str, env: dict[str, str]) -> None:
    """A regular (non-editable) install from a copy, so the venv does not depend on this checkout
    and setuptools writes no build/ or egg-info into it; then the ``.pth`` import hook."""
    with tempfile.TemporaryDirectory(prefix="sglpatch-plugin-") as tmp:
        src = Path(tmp) / PLUGIN_DIR.name
        shutil.copytree(PLUGIN_DIR, src, ignore=shutil.ignore_patterns("__pycache__", "build",
                                                                        "*.egg-info"))
        venvs.pip(vpy, ["install", "--no-deps", "--no-build-isolation", str(src)], env)
    site = venvs.site_packages_of(Path(vpy).parent.parent)
    (site / PTH_NAME).write_text(PTH_LINE)


def pristine_live_venv(version: str = venvs.SGLANG_VERSION) -> Path:
    """The cached pristine live venv of SGLang ``version`` (built now if missing). RuntimeError
    when pip fails or the release has no CPU server set here."""
    path = requirements_file(version)
    reqs = venvs.read_requirements(path)
    if not reqs:
        raise RuntimeError(f"{path} is missing or empty")
    if version != venvs.SGLANG_VERSION and reqs == venvs.read_requirements(requirements_file()):
        # the same server set: the 0.5.23 venv with this release's sglang (seconds, not minutes)
        return venvs.release_swap_venv(pristine_live_venv(), version, "sglang-live")
    if "PIP_FIND_LINKS" not in os.environ and Path("/opt/wheels").is_dir():
        os.environ["PIP_FIND_LINKS"] = "/opt/wheels"   # where this workplace keeps the CPU torch wheel
    return venvs.pristine_venv("sglang-live", reqs, version, fingerprint=fingerprint(version),
                               post_install=_install_plugin)


def sglang_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """An environment for running SGLang in the live venv: ``base`` (default ``os.environ``)
    without PYTHONPATH/VIRTUAL_ENV, plus :data:`PLATFORM_ENV`."""
    env = {k: v for k, v in (os.environ if base is None else base).items()
           if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(PLATFORM_ENV)
    return env


def sglpatch(args: list[str], *, home: Path, hosts: Path,
             timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """Run the real ``sglpatch`` CLI (this checkout) with its own state dir and inventory."""
    env = dict(os.environ, SGLPATCH_HOME=str(home), SGLPATCH_HOSTS=str(hosts))
    return subprocess.run([sys.executable, "-m", "sglang_patcher", *args], capture_output=True,
                          text=True, env=env, timeout=timeout, cwd=REPO)


def write_local_inventory(path: Path, name: str, python: str) -> Path:
    """A hosts.yaml with one ``transport: local`` host ``name`` running ``python``."""
    path.write_text(f"hosts:\n  {name}:\n    transport: local\n    python: {python}\n")
    return path


def patched_copy(pristine: Path, where: Path, patchset: str = "ddtree") -> LiveVenv:
    """A working copy of ``pristine`` at ``where``, patched with ``patchset`` by ``sglpatch
    apply`` (L0/L1 smoke checks included); fails the test with sglpatch's output otherwise."""
    venv = venvs.clone_venv(pristine, where / "venv", share_deps=True)
    home, hosts = where / "sglpatch-home", write_local_inventory(where / "hosts.yaml", "live", str(venv))
    home.mkdir(exist_ok=True)
    applied = sglpatch(["apply", patchset, "--host", "live", "--yes"], home=home, hosts=hosts)
    assert applied.returncode == 0, f"sglpatch apply {patchset}:\n{applied.stdout[-3000:]}\n{applied.stderr[-3000:]}"
    want = patchset.split("@")[0]
    status = sglpatch(["status", "--host", "live", "--patchset", patchset, "--expect", "patched", "--json"],
                      home=home, hosts=hosts)
    assert status.returncode == 0, f"status after apply:\n{status.stdout[-3000:]}\n{status.stderr[-2000:]}"
    doc = json.loads(status.stdout)
    assert doc["ok"] and want in json.dumps(doc), doc
    return LiveVenv(str(venv), venv.venv)


def main(argv: list[str]) -> int:
    if argv[1:] != ["build"]:
        print("usage: python -m tests.support.live_env build", file=sys.stderr)
        return 2
    for version in live_releases():
        t0 = time.monotonic()
        print(f"live env: building the CPU SGLang {version} server venv (cached; ~2.7 GB, a few "
              "minutes the first time)", flush=True)
        path = pristine_live_venv(version)
        print(f"live env: {path} ready in {time.monotonic() - t0:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
