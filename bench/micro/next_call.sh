#!/usr/bin/env bash
# One device call (~8 min): the whole beam's variants (beam_variants.py: compiled in parallel,
# then timed side by side, only those whose compile finished), then the goal row on the defaults.
# (The ranks / merge micro benches of the eighth session: ../h200-2026-12-01-eighth/.)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/s .whl/*.whl
export PYTHONPATH=$PWD:/tmp/s PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/ddtree_triton_cache
git log --oneline -1 > "$OUT/head.txt" 2>/dev/null
n=$(python3 -c 'import sys; sys.path.insert(0, "bench/micro"); import beam_variants as b; print(len(b.CONFIGS))')
for i in $(seq 0 $((n - 1))); do timeout "${COMPILE_SECONDS:-270}" python3 bench/micro/beam_variants.py compile "$i" > "/tmp/beam_compile_$i.log" 2>&1 & done
wait
ok=$(for i in $(seq 0 $((n - 1))); do grep -q compiled "/tmp/beam_compile_$i.log" && echo "$i"; done)
echo "compiled: $ok" | tee "$OUT/beam_variants.txt"
timeout 100 python3 bench/micro/beam_variants.py time $ok 2>&1 | grep -v Warn | tee -a "$OUT/beam_variants.txt"
timeout "${GOAL_SECONDS:-150}" python3 bench/tree_build.py --kinds peaked --bs 1 --budgets 512 --preps bound --no-torch-path \
  --cpu-reps 3 --cpu-max-requests 4 --out "$OUT/peaked_bs1.json" 2>&1 | grep -v Warn | tee "$OUT/peaked_bs1.txt" | grep "^|\|peaked"
tar -czf "$OUT/triton-cache.tar.gz" -C "$TRITON_CACHE_DIR" . && ls -l "$OUT/triton-cache.tar.gz"
