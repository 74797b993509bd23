"""Benchmark: the greedy tree walk on the GPU (our Triton kernel, our torch path, SGLang 0.5.23's
``verify_tree_greedy_func`` JIT CUDA kernel when importable) vs the CPU reference walk.

Trees from ``build_ddtree`` (bs, N as in tree_build.py, L = 15), target picks that follow the
tree 80% of the time. GPU: median CUDA-graph replay. CPU: ``greedy_walk_reference`` per request.
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

from _timing import cpu_median_us, gpu_graph_median_us  # noqa: E402

from patchsets.ddtree.modules.ddtree_accept import accepted_flat_indices, greedy_accept  # noqa: E402
from patchsets.ddtree.modules.ddtree_reference import greedy_walk_reference  # noqa: E402
from patchsets.ddtree.modules.ddtree_tree import build_ddtree  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bs", default="1,8,64")
    ap.add_argument("--budgets", default="16,64,256,512,1024")
    ap.add_argument("--vocab", type=int, default=151_936)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    dev = "cuda"
    L, V = 15, a.vocab
    try:
        from sglang.kernels.ops.speculative.spec_tree import verify_tree_greedy_func
    except Exception as e:  # noqa: BLE001
        print(f"sglang not importable ({e!r}); skipping its column")
        verify_tree_greedy_func = None
    rows = []
    for bs in [int(v) for v in a.bs.split(",")]:
        x = (torch.randn(bs, L, V, device=dev) * 3).to(torch.bfloat16)
        for N in [int(v) for v in a.budgets.split(",")]:
            tree = build_ddtree(x, torch.randint(0, V, (bs,), device=dev), N, N)
            follow = torch.gather(tree.tokens, 1, tree.retrieve_next_token.clamp(min=0))
            tgt = torch.where(torch.rand(bs, N + 1, device=dev) < 0.8, follow,
                              torch.randint(0, V, (bs, N + 1), device=dev))
            tri = gpu_graph_median_us(lambda: accepted_flat_indices(tree, greedy_accept(tree, tgt, use_triton=True)))
            tor = gpu_graph_median_us(lambda: accepted_flat_indices(tree, greedy_accept(tree, tgt, use_triton=False)))
            sgl = float("nan")
            if verify_tree_greedy_func is not None:
                pred = torch.empty(bs * (N + 1), dtype=torch.int32, device=dev)
                aidx = torch.full((bs, L + 1), -1, dtype=torch.int32, device=dev)
                anum = torch.empty(bs, dtype=torch.int32, device=dev)

                def sg():
                    verify_tree_greedy_func(pred, aidx, anum, tree.tokens, tree.retrieve_index,
                                            tree.retrieve_next_token, tree.retrieve_next_sibling, tgt)

                try:
                    sgl = gpu_graph_median_us(sg)
                except Exception as e:  # noqa: BLE001 (e.g. a launch that cannot be captured)
                    print(f"sglang kernel not graph-capturable here: {e!r}")
                    torch.cuda.synchronize()
                    from _timing import gpu_eager_median_us

                    sgl = gpu_eager_median_us(sg)
            tok, par, val, tg = tree.tokens.cpu(), tree.parents.cpu(), tree.valid.cpu(), tgt.cpu()
            cpu = cpu_median_us(lambda: [greedy_walk_reference(tok[b], par[b], tg[b], val[b]) for b in range(bs)])
            acc = float(greedy_accept(tree, tgt).accept_length.float().mean())
            rows.append(dict(bs=bs, N=N, triton_us=tri, torch_us=tor, sglang_us=sgl, cpu_ref_us=cpu,
                             mean_accept=acc))
            print(f"bs={bs:3d} N={N:5d} triton={tri:7.1f}us torch={tor:7.1f}us sglang={sgl:7.1f}us "
                  f"cpu_ref={cpu:10.1f}us accept={acc:.2f}", flush=True)
    meta = dict(date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                device=torch.cuda.get_device_name(), torch=torch.__version__)
    lines = [f"Greedy walk (+ accepted flat indices) — {meta['device']}, {meta['date']}", "",
             "| bs | N | ours Triton µs | ours torch µs | SGLang verify_tree_greedy_func µs | CPU ref µs | mean accept |",
             "|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['bs']} | {r['N']} | {r['triton_us']:.1f} | {r['torch_us']:.1f} | "
                     f"{r['sglang_us']:.1f} | {r['cpu_ref_us']:.0f} | {r['mean_accept']:.2f} |")
    print("\n".join(lines))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(dict(meta=meta, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
