"""Benchmark: DDTree construction, GPU batched builder vs the CPU heap reference (same run).

From bf16 draft logits [bs, L=15, V=151,936] to all arrays (tokens, parents, depths, scores,
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

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _timing import cpu_median_us, gpu_eager_median_us, gpu_graph_median_us  # noqa: E402

from patchsets.ddtree.modules.ddtree_kernels import beam_select_triton, beam_triton  # noqa: E402
from patchsets.ddtree.modules.ddtree_reference import build_tree_reference_from_topk  # noqa: E402
from patchsets.ddtree.modules.ddtree_tree import (  # noqa: E402
    build_custom_mask,
    build_ddtree,
    candidate_pairs,
    custom_mask_size,
    draft_topk,
)


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
    ap.add_argument("--no-torch-path", action="store_true",
                    help="skip timing the all-torch path (recorded in bench/RESULTS.md)")
    a = ap.parse_args()
    dev = "cuda"
    L, V = a.depth, a.vocab
    rows = []
    for bs in [int(v) for v in a.bs.split(",")]:
        x = (torch.randn(bs, L, V, device=dev) * 3).to(torch.bfloat16)
        roots = torch.randint(0, V, (bs,), device=dev)
        x_cpu = x.cpu()
        for N in [int(v) for v in a.budgets.split(",")]:
            full = gpu_graph_median_us(lambda: build_ddtree(x, roots, N, N), reps=50)
            eager = gpu_eager_median_us(lambda: build_ddtree(x, roots, N, N), reps=10)
            prep = gpu_graph_median_us(lambda: draft_topk(x, N), reps=50)
            prep16 = gpu_graph_median_us(lambda: draft_topk(x, N, topk_chunks=16), reps=50)
            prep_chunked = gpu_graph_median_us(lambda: draft_topk(x, N, prep="chunked"), reps=50)
            topk_only = gpu_graph_median_us(lambda: torch.topk(x, N, dim=-1), reps=50)
            lp, _, _ = draft_topk(x, N)
            ci, ck = candidate_pairs(N, lp.shape[-1], lp.device)
            beam = gpu_graph_median_us(lambda: beam_triton(lp, N, ci, ck), reps=50)
            beam_sel = gpu_graph_median_us(lambda: beam_select_triton(lp, N, ci, ck), reps=50)
            full_sel = gpu_graph_median_us(
                lambda: build_ddtree(x, roots, N, N, use_triton=True, beam="select"), reps=50)
            full_sel_ch = gpu_graph_median_us(
                lambda: build_ddtree(x, roots, N, N, use_triton=True, beam="select", prep="chunked"),
                reps=50)
            full_sort_ch = gpu_graph_median_us(
                lambda: build_ddtree(x, roots, N, N, use_triton=True, beam="sort", prep="chunked"),
                reps=50)
            torch_arrays = float("nan") if a.no_torch_path else gpu_graph_median_us(
                lambda: build_ddtree(x, roots, N, N, use_triton=False), reps=20)
            tree = build_ddtree(x, roots, N, N)
            pl = torch.full((bs,), 1024, dtype=torch.int64, device=dev)
            buf = torch.empty(custom_mask_size(1024 * bs, bs, N + 1), dtype=torch.bool, device=dev)
            mask_tri = gpu_graph_median_us(lambda: build_custom_mask(tree, pl, out=buf, use_triton=True))
            mask_tor = gpu_graph_median_us(lambda: build_custom_mask(tree, pl, out=buf, use_triton=False))
            nreq = min(bs, a.cpu_max_requests)

            def cpu_run():
                for b in range(nreq):
                    lp, ids, _ = draft_topk(x_cpu[b : b + 1], N)
                    build_tree_reference_from_topk(lp[0], ids[0], N)

            cpu = cpu_median_us(cpu_run, reps=a.cpu_reps) * bs / nreq
            rows.append(dict(bs=bs, N=N, gpu_graph_us=full, gpu_eager_us=eager, gpu_prep_us=prep,
                             cpu_heap_us=cpu, speedup=cpu / full,
                             gpu_graph_torch_path_us=torch_arrays, custom_mask_triton_us=mask_tri,
                             torch_topk_us=topk_only, beam_kernel_us=beam, gpu_prep_split16_us=prep16,
                             gpu_prep_chunked_us=prep_chunked, beam_select_us=beam_sel,
                             gpu_graph_select_us=full_sel, gpu_graph_select_chunked_us=full_sel_ch,
                             gpu_graph_sort_chunked_us=full_sort_ch,
                             speedup_select_chunked=cpu / full_sel_ch,
                             custom_mask_torch_us=mask_tor))
            print(f"bs={bs:3d} N={N:5d} gpu_graph={full:9.1f}us eager={eager:9.1f}us "
                  f"prep={prep:8.1f}us cpu_heap={cpu:11.1f}us x{cpu / full:7.1f} "
                  f"select={full_sel:.1f} select+chunked={full_sel_ch:.1f} sort+chunked={full_sort_ch:.1f} "
                  f"beam_select={beam_sel:.1f} x_best{cpu / min(full, full_sel, full_sel_ch, full_sort_ch):.1f} "
                  f"prep16={prep16:.1f} prep_chunked={prep_chunked:.1f} topk={topk_only:.1f} beam={beam:.1f} all_torch={torch_arrays:8.1f}us mask1024 tri={mask_tri:.1f} torch={mask_tor:.1f}",
                  flush=True)
    meta = dict(date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                device=torch.cuda.get_device_name(), torch=torch.__version__, L=L, V=V,
                dtype="bfloat16", topk="K = N", cpu_threads=torch.get_num_threads())
    print(table(rows, meta))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(dict(meta=meta, rows=rows), f, indent=1)


def table(rows, meta):
    out = [f"Tree build — {meta['device']}, {meta['date']}, torch {meta['torch']}, L={meta['L']}, "
           f"V={meta['V']}, bf16 logits, K=N; CPU heap on {meta['cpu_threads']} threads",
           "", "| bs | N | GPU graph µs | GPU eager µs | prep (lse+top-K+ties) µs | prep, 16-chunk top-K µs "
           "| prep, chunked kernels µs "
           "| one torch.topk µs "
           "| fused beam µs | CPU heap µs | speed-up | all-torch path, graph µs "
           "| custom_mask (prefix 1024) Triton / torch µs |",
           "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        out.append(f"| {r['bs']} | {r['N']} | {r['gpu_graph_us']:.1f} | {r['gpu_eager_us']:.1f} | "
                   f"{r['gpu_prep_us']:.1f} | {r['gpu_prep_split16_us']:.1f} | {r['gpu_prep_chunked_us']:.1f} | {r['torch_topk_us']:.1f} | {r['beam_kernel_us']:.1f} | "
                   f"{r['cpu_heap_us']:.0f} | {r['speedup']:.0f}x | "
                   f"{r['gpu_graph_torch_path_us']:.1f} | {r['custom_mask_triton_us']:.1f} / "
                   f"{r['custom_mask_torch_us']:.1f} |")
    out += ["", "| bs | N | default (row prep, sort beam) µs | select beam µs | chunked prep + select beam µs "
            "| chunked prep + sort beam µs | prep row / chunked µs | beam kernel sort / select µs "
            "| CPU heap µs | speed-up (chunked + select) |",
            "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        out.append(f"| {r['bs']} | {r['N']} | {r['gpu_graph_us']:.1f} | {r['gpu_graph_select_us']:.1f} | "
                   f"{r['gpu_graph_select_chunked_us']:.1f} | {r['gpu_graph_sort_chunked_us']:.1f} | "
                   f"{r['gpu_prep_us']:.1f} / {r['gpu_prep_chunked_us']:.1f} | "
                   f"{r['beam_kernel_us']:.1f} / {r['beam_select_us']:.1f} | {r['cpu_heap_us']:.0f} | "
                   f"{r['speedup_select_chunked']:.0f}x |")
    return "\n".join(out)


if __name__ == "__main__":
    main()
