#!/usr/bin/env bash
# Second call of the tenth session: the goal rows and the whole table on 4a852dc's kernels (the
# ones the first call's 46 GPU tests passed on), starting from that call's Triton cache
# (.gpu/cache/triton-cache.tar.gz.part*). Walk bench last, without the SGLang column (the sglang
# wheel and the cache do not fit one 64 MiB carry together).
set -o pipefail
export TRITON_CACHE_DIR=/tmp/ddtree_triton_cache PYTHONPATH=$PWD PYTHONUNBUFFERED=1
mkdir -p "$TRITON_CACHE_DIR" && cat .gpu/cache/triton-cache.tar.gz.part* | tar -xz -C "$TRITON_CACHE_DIR"
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv > "$OUT/env2.txt"
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)' >> "$OUT/env2.txt"
run() { local name=$1 t=$2; shift 2; timeout "$t" python3 bench/tree_build.py --preps bound --no-torch-path \
  --out "$OUT/$name.json" "$@" 2>&1 | grep -v Warn > "$OUT/$name.txt"; grep "^| " "$OUT/$name.txt" | head -8; }
run goal_bs1 100 --kinds peaked --bs 1 --budgets 512 --cpu-reps 3 --cpu-max-requests 4
run goal_bs64 100 --kinds peaked --bs 64 --budgets 256 --cpu-reps 1 --cpu-max-requests 4
run full 300 --kinds peaked,normal --bs 1,8,64 --budgets 16,64,256,512,1024 --cpu-reps 1 \
  --cpu-max-requests 4 --max-seconds 200
timeout 60 python3 bench/walk.py --out "$OUT/walk.json" 2>&1 | grep -v Warn > "$OUT/walk.txt"; tail -16 "$OUT/walk.txt"
