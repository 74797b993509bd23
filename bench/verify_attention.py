"""Benchmark: the target's verify attention, DDTree's kernel against SGLang's (issue 17).

For a Qwen3-8B-shaped target (36 layers, 32 query / 8 KV heads of 128, bf16, KV context
``--context`` per request, each layer its own KV pool so nothing is served from L2 that a forward
would not find there), one CUDA graph per arm runs the attention of all layers for a verify of T
tokens per request; the figure is the median replay. Arms, side by side in one process:

  sglang-causal  SGLang 0.5.23's triton ``extend_attention_fwd``, causal (DFLASH's chain verify)
  sglang-tree    the same kernel with a tree ``custom_mask`` (DDTREE's verify as shipped)
  ddtree-tree    ``ddtree_verify_attention.tree_verify_attention_fwd`` with the same mask
  ddtree-chain   the same kernel without a mask: causal (DDTREE's chain steps from ddtree revision 12,
                 and what it would cost DFLASH)

Trees: random parents (each node's parent among the earlier nodes, biased to recent ones, so
trees are deep and branch). Before timing, each (batch, width) checks the DDTree kernel against
SGLang's on layer 0 (relative error of the outputs), its causal run against SGLang's causal one,
and that the causal run differs from the tree's (the control). ``--configs`` sweeps the DDTree kernel's launch knobs
(``BLOCK_N:warps:stages``, the tree part then BLOCK_N keys a step too; ``auto``: the kernel's
``tree_verify_launch``; ``r12``: revision 12's launch rule, to measure a new rule against it side by
side); the table shows the best per row and the JSON every one.

Usage (the SGLang kernel source as bench/decode_step.py takes it):
  python3 bench/verify_attention.py --sglang-src .gpu/sglang-0.5.23-attention-kernels.zip \\
      --bs 1,4,16,64 --widths 16,33,65 --out verify_attention.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time
from types import SimpleNamespace
from typing import Dict, List, Optional, Tuple

import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.join(REPO, "bench"))

from decode_step import capture, load_sglang_extend_attention, med, replay_ms  # noqa: E402
from patchsets.ddtree.modules.ddtree_tree import build_custom_mask  # noqa: E402
from patchsets.ddtree.kernels.ddtree_verify_attention import (  # noqa: E402
    tree_verify_attention_fwd,
    tree_verify_kv_splits,
    tree_verify_row_blocks,
)

def random_tree_masks(bs: int, T: int, gen: torch.Generator) -> torch.Tensor:
    """[bs, T, T] bool ancestor-or-self masks; node j's parent is drawn from the 4 nodes before it."""
    masks = torch.zeros(bs, T, T, dtype=torch.bool)
    masks[:, 0, 0] = True
    for j in range(1, T):
        par = j - 1 - torch.randint(0, min(j, 4), (bs,), generator=gen)
        masks[:, j] = masks[torch.arange(bs), par]
        masks[:, j, j] = True
    return masks


def flat_custom_mask(masks: torch.Tensor, P: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """SGLang's FULL_MASK layout (``ddtree_tree.build_custom_mask``) for requests of one prefix
    length P: (flat bool, mask_indptr)."""
    bs, T, _ = masks.shape
    tree = SimpleNamespace(tokens=torch.zeros(bs, T, dtype=torch.long), tree_mask=masks)
    flat = build_custom_mask(tree, torch.full((bs,), P, dtype=torch.int64), use_triton=False)
    return flat, torch.arange(bs + 1, dtype=torch.int64) * (T * (P + T))


class Problem:
    def __init__(self, bs: int, T: int, P: int, layers: int, hq: int, hkv: int, d: int, seed: int):
        dev, dt = "cuda", torch.bfloat16
        g = torch.Generator().manual_seed(seed)
        self.bs, self.T, self.P, self.layers = bs, T, P, layers
        self.q = torch.randn(bs * T, hq, d, device=dev, dtype=dt)
        self.k = torch.randn(bs * T, hkv, d, device=dev, dtype=dt)
        self.v = torch.randn(bs * T, hkv, d, device=dev, dtype=dt)
        slots = bs * P + 1
        self.kb = [torch.randn(slots, hkv, d, device=dev, dtype=dt) for _ in range(layers)]
        self.vb = [torch.randn(slots, hkv, d, device=dev, dtype=dt) for _ in range(layers)]
        self.qo_indptr = (torch.arange(bs + 1, dtype=torch.int32) * T).to(dev)
        self.kv_indptr = (torch.arange(bs + 1, dtype=torch.int32) * P).to(dev)
        self.kv_indices = torch.arange(1, bs * P + 1, dtype=torch.int64, device=dev)  # slot 0: padding
        tree = random_tree_masks(bs, T, g)
        m, self.mask_indptr = flat_custom_mask(tree, P)
        self.tree_mask = m.to(dev)
        self.mask_indptr = self.mask_indptr.to(dev)
        self.o = torch.empty_like(self.q)
        self.scale = d ** -0.5

    def kv_bytes(self) -> int:
        """Bytes of K and V one pass over all layers must read (prefix + tree tokens)."""
        per = self.kb[0].shape[1] * self.kb[0].shape[2] * self.kb[0].element_size() * 2
        return self.layers * self.bs * (self.P + self.T) * per


def knobs_r12(bs: int, T: int) -> Tuple[int, int, int]:
    """Revision 12's ``tree_verify_launch`` at this shape (the tree part BLOCK_N keys a step too),
    kept to measure the current rule against, side by side."""
    bm, mb = tree_verify_row_blocks(T, 4)
    programs = bs * mb * 8
    if bm < 128:
        return (64, 4, 3) if programs >= 512 else (32, 4, 2)
    if programs >= 1024:
        return 32, 4, 2
    return (64, 8, 2) if mb <= 2 else (128, 8, 2)


def arm_fn(p: Problem, arm: str, sgl, knobs: Optional[Tuple[int, int, int]], splits: int,
           block_t: Optional[int] = None):
    bn, warps, stages = knobs or (None, None, None)  # None: the kernel's own choice (tree_verify_launch)

    def layer(li: int):
        if arm.startswith("sglang"):
            causal = arm == "sglang-causal"
            sgl(p.q, p.k, p.v, p.o, p.kb[li], p.vb[li], p.qo_indptr, p.kv_indptr, p.kv_indices,
                None if causal else p.tree_mask, causal, p.mask_indptr, p.T, 1.0, 1.0, sm_scale=p.scale)
        else:
            mask, indptr = (p.tree_mask, p.mask_indptr) if arm == "ddtree-tree" else (None, None)
            tree_verify_attention_fwd(p.q, p.k, p.v, p.o, p.kb[li], p.vb[li], p.qo_indptr, p.kv_indptr,
                                      p.kv_indices, mask, indptr, p.T, p.scale, num_kv_splits=splits,
                                      block_n=bn, num_warps=warps, num_stages=stages, block_t=block_t)

    def run():
        for li in range(p.layers):
            layer(li)
        return p.o

    return run, layer


def check(p: Problem, sgl, splits: int) -> Dict[str, float]:
    """DDTree kernel vs SGLang's on layer 0 (tree mask; causal), and the control (causal vs tree)."""
    def one(arm):
        _, layer = arm_fn(p, arm, sgl, (64, 4, 2), splits)
        layer(0)
        torch.cuda.synchronize()
        return p.o.float().clone()

    ref, ours, chain = one("sglang-tree"), one("ddtree-tree"), one("ddtree-chain")
    causal = one("sglang-causal")
    err = float((ours - ref).norm() / ref.norm())
    err_causal = float((chain - causal).norm() / causal.norm())
    ctl = float((chain - ref).norm() / ref.norm())
    if not (err < 1e-2 and err_causal < 1e-2 and ctl > 10 * max(err, err_causal)):
        raise SystemExit(f"CHECK FAILED bs {p.bs} T {p.T}: rel err {err:.2e}, causal {err_causal:.2e}, "
                         f"chain control {ctl:.2e}")
    return {"rel_err": err, "rel_err_causal": err_causal, "chain_control": ctl}


def time_graph(run, reps: int) -> float:
    """Median ms of ``reps`` replays of ``run`` captured as one CUDA graph (decode_step's helpers)."""
    g, _ = capture(run, warmup=2)
    return med(replay_ms([g], reps))


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sglang-src", help="SGLang 0.5.23 wheel or kernel zip (see bench/decode_step.py)")
    ap.add_argument("--bs", default="1,4,16,64")
    ap.add_argument("--widths", default="16,33,65", help="tokens per request T = N + 1")
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=36)
    ap.add_argument("--configs", default="auto,64:4:2,32:4:2,64:4:3,64:8:2,128:8:2",
                    help="DDTree kernel knobs to sweep, BLOCK_N:warps:stages; auto: the kernel's default")
    ap.add_argument("--tree-blocks", default="", help="also time the tree part's keys per step "
                    "(BLOCK_T) at these values, with the row's best knobs, e.g. 16,32")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--max-seconds", type=float, default=0, help="stop starting rows after this long")
    ap.add_argument("--out", help="JSON of every row")
    a = ap.parse_args(argv)
    sgl, sgl_desc = load_sglang_extend_attention(a.sglang_src)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    configs = [c if c in ("auto", "r12") else tuple(int(x) for x in c.split(":")) for c in a.configs.split(",")]
    t0 = time.time()
    rows = []
    head = (f"Verify attention — {torch.cuda.get_device_name(0)} — "
            f"{datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds')} — "
            f"{a.layers} layers, 32/8 heads of 128, bf16, context {a.context}; SGLang: {sgl_desc}")
    print(head, flush=True)
    for bs in [int(x) for x in a.bs.split(",")]:
        for T in [int(x) for x in a.widths.split(",")]:
            if a.max_seconds and time.time() - t0 > a.max_seconds:
                print(f"stopping: --max-seconds {a.max_seconds} reached", flush=True)
                break
            p = Problem(bs, T, a.context, a.layers, 32, 8, 128, seed=bs * 1000 + T)
            row_configs = [None if c == "auto" else knobs_r12(bs, T) if c == "r12" else c for c in configs]
            splits = tree_verify_kv_splits(bs, 8, tree_verify_row_blocks(T, 4)[1], sms)
            chk = check(p, sgl, splits)
            ms: Dict[str, float] = {}
            for arm in ("sglang-causal", "sglang-tree"):
                ms[arm] = time_graph(arm_fn(p, arm, sgl, None, splits)[0], a.reps)
            sweep = {}
            for name, c in zip(configs, row_configs):
                sweep[name if isinstance(name, str) else ":".join(map(str, c))] = time_graph(
                    arm_fn(p, "ddtree-tree", sgl, c, splits)[0], a.reps)
            best = min(sweep, key=sweep.get)
            ms["ddtree-tree"] = sweep[best]
            if "auto" in sweep:
                ms["ddtree-tree (auto)"] = sweep["auto"]
            if "r12" in sweep:
                ms["ddtree-tree (r12)"] = sweep["r12"]
                ms["ddtree-chain (r12)"] = time_graph(arm_fn(p, "ddtree-chain", sgl, knobs_r12(bs, T), splits)[0],
                                                      a.reps)
            knobs = (None if best == "auto" else knobs_r12(bs, T) if best == "r12"
                     else tuple(int(x) for x in best.split(":")))
            ms["ddtree-chain"] = time_graph(arm_fn(p, "ddtree-chain", sgl, knobs, splits)[0], a.reps)
            for bt in [int(x) for x in a.tree_blocks.split(",") if x]:
                for arm in ("ddtree-tree", "ddtree-chain"):
                    ms[f"{arm} (BLOCK_T {bt})"] = time_graph(arm_fn(p, arm, sgl, knobs, splits, block_t=bt)[0],
                                                             a.reps)
            # the SGLang arms again, after ours: drift within the row shows here
            ms["sglang-tree (repeat)"] = time_graph(arm_fn(p, "sglang-tree", sgl, None, splits)[0], a.reps)
            floor_ms = p.kv_bytes() / 4.2e12 * 1e3
            row = {"bs": bs, "T": T, "splits": splits, "best_config": best, "sweep_ms": sweep,
                   "ms": ms, "kv_floor_ms_at_4.2TBps": floor_ms, **chk}
            rows.append(row)
            print(json.dumps(row), flush=True)
            del p
            torch.cuda.empty_cache()
    lines = ["", head, "", "All layers' attention per verify pass, ms (median CUDA-graph replay)", "",
             "| bs | T | SGLang causal (DFLASH) | SGLang tree (repeat) | DDTree tree, best (default) | DDTree causal | "
             "SGLang tree / DDTree tree | SGLang causal / DDTree causal | DDTree tree / SGLang causal | "
             "DDTree tree / causal | revision 12's launch: tree, causal | KV floor | "
             "splits, best knobs | rel err (tree, causal) |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|"]
    for r in rows:
        m = r["ms"]
        lines.append(f"| {r['bs']} | {r['T']} | {m['sglang-causal']:.3f} | {m['sglang-tree']:.3f} "
                     f"({m['sglang-tree (repeat)']:.3f}) | {m['ddtree-tree']:.3f} ({m.get('ddtree-tree (auto)', float('nan')):.3f}) | "
                     f"{m['ddtree-chain']:.3f} | "
                     f"{m['sglang-tree'] / m['ddtree-tree']:.2f}x | {m['sglang-causal'] / m['ddtree-chain']:.2f}x | "
                     f"{m['ddtree-tree'] / m['sglang-causal']:.2f}x | {m['ddtree-tree'] / m['ddtree-chain']:.2f}x | "
                     + (f"{m['ddtree-tree (r12)']:.3f}, {m['ddtree-chain (r12)']:.3f} | " if "ddtree-tree (r12)" in m
                        else "– | ")
                     + f"{r['kv_floor_ms_at_4.2TBps']:.3f} | {r['splits']}, {r['best_config']} | "
                     f"{r['rel_err']:.1e}, {r['rel_err_causal']:.1e} |")
    print("\n".join(lines), flush=True)
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"head": head, "command": " ".join(sys.argv), "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
