#!/usr/bin/env bash
# Session 5, call 1: GPU tests on HEAD, then the peaked bs1 goal row.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/s .whl/*.whl
export PYTHONPATH=$PWD:/tmp/s PYTHONUNBUFFERED=1
git log --oneline -1 > $OUT/head.txt 2>/dev/null || true
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv >> $OUT/head.txt
timeout 420 python3 -m pytest -q -p no:cacheprovider --durations=5 tests/gpu/test_gpu_ddtree.py tests/gpu/test_gpu_ddtree_decode_step.py 2>&1 | tee $OUT/pytest_gpu.txt | tail -15
C="--preps bound --no-torch-path --cpu-reps 3 --cpu-max-requests 4"
timeout 150 python3 bench/tree_build.py --kinds peaked --bs 1 --budgets 512,1024 $C --out $OUT/peaked_bs1.json 2>&1 | grep -v Warn | tee $OUT/peaked_bs1.txt | grep "^peaked" | cut -c1-700
