#!/usr/bin/env bash
# Scratch: goal rows of bench/tree_build.py after the 32-bit candidate pass (fourth session).
export PYTHONPATH=$PWD:/tmp/s
C="--preps bound --no-torch-path --cpu-reps 3 --cpu-max-requests 4"
for kind in peaked normal; do
  python3 bench/tree_build.py --kinds $kind --bs 1 --budgets 512,1024 $C --max-seconds 100 --out $OUT/${kind}_bs1.json 2>&1 | grep -v Warn | tee $OUT/${kind}_bs1.txt | grep "^|"
  python3 bench/tree_build.py --kinds $kind --bs 64 --budgets 256 $C --max-seconds 60 --out $OUT/${kind}_bs64.json 2>&1 | grep -v Warn | tee $OUT/${kind}_bs64.txt | grep "^|"
done
