#!/usr/bin/env bash
# Session 6, call 2: micro6 (chain bound on/off; final-sort warps), then goal rows.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/s .whl/*.whl
export PYTHONPATH=$PWD:/tmp/s PYTHONUNBUFFERED=1
MICRO_S=200 timeout 330 python3 scratch_gpu/micro6.py 2>&1 | grep -v Warn | tee $OUT/micro6.txt
C="--preps bound --no-torch-path --cpu-reps 3 --cpu-max-requests 4"
timeout 200 python3 bench/tree_build.py --kinds peaked --bs 1 --budgets 512,1024 $C --out $OUT/peaked_bs1.json 2>&1 | grep -v Warn | tee $OUT/peaked_bs1.txt | grep "^peaked" | cut -c1-600
