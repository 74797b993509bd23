#!/usr/bin/env bash
# One device call (~9 min): the ranks / merge micro benches, the beam's gen_wide / warps variants
# (compiled in parallel first), then tests/gpu/test_gpu_ddtree.py with xdist workers, cache packed.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/s .whl/*.whl
export PYTHONPATH=$PWD:/tmp/s PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/ddtree_triton_cache
git log --oneline -1 > "$OUT/head.txt" 2>/dev/null
if [ -f .gpu/triton-cache.tar.xz ]; then  # an earlier call's kernels (see tests/gpu/README.md)
  mkdir -p "$TRITON_CACHE_DIR" && tar -xJf .gpu/triton-cache.tar.xz -C "$TRITON_CACHE_DIR" && touch "$TRITON_CACHE_DIR/.from_tarball"
fi
n=$(python3 -c 'import sys; sys.path.insert(0, "bench/micro"); import beam_variants as b; print(len(b.CONFIGS))')
for i in $(seq 0 $((n - 1))); do timeout 200 python3 bench/micro/beam_variants.py compile "$i" > "/tmp/beam_compile_$i.log" 2>&1 & done
timeout 120 python3 bench/micro/ranks_variants.py 2>&1 | grep -v Warn | tee "$OUT/ranks_variants.txt"
timeout 120 python3 bench/micro/merge_variants.py 2>&1 | grep -v Warn | tee "$OUT/merge_variants.txt"
wait; grep -h compiled /tmp/beam_compile_*.log
timeout 120 python3 bench/micro/beam_variants.py time 2>&1 | grep -v Warn | tee "$OUT/beam_variants.txt"
DDTREE_SKIP_BENCH=1 DDTREE_PACK_CACHE=1 DDTREE_PYTEST_SECONDS=240 DDTREE_TESTS=tests/gpu/test_gpu_ddtree.py \
  OUT="$OUT" bash tests/gpu/run_gpu_tests.sh 2>&1 | tail -30
