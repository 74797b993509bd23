#!/usr/bin/env bash
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/s .whl/*.whl
export PYTHONPATH=$PWD:/tmp/s PYTHONUNBUFFERED=1
(timeout 150 python3 scratch_gpu/micro8.py 2>&1 | grep -v Warn > $OUT/micro8.txt) &
timeout 330 python3 scratch_gpu/prof8.py 2>&1 | grep -v Warn | tee $OUT/prof8.txt
wait; cat $OUT/micro8.txt
