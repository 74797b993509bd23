#!/usr/bin/env bash
# Third call of the eighth session (the record run): every GPU test file on the final kernels
# with 8 xdist workers, Triton's cache of the second call (its _beam_prune_kernel entries removed:
# that kernel's source changed) in .gpu/, then the goal row on the same code.
DDTREE_SKIP_BENCH=1 DDTREE_PACK_CACHE=1 DDTREE_PYTEST_SECONDS=450 OUT="$OUT" bash tests/gpu/run_gpu_tests.sh
export PYTHONPATH=$PWD:/tmp/ddtree_site PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/ddtree_triton_cache
git log --oneline -1 > "$OUT/head.txt" 2>/dev/null
timeout 75 python3 bench/tree_build.py --kinds peaked --bs 1 --budgets 512 --preps bound --no-torch-path \
  --cpu-reps 3 --cpu-max-requests 4 --out "$OUT/peaked_bs1_final.json" 2>&1 | grep -v Warn > "$OUT/peaked_bs1_final.txt"
grep "^| peaked" "$OUT/peaked_bs1_final.txt"
