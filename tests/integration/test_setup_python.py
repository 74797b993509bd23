"""Which interpreter the README's set-up scripts install sglpatch into (scripts/python.sh).

A new user's Debian 12 ``/usr/bin/python3`` refuses pip installs (PEP 668) and may have no pip at
all: ``bash scripts/demo.sh`` failed there unless ``PYTHON`` named a venv. The scripts now make
and use a venv in the checkout when python3 cannot take the install. Here python3 is a real
interpreter without pip (a venv made ``--without-pip``, first on PATH); the PEP 668 marker is the
same branch (it cannot be written into this machine's stdlib)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _python_sh(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(REPO / "scripts" / "python.sh")], capture_output=True, text=True,
                          env=env, timeout=300)


def test_a_python3_that_cannot_pip_install_gets_a_venv_and_a_pythons_own_pip_is_used(tmp_path):
    bare = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True, timeout=120)
    env = {**os.environ, "PATH": f"{bare / 'bin'}:{os.environ['PATH']}", "SGLPATCH_VENV": str(tmp_path / "venv")}
    env.pop("PYTHON", None)
    proc = _python_sh(env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str(tmp_path / "venv" / "bin" / "python"), proc.stdout
    assert "refuses pip installs (or has no pip): making the venv" in proc.stderr, proc.stderr
    made = proc.stdout.strip()
    assert subprocess.run([made, "-m", "pip", "--version"], capture_output=True, timeout=60).returncode == 0
    again = _python_sh(env)       # the second call (demo.sh after setup.sh) finds the same venv
    assert again.stdout.strip() == made and "making the venv" not in again.stderr
    # a python3 that takes pip installs is used as it is; $PYTHON always wins
    plain = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
             "SGLPATCH_VENV": str(tmp_path / "unused")}
    plain.pop("PYTHON", None)
    got = _python_sh(plain).stdout.strip()
    assert got and not got.startswith(str(tmp_path)), got
    assert _python_sh({**plain, "PYTHON": "/opt/py/bin/python"}).stdout.strip() == "/opt/py/bin/python"
