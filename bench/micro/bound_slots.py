"""Micro bench: the bound prep's pass B, candidate slots by a block prefix sum ("scan", the
package's) against one relaxed atomic per candidate ("lanes"), side by side in one run.

For each (logits kind, bs, K) on bf16 logits [bs * 15, 151,936]: both variants' outputs are
checked equal (lp, ids, lse, bit for bit) and their CUDA-graph replay medians (µs) are printed
with the ratio scan / lanes, over three alternating rounds; then the whole tree
(``build_ddtree``, logits to all arrays) with each variant as the bound prep's default. Also
checks equality on 200 random smaller inputs (ties, -inf, NaN, caps that force the fallback).
Needs CUDA.
"""

from __future__ import annotations

import os
import statistics
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "bench"))

from _timing import gpu_graph_median_us  # noqa: E402

from patchsets.ddtree.modules import ddtree_kernels as KR  # noqa: E402
from patchsets.ddtree.modules.ddtree_tree import build_ddtree  # noqa: E402
from tests.support.ddtree import draft_logits  # noqa: E402


def same(a, b) -> bool:
    return all(torch.equal(u.isnan(), v.isnan()) and torch.equal(u.nan_to_num(), v.nan_to_num())
               for u, v in zip(a, b))


def main() -> None:
    dev = "cuda"
    bad = 0
    for seed in range(200):
        V = [37, 200, 4096, 20000, 151936][seed % 5]
        k = max(1, (seed * 7919) % min(V, 1024))
        dtype = torch.bfloat16 if seed % 2 else torch.float16
        x = draft_logits(seed, 1, 4, V, dtype, kind=("normal", "peaked", "ties")[seed % 3]).reshape(4, V).to(dev)
        if seed % 4 == 0:
            x[:, : V // 4] = float("-inf")
        if seed % 7 == 1:
            x.view(-1)[torch.randint(0, x.numel(), (3,), device=dev)] = float("nan")
        cap = None if seed % 3 else k + 2
        chunk = 64 if V < 4096 else 4096
        a = KR.topk_bound_triton(x, k, chunk=chunk, sub_block=64, cap=cap)
        b = KR.topk_bound_triton(x, k, chunk=chunk, sub_block=64, cap=cap, slots="lanes")
        bad += not same(a, b)
    print(f"random inputs: {200 - bad} of 200 equal")
    print("| logits | bs | K | scan µs | lanes µs | scan / lanes |")
    print("|---|---:|---:|---:|---:|---:|")
    for kind in ("peaked", "normal"):
        for bs, k in ((1, 512), (1, 1024), (8, 512), (64, 256), (64, 512), (64, 1024)):
            x = draft_logits(bs, bs, 15, 151_936, torch.bfloat16, kind=kind, device=dev).reshape(bs * 15, -1)
            if not same(KR.topk_bound_triton(x, k), KR.topk_bound_triton(x, k, slots="lanes")):
                raise SystemExit(f"outputs differ: {kind} bs {bs} K {k}")
            t = {"scan": [], "lanes": []}
            for _ in range(3):
                for s in ("scan", "lanes"):
                    t[s].append(gpu_graph_median_us(lambda: KR.topk_bound_triton(x, k, slots=s), reps=100))  # noqa: B023
            a, b = statistics.median(t["scan"]), statistics.median(t["lanes"])
            print(f"| {kind} | {bs} | {k} | {a:.1f} | {b:.1f} | {a / b:.2f}× |", flush=True)

    print("\n| whole tree | bs | N | scan µs | lanes µs | scan / lanes |")
    print("|---|---:|---:|---:|---:|---:|")
    defaults = KR.topk_bound_triton.__defaults__  # (chunk, sub_block, cap, slots)
    for kind, bs, n in (("peaked", 1, 512), ("normal", 1, 512), ("peaked", 8, 512), ("peaked", 64, 256),
                        ("normal", 64, 256), ("peaked", 64, 1024)):
        x = draft_logits(bs, bs, 15, 151_936, torch.bfloat16, kind=kind, device=dev)
        roots = torch.zeros(bs, dtype=torch.int64, device=dev)
        t = {"scan": [], "lanes": []}
        trees = {}
        for _ in range(3):
            for s in ("scan", "lanes"):
                KR.topk_bound_triton.__defaults__ = defaults[:3] + (s,)
                trees[s] = build_ddtree(x, roots, n, n)
                t[s].append(gpu_graph_median_us(lambda: build_ddtree(x, roots, n, n), reps=100))  # noqa: B023
        KR.topk_bound_triton.__defaults__ = defaults
        if not all(torch.equal(getattr(trees["scan"], f), getattr(trees["lanes"], f))
                   for f in ("tokens", "parents", "tree_mask", "retrieve_next_token")):
            raise SystemExit(f"trees differ: {kind} bs {bs} N {n}")
        a, b = statistics.median(t["scan"]), statistics.median(t["lanes"])
        print(f"| {kind} | {bs} | {n} | {a:.1f} | {b:.1f} | {a / b:.2f}× |", flush=True)


if __name__ == "__main__":
    main()
