#!/usr/bin/env bash
# DDTree GPU proofs + benchmarks, in one command (rerunnable on any CUDA host).
#
# Usage (repo root):  OUT=/some/dir [DDTREE_TESTS="files..."] bash tests/gpu/run_gpu_tests.sh [pytest args...]
# Needs: python3 with CUDA torch + Triton. For the SGLang proofs, put the sglang 0.5.23 wheel in
# .gpu/ and the cp312 wheels of its import-time deps (and pytest/hypothesis if missing) in .whl/
# (both git-ignored; tests/gpu/README.md says how to fetch them). Results go to $OUT.
set -uo pipefail
REPO="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$REPO"
OUT="${OUT:-/tmp/ddtree_gpu_out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
SITE=/tmp/ddtree_site
SGL=/tmp/ddtree_sglang
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$SITE" .whl/*.whl || exit 1
fi
if ls .gpu/sglang-*.whl >/dev/null 2>&1 && [ ! -d "$SGL/sglang" ]; then
  mkdir -p "$SGL" && python3 -m zipfile -e .gpu/sglang-*.whl "$SGL" || exit 1
fi
export PYTHONPATH="$REPO:$SITE:$SGL${PYTHONPATH:+:$PYTHONPATH}"
{
  date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv
  python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'
} 2>&1 | tee "$OUT/env.txt"
( time python3 -c 'import sglang.kernels.ops.speculative.spec_tree as s; print("sglang spec_tree ok")' ) 2>&1 | tail -5 | tee -a "$OUT/env.txt"

# Triton's kernel cache: compiling the kernels is most of a cold machine's run. TRITON_CACHE_DIR
# (default /tmp/ddtree_triton_cache: a fixed absolute path, since Triton's cache index records
# absolute file paths) starts from .gpu/triton-cache.tar.gz when that exists; with
# DDTREE_PACK_CACHE=1 the cache is packed (gzip: xz was cut off at a call's limit) into $OUT/triton-cache.tar.gz at the end, to be put
# back into .gpu/ for the next machine (kernels whose source changed compile again).
export TRITON_CACHE_DIR="${TRITON_CACHE_DIR:-/tmp/ddtree_triton_cache}"
if ls .gpu/triton-cache.tar.gz* >/dev/null 2>&1 && [ ! -f "$TRITON_CACHE_DIR/.from_tarball" ]; then
  mkdir -p "$TRITON_CACHE_DIR" && cat .gpu/triton-cache.tar.gz* | tar -xz -C "$TRITON_CACHE_DIR" || exit 1
  touch "$TRITON_CACHE_DIR/.from_tarball"
  echo "triton cache: $(find "$TRITON_CACHE_DIR" -type f | wc -l) files from .gpu/triton-cache.tar.gz" | tee -a "$OUT/env.txt"
fi
# DDTREE_WORKERS: pytest-xdist processes (default: half the cores, at most 8, when xdist is
# importable — put its wheels, pytest_xdist and execnet, in .whl/), so kernels compile in parallel;
# 1 runs serially.
WORKERS="${DDTREE_WORKERS:-auto}"
XDIST=()
if python3 -c 'import xdist' 2>/dev/null; then
  if [ "$WORKERS" = auto ]; then
    WORKERS=$(( $(nproc) / 2 ))
    [ "$WORKERS" -gt 8 ] && WORKERS=8
  fi
  [ "$WORKERS" -gt 1 ] && XDIST=(-n "$WORKERS")
fi
echo "pytest workers: ${XDIST[*]:-serial}" | tee -a "$OUT/env.txt"

rc=0
# DDTREE_TESTS: which test files/directories (default: all of tests/gpu). DDTREE_PYTEST_SECONDS:
# stop pytest after that long (0: never), leaving the rest of a lent machine's call to pack the
# cache and copy the logs.
# -v: a log cut short still names every test that finished (under xdist -q prints only dots).
timeout "${DDTREE_PYTEST_SECONDS:-0}" python3 -m pytest -v -p no:cacheprovider -rA "${XDIST[@]}" \
  ${DDTREE_TESTS:-tests/gpu} "$@" 2>&1 | tee "$OUT/pytest_gpu.log" | grep -v '^PASSED' | tail -60
[ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
grep -h "SGLANG_" "$OUT/pytest_gpu.log" > "$OUT/sglang_proofs.txt" || true

if [ -z "${DDTREE_SKIP_BENCH:-}" ]; then
  python3 bench/tree_build.py --out "$OUT/tree_build.json" 2>&1 | tee "$OUT/tree_build.txt" | grep "^|"
  [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
  python3 bench/walk.py --out "$OUT/walk.json" 2>&1 | tee "$OUT/walk.txt" | tail -20
  [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
fi
if [ -n "${DDTREE_PACK_CACHE:-}" ] && [ -d "$TRITON_CACHE_DIR" ]; then
  # in 15 MiB parts (.part00, .part01, ...) when larger: a lent machine returns files of at most
  # 16 MiB; the parts are unpacked together above
  tar -czf "$OUT/triton-cache.tar.gz" -C "$TRITON_CACHE_DIR" . &&
    if [ "$(stat -c %s "$OUT/triton-cache.tar.gz")" -gt $((15 << 20)) ]; then
      split -b 15M -d "$OUT/triton-cache.tar.gz" "$OUT/triton-cache.tar.gz.part" && rm "$OUT/triton-cache.tar.gz"
    fi
  ls -l "$OUT"/triton-cache.tar.gz*
fi
echo "run_gpu_tests.sh rc=$rc"
exit $rc
