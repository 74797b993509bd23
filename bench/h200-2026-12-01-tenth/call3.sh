#!/usr/bin/env bash
# Third call of the tenth session: fp16 draft logits, never run on a GPU before. The fp16 cases of
# test_cuda_tree_equals_cpu_reference (every prep, the 16-bit radix and bound preps included,
# against the CPU heap), then the fp16 rows of bench/tree_build.py with the row / chunked / bound
# preps side by side (fp16's default was "chunked" / "row", by bf16 measurements), then fp32 rows.
set -o pipefail
export TRITON_CACHE_DIR=/tmp/ddtree_triton_cache PYTHONUNBUFFERED=1
mkdir -p "$TRITON_CACHE_DIR" && cat .gpu/cache/triton-cache.tar.gz.part* | tar -xz -C "$TRITON_CACHE_DIR"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD:/tmp/site
timeout 240 python3 -m pytest -v -p no:cacheprovider -rA -n 8 tests/gpu/test_gpu_ddtree.py -k "fp16" 2>&1 \
  | grep -v '^PASSED' > "$OUT/pytest_fp16.log"; grep -E "passed|failed|error" "$OUT/pytest_fp16.log" | tail -3
run() { local name=$1 t=$2; shift 2; timeout "$t" python3 bench/tree_build.py --no-torch-path --cpu-reps 1 \
  --cpu-max-requests 4 --out "$OUT/$name.json" "$@" 2>&1 | grep -v Warn > "$OUT/$name.txt"; grep "^| " "$OUT/$name.txt"; }
run fp16 200 --dtype fp16 --preps row,chunked,radix,bound --kinds peaked,normal --bs 1,8,64 \
  --budgets 64,512,1024,256 --max-seconds 150
run fp32 90 --dtype fp32 --preps row,chunked --kinds peaked --bs 1,64 --budgets 512,256 --max-seconds 60
