#!/usr/bin/env bash
# Session 6, call 1: kernel timeline of build_ddtree, then the decode-step GPU test file.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/s .whl/*.whl
export PYTHONPATH=$PWD:/tmp/s PYTHONUNBUFFERED=1
git log --oneline -1 > $OUT/head.txt 2>/dev/null || true
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv >> $OUT/head.txt
timeout 200 python3 scratch_gpu/prof6.py 2>&1 | grep -v Warn | tee $OUT/prof6.txt
timeout 370 python3 -m pytest -q -p no:cacheprovider -rA --durations=5 tests/gpu/test_gpu_ddtree_decode_step.py 2>&1 | tee $OUT/pytest_decode_step.txt | grep -v "^PASSED" | tail -15
