#!/usr/bin/env bash
# Session 7, call 1: primitive costs, per-phase beam profile + num_warps sweep, goal rows on HEAD.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/s .whl/*.whl
export PYTHONPATH=$PWD:/tmp/s PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv > $OUT/head.txt
python3 -c "import torch, triton; print(torch.__version__, triton.__version__)" >> $OUT/head.txt
timeout 90 python3 scratch_gpu/micro8.py 2>&1 | grep -v Warn | tee $OUT/micro8.txt
timeout 240 python3 scratch_gpu/prof8.py 2>&1 | grep -v Warn | tee $OUT/prof8.txt
timeout 200 python3 bench/tree_build.py --kinds peaked --bs 1 --budgets 512,1024 --preps bound --no-torch-path --cpu-reps 3 --cpu-max-requests 4 2>&1 | grep -v Warn | tee $OUT/peaked_bs1.txt
