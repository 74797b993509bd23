"""Benchmark: DDTree construction, GPU batched builder vs the CPU heap reference (same run).

From bf16 (``--dtype``: fp16, fp32) draft logits [bs, L=15, V=151,936] to all arrays (tokens, parents, depths, scores,
retrieve_*, tree mask), K = N (the paper's exact tree). GPU: median of CUDA-graph replays (and
eager); also the prep alone (log-sum-exp + exact top-K). CPU: per request torch top-K prep + the
Python heap (``build_tree_reference_from_topk``), summed over the batch (how a CPU-side builder
would run), few repeats. Prints a markdown table and writes JSON (``--out``).

Goals (issue 3): bs 1 N 512 <= 100 µs; bs 64 N 256 <= 1 ms; >= 50x the CPU heap.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _timing import cpu_median_us, gpu_eager_median_us, gpu_graph_median_us  # noqa: E402

from patchsets.ddtree.kernels.ddtree_beam import beam_prune_triton, beam_select_triton, beam_triton  # noqa: E402
from patchsets.ddtree.kernels.ddtree_prep import lse_triton, prep_chunked_triton, tie_fix_triton  # noqa: E402
from patchsets.ddtree.kernels.ddtree_verify_inputs import label_count_triton, tree_mask_triton  # noqa: E402
from patchsets.ddtree.modules.ddtree_reference import build_tree_reference_from_topk  # noqa: E402
from patchsets.ddtree.modules.ddtree_tree import (  # noqa: E402
    build_custom_mask,
    build_ddtree,
    candidate_pairs,
    custom_mask_size,
    draft_topk,
    prefer_beam,
    prefer_prep,
)
from tests.support.ddtree import KINDS, draft_logits  # noqa: E402

PREPS = ("row", "chunked", "radix", "bound", "small")
PREPS_16BIT = ("radix", "bound")  # read 16-bit floats only
OLD_PREPS = {"small": "topk_small_triton", "bound": "topk_bound_triton"}  # --against-revision
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
BEAMS = ("sort", "select", "prune")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bs", default="1,8,64")
    ap.add_argument("--budgets", default="16,64,256,512,1024")
    ap.add_argument("--vocab", type=int, default=151_936)
    ap.add_argument("--depth", type=int, default=15)
    ap.add_argument("--cpu-reps", type=int, default=3)
    ap.add_argument("--cpu-max-requests", type=int, default=16,
                    help="time the CPU heap on at most this many requests and scale to bs")
    ap.add_argument("--out", default=None)
    ap.add_argument("--kinds", default="normal,peaked",
                    help=f"draft logits kinds, from {KINDS} (tests/support/ddtree.py)")
    ap.add_argument("--max-seconds", type=float, default=0.0,
                    help="stop starting new configurations after this many seconds (0: no limit)")
    ap.add_argument("--components", action="store_true",
                    help="also time the older prep pieces (row / chunked kernels, torch.topk alone)")
    ap.add_argument("--preps", default="radix,bound", help=f"Triton prep variants timed, from {PREPS}")
    ap.add_argument("--dtype", default="bf16",
                    help=f"draft logits dtype (the {'/'.join(PREPS_16BIT)} preps need bf16 or fp16)")
    ap.add_argument("--no-torch-path", action="store_true",
                    help="skip timing the all-torch path (recorded in bench/RESULTS.md)")
    ap.add_argument("--prep-only", action="store_true",
                    help="time only the preps (--preps, K = each of --budgets) beside the floor of "
                         "reading the logits once (x.amax(-1)), for every --dtype in a comma list; "
                         "checks that every prep gives the same ids as the first")
    ap.add_argument("--against-revision", type=int, default=None, metavar="N",
                    help="with --prep-only: also time the small and bound preps of the ddtree revision "
                         "frozen in patchsets/ddtree/history/rN, side by side (kernel calls on "
                         "[bs * L, V] for both), after checking that they give the same lp, ids and lse")
    ap.add_argument("--bounds", default="",
                    help="also time the pruned beam with these score bounds (none,chain,tight; "
                         "the default 'chain' is the beam_prune column), side by side")
    a = ap.parse_args()
    if a.prep_only:
        return prep_only(a)
    if a.dtype not in DTYPES:
        raise SystemExit(f"--dtype {a.dtype}: choose one of {sorted(DTYPES)}")
    dev = "cuda"
    L, V = a.depth, a.vocab
    rows = []
    preps = [p for p in a.preps.split(",") if p]
    dtype = DTYPES[a.dtype]
    sixteen = dtype != torch.float32
    unknown = [p for p in preps if p not in PREPS]
    if unknown or (not sixteen and set(preps) & set(PREPS_16BIT)):
        raise SystemExit(f"--preps {a.preps}: choose from {PREPS}"
                         + ("" if sixteen else f", without {'/'.join(PREPS_16BIT)} for --dtype fp32"))
    t_start = time.monotonic()

    def out_of_time(what: str) -> bool:
        late = bool(a.max_seconds) and time.monotonic() - t_start > a.max_seconds
        if late:
            print(f"(stopped after {a.max_seconds:.0f} s: {what} and later not run)")
        return late

    for kind, bs in [(k, int(v)) for k in a.kinds.split(",") for v in a.bs.split(",")]:
        if out_of_time(f"kind={kind} bs={bs}"):
            break
        x = draft_logits(bs, bs, L, V, dtype, kind=kind, device=dev)
        roots = torch.randint(0, V, (bs,), device=dev)
        x_cpu = x.cpu()
        x2 = x.reshape(bs * L, V)
        for N in [int(v) for v in a.budgets.split(",")]:
            if out_of_time(f"kind={kind} bs={bs} N={N}"):
                break
            g = lambda fn, reps=50: gpu_graph_median_us(fn, reps=reps)  # noqa: E731
            var = {}
            for pr in preps:
                for bm in BEAMS:
                    var[(pr, bm)] = g(lambda: build_ddtree(x, roots, N, N, use_triton=True,
                                                           prep=pr, beam=bm))
            dflt = (prefer_prep(bs * L, x.dtype, N), prefer_beam(N))
            full = var[dflt] if dflt in var else g(lambda: build_ddtree(x, roots, N, N))
            eager = gpu_eager_median_us(lambda: build_ddtree(x, roots, N, N), reps=10)
            nan = float("nan")
            prep_radix = g(lambda: draft_topk(x, N, prep="radix")) if sixteen else nan
            prep_bound = g(lambda: draft_topk(x, N, prep="bound")) if sixteen else nan
            prep = prep_chunked = topk_only = lse_only = tie_only = chunked_kernels = nan
            if a.components:
                prep = g(lambda: draft_topk(x, N, prep="row"))
                prep_chunked = g(lambda: draft_topk(x, N, prep="chunked"))
                topk_only = g(lambda: torch.topk(x, N, dim=-1))
                vals, ids0 = torch.topk(x2, N, dim=-1)
                lse_only = g(lambda: lse_triton(x2))
                tie_only = g(lambda: tie_fix_triton(x2, vals, ids0))
                chunked_kernels = g(lambda: prep_chunked_triton(x2, vals, ids0, True))
            lp, lp_ids, _ = draft_topk(x, N)
            ci, ck = candidate_pairs(N, lp.shape[-1], lp.device)
            beam = g(lambda: beam_triton(lp, N, ci, ck))
            beam_sel = g(lambda: beam_select_triton(lp, N, ci, ck))
            beam_prune = g(lambda: beam_prune_triton(lp, N, ci, ck))
            bounds = {}
            wanted = [v for v in a.bounds.split(",") if v]
            gt = beam_prune_triton(lp, N, ci, ck)[4] if wanted else None
            for bd in wanted:
                if not torch.equal(beam_prune_triton(lp, N, ci, ck, bound=bd)[4], gt):
                    raise SystemExit(f"bound={bd}: gtop differs from the default beam's (kind={kind} bs={bs} N={N})")
                bounds[bd] = g(lambda: beam_prune_triton(lp, N, ci, ck, bound=bd))  # noqa: B023
            tree = build_ddtree(x, roots, N, N)
            depth_hist = torch.bincount(tree.depths[tree.valid & (tree.depths > 0)].flatten(),
                                        minlength=L + 1)[1:].tolist()
            max_depth = max([d + 1 for d, c in enumerate(depth_hist) if c] or [0])
            bo = beam_prune_triton(lp, N, ci, ck)  # labels after the pruned beam (the default)
            nbv = torch.full((bs,), N, dtype=torch.int64, device=dev)
            # as build_ddtree runs them: labels with the retrieve links, then the tree mask
            lab_cnt = g(lambda: label_count_triton(bo[4], nbv, roots, lp_ids, bo[0], bo[2], bo[3], N, links=True))
            lo = label_count_triton(bo[4], nbv, roots, lp_ids, bo[0], bo[2], bo[3], N, links=True)
            arrays = g(lambda: tree_mask_triton(lo[1], lo[3], L))
            torch_arrays = float("nan") if a.no_torch_path else gpu_graph_median_us(
                lambda: build_ddtree(x, roots, N, N, use_triton=False), reps=20)
            pl = torch.full((bs,), 1024, dtype=torch.int64, device=dev)
            buf = torch.empty(custom_mask_size(1024 * bs, bs, N + 1), dtype=torch.bool, device=dev)
            mask_tri = g(lambda: build_custom_mask(tree, pl, out=buf, use_triton=True))
            mask_tor = g(lambda: build_custom_mask(tree, pl, out=buf, use_triton=False))
            nreq = min(bs, a.cpu_max_requests)

            def cpu_run():
                for b in range(nreq):
                    lp, ids, _ = draft_topk(x_cpu[b : b + 1], N)
                    build_tree_reference_from_topk(lp[0], ids[0], N)

            cpu = cpu_median_us(cpu_run, reps=a.cpu_reps) * bs / nreq
            rows.append(dict(kind=kind, bs=bs, N=N, default=f"{dflt[0]}+{dflt[1]}", gpu_graph_us=full,
                             variants={f"{p}+{b}": v for (p, b), v in var.items()},
                             tree_depth_hist=depth_hist, tree_max_depth=max_depth,
                             gpu_eager_us=eager, cpu_heap_us=cpu, speedup=cpu / full,
                             gpu_prep_radix_us=prep_radix, gpu_prep_bound_us=prep_bound,
                             gpu_prep_us=prep, gpu_prep_chunked_us=prep_chunked, torch_topk_us=topk_only,
                             lse_row_kernel_us=lse_only, tie_fix_row_kernel_us=tie_only,
                             chunked_prep_kernels_us=chunked_kernels,
                             beam_kernel_us=beam, beam_select_us=beam_sel, beam_prune_us=beam_prune,
                             beam_prune_bound_us=bounds,
                             label_count_us=lab_cnt,
                             tree_mask_us=arrays, gpu_graph_torch_path_us=torch_arrays,
                             custom_mask_triton_us=mask_tri, custom_mask_torch_us=mask_tor))
            vtxt = " ".join(f"{p}+{b}={v:.1f}" for (p, b), v in var.items())
            print(f"{kind} bs={bs:3d} N={N:5d} default[{dflt[0]}+{dflt[1]}]={full:9.1f}us eager={eager:9.1f}us "
                  f"{vtxt} cpu_heap={cpu:11.1f}us x{cpu / full:7.1f} depth<={max_depth} | prep row={prep:.1f} "
                  f"chunked={prep_chunked:.1f} radix={prep_radix:.1f} bound={prep_bound:.1f} topk={topk_only:.1f} lse_k={lse_only:.1f} "
                  f"tie_k={tie_only:.1f} chunked_k={chunked_kernels:.1f} | beam sort={beam:.1f} "
                  f"select={beam_sel:.1f} prune={beam_prune:.1f} "
                  + "".join(f"prune[{k}]={v:.1f} " for k, v in bounds.items())
                  + f"label+links={lab_cnt:.1f} tree_mask={arrays:.1f} "
                  f"all_torch={torch_arrays:.1f} mask1024 tri={mask_tri:.1f} torch={mask_tor:.1f}", flush=True)
    meta = dict(date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                device=torch.cuda.get_device_name(), torch=torch.__version__, L=L, V=V,
                dtype=str(dtype).removeprefix("torch."), topk="K = N", cpu_threads=torch.get_num_threads())
    print(table(rows, meta))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(dict(meta=meta, rows=rows), f, indent=1)


def prep_only(a):
    """--prep-only: CUDA-graph medians of ``draft_topk(x, K, prep=p)`` per prep, beside the floor
    (one read of the logits: ``x.amax(-1)``) and bytes / 4.8 TB/s, one row per (dtype, kind, bs, K)."""
    dev = "cuda"
    L, V = a.depth, a.vocab
    preps = [p for p in a.preps.split(",") if p]
    if [p for p in preps if p not in PREPS]:
        raise SystemExit(f"--preps {a.preps}: choose from {PREPS}")
    old = None
    if a.against_revision is not None:
        import importlib

        from patchsets.ddtree.kernels import ddtree_prep as new_prep
        try:
            old = importlib.import_module(f"patchsets.ddtree.history.r{a.against_revision}.kernels.ddtree_prep")
        except ImportError as e:
            raise SystemExit(f"--against-revision {a.against_revision}: no frozen prep ({e})") from None
    rows = []
    for dname in a.dtype.split(","):
        dtype = DTYPES[dname]
        for kind, bs in [(k, int(v)) for k in a.kinds.split(",") for v in a.bs.split(",")]:
            x = draft_logits(bs, bs, L, V, dtype, kind=kind, device=dev)
            for K in [int(v) for v in a.budgets.split(",")]:
                use = [p for p in preps if dtype != torch.float32 or p not in PREPS_16BIT]
                ref = draft_topk(x, K, prep=use[0])
                for p in use[1:]:
                    got = draft_topk(x, K, prep=p)
                    if not torch.equal(got[1], ref[1]):
                        raise SystemExit(f"prep {p}: ids differ from {use[0]}'s ({dname} {kind} bs={bs} K={K})")
                times = {p: gpu_graph_median_us(lambda: draft_topk(x, K, prep=p), reps=100) for p in use}  # noqa: B023
                for p in [p for p in use if old is not None and p in OLD_PREPS]:
                    x2 = x.reshape(-1, V)
                    fn_new, fn_old = getattr(new_prep, OLD_PREPS[p]), getattr(old, OLD_PREPS[p])
                    for u, w in zip(fn_new(x2, K), fn_old(x2, K)):
                        if not (torch.equal(u.isnan(), w.isnan()) and torch.equal(u.nan_to_num(), w.nan_to_num())):
                            raise SystemExit(f"prep {p}: revision {a.against_revision}'s outputs differ "
                                             f"({dname} {kind} bs={bs} K={K})")
                    times[f"{p} (kernel)"] = gpu_graph_median_us(lambda: fn_new(x2, K), reps=100)  # noqa: B023
                    times[f"{p} r{a.against_revision}"] = gpu_graph_median_us(lambda: fn_old(x2, K), reps=100)  # noqa: B023
                floor = gpu_graph_median_us(lambda: x.amax(-1), reps=100)
                ideal = x.numel() * x.element_size() / 4.8e12 * 1e6
                rows.append(dict(dtype=dname, kind=kind, bs=bs, K=K, prep_us=times, floor_us=floor,
                                 ideal_us=ideal, default=prefer_prep(bs * L, dtype, K)))
                print(f"{dname} {kind} bs={bs} K={K} " + " ".join(f"{p}={v:.1f}" for p, v in times.items())
                      + f" floor={floor:.1f} ideal={ideal:.1f} default={rows[-1]['default']}", flush=True)
    meta = dict(date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                device=torch.cuda.get_device_name(), torch=torch.__version__, L=L, V=V)
    cols = list(dict.fromkeys(c for r in rows for c in r["prep_us"]))
    out = [f"Prep only — {meta['device']}, {meta['date']}, torch {meta['torch']}, L={L}, V={V}; "
           "CUDA-graph medians of 100 replays, µs", "",
           "| dtype | logits | bs | K | " + " | ".join(f"{p} µs" for p in cols)
           + " | floor: x.amax(-1) µs | bytes / 4.8 TB/s µs | default |",
           "|---|---|---:|---:|" + "---:|" * len(cols) + "---:|---:|---|"]
    for r in rows:
        out.append(f"| {r['dtype']} | {r['kind']} | {r['bs']} | {r['K']} | "
                   + " | ".join(f"{r['prep_us'][p]:.1f}" if p in r["prep_us"] else "–" for p in cols)
                   + f" | {r['floor_us']:.1f} | {r['ideal_us']:.1f} | {r['default']} |")
    print("\n".join(out))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(dict(meta=meta, rows=rows), f, indent=1)


def best(r):
    return min(r["variants"].values())


def table(rows, meta):
    names = list(rows[0]["variants"]) if rows else []
    out = [f"Tree build — {meta['device']}, {meta['date']}, torch {meta['torch']}, L={meta['L']}, "
           f"V={meta['V']}, {meta['dtype']} logits, K=N; CPU heap on {meta['cpu_threads']} threads",
           "", "| logits | bs | N | tree depth | default (variant) µs | " + " | ".join(f"{n} µs" for n in names)
           + " | eager µs | CPU heap µs | speed-up (default) | speed-up (best) |",
           "|---|---:|---:|---:|---:|" + "---:|" * len(names) + "---:|---:|---:|---:|"]
    for r in rows:
        out.append(f"| {r['kind']} | {r['bs']} | {r['N']} | {r['tree_max_depth']} | "
                   f"{r['gpu_graph_us']:.1f} ({r['default']}) | "
                   + " | ".join(f"{r['variants'][n]:.1f}" for n in names)
                   + f" | {r['gpu_eager_us']:.1f} | {r['cpu_heap_us']:.0f} | {r['speedup']:.0f}x | "
                   f"{r['cpu_heap_us'] / best(r):.0f}x |")
    out += ["", "| logits | bs | N | prep row / chunked / radix / bound µs | torch.topk µs | lse kernel / tie-fix kernel / "
            "chunked kernels µs | beam sort / select / prune µs | labels + links µs | tree mask µs "
            "| custom_mask Triton / torch µs |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        out.append(f"| {r['kind']} | {r['bs']} | {r['N']} | {r['gpu_prep_us']:.1f} / {r['gpu_prep_chunked_us']:.1f} / "
                   f"{r['gpu_prep_radix_us']:.1f} / {r['gpu_prep_bound_us']:.1f} | "
                   f"{r['torch_topk_us']:.1f} | {r['lse_row_kernel_us']:.1f} / {r['tie_fix_row_kernel_us']:.1f} / "
                   f"{r['chunked_prep_kernels_us']:.1f} | {r['beam_kernel_us']:.1f} / {r['beam_select_us']:.1f} / "
                   f"{r['beam_prune_us']:.1f} | "
                   f"{r['label_count_us']:.1f} | {r['tree_mask_us']:.1f} | {r['custom_mask_triton_us']:.1f} / "
                   f"{r['custom_mask_torch_us']:.1f} |")
    return "\n".join(out)


if __name__ == "__main__":
    main()
