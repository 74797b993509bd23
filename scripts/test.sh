#!/usr/bin/env bash
# README command 2: set up everything, then run the whole test suite (CPU; GPU tests are skipped here
# and run on a GPU machine with tests/gpu/run_gpu_tests.sh). Extra arguments go to pytest.
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh || exit 1
PY=$(bash scripts/python.sh)      # the interpreter setup.sh installed into
# Without a GPU, Triton kernels (ours and SGLang's tree verify) run in Triton's CPU interpreter.
if ! command -v nvidia-smi >/dev/null 2>&1; then
  export TRITON_INTERPRET=1
fi
# Test files run in parallel, one pytest-xdist worker per core (at least 2: many tests wait on ssh,
# pip or a server); a file's tests stay on one worker, so its module-scoped servers start once, and
# files sharing an expensive session fixture stay together (groups: tests/conftest.py).
# SGLPATCH_TEST_WORKERS=0 runs them in one process.
WORKERS=${SGLPATCH_TEST_WORKERS:-$(( $(nproc) > 2 ? $(nproc) : 2 ))}
$PY -m pytest -n "$WORKERS" --dist loadgroup --no-loadscope-reorder "$@"
rc=$?
if [ $rc -eq 5 ]; then
  echo "test.sh: pytest collected no tests — that is a failure, not a pass" >&2
  exit 1
fi
exit $rc
