#!/usr/bin/env bash
# Prints the interpreter the set-up scripts install sglpatch into (and run it with):
# - $PYTHON when set;
# - else python3, when pip may install into it;
# - else (a system Python that refuses pip installs — PEP 668's EXTERNALLY-MANAGED, Debian 12's
#   /usr/bin/python3 — or one without pip) a venv at $SGLPATCH_VENV (default .venv in the
#   checkout), made here once with that python3 (python3-venv: scripts/setup.sh installs it).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -n "${PYTHON:-}" ]; then
  echo "$PYTHON"
  exit 0
fi
VENV=${SGLPATCH_VENV:-$PWD/.venv}
if python3 - <<'PY' 2>/dev/null; then
import os, subprocess, sys, sysconfig
managed = sys.prefix == sys.base_prefix and os.path.exists(
    os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED"))
has_pip = subprocess.run([sys.executable, "-m", "pip", "--version"], capture_output=True).returncode == 0
sys.exit(0 if has_pip and not managed else 1)
PY
  command -v python3
  exit 0
fi
if [ ! -x "$VENV/bin/python" ]; then
  echo "setup: $(command -v python3) refuses pip installs (or has no pip): making the venv $VENV" >&2
  python3 -m venv "$VENV" >&2
fi
echo "$VENV/bin/python"
