#!/usr/bin/env bash
# Installs what sglpatch and its tests need on a fresh Debian/Ubuntu machine (idempotent).
# System: openssh-server (the tests' real sshd), python3-venv (target venvs a non-root user can run),
# sudo (root-owned installs). Python: the CPU torch wheel first (pinned, so no CUDA build is pulled), then the project,
# then the live tests' CPU SGLang server venv (tests/support/live_env.py; ~2.7 GB, cached).
# --demo (scripts/demo.sh): only what the main job needs — python3-venv and the project itself,
# no torch, no test extras, no sshd.
set -euo pipefail
cd "$(dirname "$0")/.."
DEMO=0
[ "${1:-}" = "--demo" ] && DEMO=1

need_apt=()
/usr/bin/python3 -c 'import venv, ensurepip' 2>/dev/null || need_apt+=(python3-venv)
if [ $DEMO = 0 ]; then
  [ -x /usr/sbin/sshd ] || need_apt+=(openssh-server)
  # sudo: the tests of hosts whose SGLang install is root-owned (`sudo: true` in hosts.yaml)
  command -v sudo >/dev/null || need_apt+=(sudo)
fi
if [ ${#need_apt[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo -n"; fi
  echo "setup: apt-get install ${need_apt[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

PY=$(bash scripts/python.sh)      # $PYTHON, python3, or .venv where python3 refuses pip
FIND_LINKS=()
[ -d /opt/wheels ] && FIND_LINKS=(--find-links /opt/wheels)
if [ $DEMO = 1 ]; then
  echo "setup: installing sglpatch (editable; the tests' extras come with scripts/test.sh)"
  $PY -m pip install -q "${FIND_LINKS[@]}" -e .
  exit 0
fi
if ! $PY -c 'import torch' 2>/dev/null; then
  echo "setup: installing CPU torch 2.13.0"
  if ls /opt/wheels/torch-2.13.0* >/dev/null 2>&1; then      # a local CPU wheel (this workplace)
    $PY -m pip install -q --find-links /opt/wheels torch==2.13.0
  else                                                     # PyTorch's CPU index, else PyPI
    $PY -m pip install -q --index-url https://download.pytorch.org/whl/cpu torch==2.13.0 \
      || $PY -m pip install -q torch==2.13.0
  fi
fi
echo "setup: installing sglpatch (editable) with test and ddtree extras"
$PY -m pip install -q "${FIND_LINKS[@]}" -e '.[test,ddtree]'
# The live tests' CPU SGLang server venv (sglang 0.5.23 + its CPU server dependencies + the test
# platform plugin): cached under /var/tmp/sglpatch-tests (or $SGLPATCH_TEST_CACHE), built here once.
$PY -m tests.support.live_env build
