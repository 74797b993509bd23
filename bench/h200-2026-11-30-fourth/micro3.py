"""Scratch (not committed): pre-session pruned beam (k3) vs the 32-bit candidate pass + head bound + wide tiers."""
import sys, time, json, os, torch
sys.path.insert(0, "."); sys.path.insert(0, "bench")
from _timing import gpu_graph_median_us as G
from patchsets.ddtree.modules import ddtree_kernels as NEW
from scratch_gpu import k3_kernels as OLD
from patchsets.ddtree.modules.ddtree_tree import candidate_pairs, draft_topk, build_ddtree
from tests.support.ddtree import draft_logits
dev = "cuda"; V = 151936; L = 15
t0 = time.time(); res = []
print("| kind | bs | N | same | same w11 | old us | new us | ratio | new w(1,1) us | total new us |", flush=True)
rows = [(1, 512), (1, 1024), (64, 256), (1, 16), (1, 64), (1, 256), (8, 512), (8, 1024), (8, 16), (64, 16), (64, 64)]
for kind in ("peaked", "normal", "ties"):
    for bs, N in rows:
        if kind == "ties" and bs == 64: continue
        try:
            x = draft_logits(bs * 7 + N, bs, L, V, torch.bfloat16, kind=kind, device=dev)
            roots = torch.randint(0, V, (bs,), device=dev)
            lp, ids, _ = draft_topk(x, N)
            ci, ck = candidate_pairs(N, lp.shape[-1], dev)
            o = OLD.beam_prune_triton(lp, N, ci, ck); n = NEW.beam_prune_triton(lp, N, ci, ck)
            w = NEW.beam_prune_triton(lp, N, ci, ck, wide=(1, 1))
            same = all(torch.equal(a, b) for a, b in zip(o, n))
            same_w = all(torch.equal(a, b) for a, b in zip(o, w))
            to = G(lambda: OLD.beam_prune_triton(lp, N, ci, ck)); tn = G(lambda: NEW.beam_prune_triton(lp, N, ci, ck))
            tw = G(lambda: NEW.beam_prune_triton(lp, N, ci, ck, wide=(1, 1))) if N >= 256 else float("nan")
            tot = G(lambda: build_ddtree(x, roots, N, N)) if kind != "ties" else float("nan")
            r = dict(kind=kind, bs=bs, N=N, same=same, same_w=same_w, old=to, new=tn, w11=tw, total=tot)
            res.append(r)
            print(f"| {kind} | {bs} | {N} | {same} | {same_w} | {to:.1f} | {tn:.1f} | {to/tn:.2f} | {tw:.1f} | {tot:.1f} |", flush=True)
        except Exception:
            import traceback; traceback.print_exc()
        if time.time() - t0 > float(os.environ.get("MAXS", "400")):
            break
print(f"elapsed {time.time()-t0:.0f}s")
json.dump(res, open(os.path.join(os.environ.get("OUT", "/tmp"), "micro3.json"), "w"), indent=1)
