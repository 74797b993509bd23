#!/usr/bin/env bash
# README command 1: set up, then run the main job on the embedded default target — a local venv
# holding sglang==0.5.23 from PyPI (--no-deps) — snapshot → diff → apply ddtree → status → rollback.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --demo
PY=$(bash scripts/python.sh)      # the interpreter setup.sh installed into
exec $PY -m sglang_patcher demo "$@"
