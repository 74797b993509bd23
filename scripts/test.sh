#!/usr/bin/env bash
# README command 2: set up everything, then run the whole test suite (CPU; GPU tests are skipped here
# and run on a GPU machine with tests/gpu/run_gpu_tests.sh). Extra arguments go to pytest.
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh || exit 1
PY=${PYTHON:-python3}
# Without a GPU, Triton kernels (ours and SGLang's tree verify) run in Triton's CPU interpreter.
if ! command -v nvidia-smi >/dev/null 2>&1; then
  export TRITON_INTERPRET=1
fi
$PY -m pytest "$@"
rc=$?
if [ $rc -eq 5 ]; then
  echo "test.sh: pytest collected no tests — that is a failure, not a pass" >&2
  exit 1
fi
exit $rc
