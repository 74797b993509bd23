"""How long the pruned beam takes to compile for sm_90 (H100 / H200), on this CPU, no GPU needed.

A server pays this once per budget N on its first DDTREE step (Triton JIT-compiles, then caches),
and a lent GPU machine pays it on every cold start. Compiles ``_beam_prune_kernel`` with the
launch's constexprs for each N given (gen_wide 2: W = 2 * NP) from this checkout's
``patchsets/ddtree/kernels/ddtree_beam.py`` and, with ``--rev REV``, from that git revision's
(``patchsets/ddtree/modules/ddtree_kernels.py`` before the kernels were split by stage), side by
side in fresh Triton caches; prints seconds per compile (median of ``--reps``) and the ratio.

    python3 bench/compile_time.py --rev 446fe4d --budgets 512
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def beam_case(n: int) -> tuple[dict, dict, int]:
    """Signature, constexprs and warps of ``beam_prune_triton``'s launch at budget n, K = n, L = 15."""
    sys.path.insert(0, str(ROOT))
    from patchsets.ddtree.modules.ddtree_tree import candidate_pairs

    from patchsets.ddtree.kernels import ddtree_beam as k

    consts, warps = k.beam_prune_constexprs(15, n, n, candidate_pairs(n, n, "cpu")[0].numel())
    sig = k.BEAM_PRUNE_SIGNATURE
    return sig, consts, warps


def compile_seconds(tree: Path, n: int) -> float:
    """One compile of the beam from ``tree``'s ``patchsets`` package in a fresh Triton cache (a
    child process, so that nothing is shared in memory between versions)."""
    code = (f"import sys, time; sys.path.insert(0, {str(ROOT / 'bench')!r}); import compile_time as c;"
            f"sig, consts, warps = c.beam_case({n}); sys.path.insert(0, {str(tree)!r});"
            f"[sys.modules.pop(m) for m in list(sys.modules) if m.split('.')[0] == 'patchsets'];"
            f"import importlib, triton;"
            f"k = importlib.import_module('patchsets.ddtree.kernels.ddtree_beam'"
            f" if {(tree / 'patchsets/ddtree/kernels/ddtree_beam.py').is_file()!r}"
            f" else 'patchsets.ddtree.modules.ddtree_kernels');"
            f"assert k.__file__.startswith({str(tree)!r}), k.__file__;"
            f"from triton.backends.compiler import GPUTarget; from triton.compiler import ASTSource;"
            f"t = time.perf_counter();"
            f"triton.compile(ASTSource(fn=k._beam_prune_kernel, signature=sig, constexprs=consts),"
            f" target=GPUTarget('cuda', 90, 32), options={{'num_warps': warps}});"
            f"print(time.perf_counter() - t)")
    with tempfile.TemporaryDirectory() as cache:
        env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        env["TRITON_CACHE_DIR"] = cache
        env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(f"compiling the beam from {tree} failed:\n{out.stderr[-3000:]}")
    return float(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rev", help="also compile this git revision's pruned beam, side by side")
    ap.add_argument("--budgets", default="512", help="comma-separated N (default 512)")
    ap.add_argument("--reps", type=int, default=1, help="compiles per version and N (median)")
    args = ap.parse_args()
    versions = [("this checkout", ROOT)]
    tmp = tempfile.TemporaryDirectory() if args.rev else None
    if tmp is not None:  # the revision's patchsets/ package, extracted whole (the kernels import siblings)
        tar = subprocess.run(["git", "archive", args.rev, "patchsets"], cwd=ROOT, capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", tmp.name], input=tar.stdout, check=True)
        versions.append((args.rev, Path(tmp.name)))
    try:
        import triton
        print(f"pruned beam compile for sm_90 on this CPU, triton {triton.__version__}, L 15, K = N, "
              f"gen_wide 2, chain bound; seconds per compile (median of {args.reps})")
        for n in (int(x) for x in args.budgets.split(",")):
            secs = {}
            for label, path in versions:
                secs[label] = statistics.median(compile_seconds(path, n) for _ in range(args.reps))
            line = " | ".join(f"{label}: {s:.1f} s" for label, s in secs.items())
            if args.rev:
                line += f" | ratio {secs[args.rev] / secs['this checkout']:.2f}x"
            print(f"N {n}: {line}", flush=True)
    finally:
        if tmp is not None:
            tmp.cleanup()


if __name__ == "__main__":
    main()
