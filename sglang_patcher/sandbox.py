"""The embedded default target: a local venv holding a real SGLang release from PyPI.

README command 1 runs the whole story (snapshot → diff → apply → status → rollback) against it, through
the ``local`` transport, so a new user needs no GPU host. The venv lives under
``sglpatch_home()/sandbox/venv`` and is built once with ``pip install --no-deps sglang==<version>``
(a real install of the real wheel). SGLang's dependencies are left out by default, so the L1 import
check reports "skipped" there, never "passed". ``with_deps`` adds the CPU set that lets L1 really
import and validate (``data/sglang-<version>-cpu-requirements.txt``: CPU torch, triton and light
packages, about 2 GB); the CPU torch wheel is found the way pip finds it — ``PIP_FIND_LINKS`` (a
directory holding it) or ``PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu``.
Building it again (another version, ``with_deps`` added, or the venv deleted) replaces the install
that earlier deployments patched: the demo marks their local records superseded and says so
(``before_build``), so that no ``rollback`` looks for them on the new venv.
"""

from __future__ import annotations

import subprocess
import sys
from importlib import resources
from pathlib import Path
from typing import Callable

from .errors import SglpatchError
from .inventory import Host
from .piprun import run_pip
from .progress import SILENT, Meter
from .state import sglpatch_home

DEFAULT_SGLANG = "0.5.23"
SANDBOX_HOST = "sandbox"


def sandbox_dir(version: str = DEFAULT_SGLANG, home: Path | None = None) -> Path:
    """The sandbox venv directory (``sandbox/venv``; hosts.yaml's ``sandbox`` entry points here).

    One sandbox exists at a time; its marker file records the SGLang version it holds and a request
    for another version rebuilds it.
    """
    return (home or sglpatch_home()) / "sandbox" / "venv"


def sandbox_python(version: str = DEFAULT_SGLANG, home: Path | None = None) -> Path:
    return sandbox_dir(version, home) / "bin" / "python"


def cpu_requirements(version: str) -> Path:
    """The packaged CPU dependency list of SGLang ``version`` (raises SglpatchError if none ships)."""
    ref = resources.files("sglang_patcher") / "data" / f"sglang-{version}-cpu-requirements.txt"
    if not ref.is_file():
        raise SglpatchError(f"sandbox: no CPU dependency list for sglang {version}",
                            hint=f"run the demo without --with-deps, or with --sglang {DEFAULT_SGLANG}")
    return Path(str(ref))


def ensure_sandbox(version: str = DEFAULT_SGLANG, home: Path | None = None, *,
                   with_deps: bool = False, log=print, meter: Meter = SILENT,
                   before_build: Callable[[Path, bool], object] | None = None) -> Path:
    """Create (once) the sandbox venv with ``sglang==version`` and return its interpreter path.

    ``with_deps`` also installs SGLang's CPU dependency set (see the module doc), so L1 runs.
    Raises :class:`SglpatchError` naming the step and the pip output tail when venv or pip fails
    (for example no network and no pip cache). A half-built venv is removed so the next run retries.
    ``meter`` shows each step (pip's downloads: bytes, rate). ``before_build(venv, existed)`` is
    called before a build deletes (``existed``) or creates the venv: the install there is replaced
    (the demo retires its deployment records then: :func:`sglang_patcher.demo.retire_sandbox_records`).
    """
    venv = sandbox_dir(version, home)
    python = venv / "bin" / "python"
    marker = venv / ".sglpatch-ready"
    want = f"{version}{' +deps' if with_deps else ''}"
    if marker.exists() and python.exists() and marker.read_text().strip() in (
            want, f"{version} +deps"):
        return python
    import shutil

    if before_build is not None:
        before_build(venv, venv.exists())
    if venv.exists():
        shutil.rmtree(venv)
    venv.parent.mkdir(parents=True, exist_ok=True)
    log(f"building the sandbox target: venv {venv} with sglang=={version} (--no-deps, once)")
    steps = [
        ("sandbox: create the venv", [sys.executable, "-m", "venv", str(venv)]),
        (f"sandbox: pip install sglang=={version}",
         [str(python), "-m", "pip", "install", "--disable-pip-version-check", "--no-deps", f"sglang=={version}"]),
    ]
    if with_deps:
        steps.append(("sandbox: pip install SGLang's CPU dependency set",
                      [str(python), "-m", "pip", "install", "--disable-pip-version-check",
                       "-r", str(cpu_requirements(version))]))
        log("  + SGLang's CPU dependency set (torch CPU, triton, light packages; ~2 GB, once)")
    for what, argv in steps:
        with meter.task(what) as task:
            if "pip" in argv:
                proc = run_pip(argv, task=task)
            else:
                proc = subprocess.run(argv, capture_output=True, text=True)
        if proc.returncode != 0:
            shutil.rmtree(venv, ignore_errors=True)
            tail = "\n    ".join((proc.stderr or proc.stdout).strip().splitlines()[-10:])
            raise SglpatchError(
                f"sandbox: `{' '.join(argv)}` failed (exit {proc.returncode})\n    {tail}",
                hint="check network access to PyPI (or a pip cache holding the wheel) and retry; "
                     "the CPU torch needs PIP_FIND_LINKS or PIP_EXTRA_INDEX_URL (module doc)")
    marker.write_text(want + "\n")
    return python


def sandbox_host(version: str = DEFAULT_SGLANG, home: Path | None = None) -> Host:
    """The inventory entry of the sandbox target (transport ``local``)."""
    return Host(name=SANDBOX_HOST, transport="local", python=str(sandbox_python(version, home)), tags=["sandbox"])
