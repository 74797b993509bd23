"""Scratch (not committed): pre-session beam (k3), the 32-bit scan (k4 = f4f9aaf) and the generated survivors (current), side by side."""
import sys, time, json, os, torch
sys.path.insert(0, "."); sys.path.insert(0, "bench")
from _timing import gpu_graph_median_us as G
from patchsets.ddtree.modules import ddtree_kernels as NEW
from scratch_gpu import k3_kernels as OLD
from patchsets.ddtree.modules.ddtree_tree import candidate_pairs, draft_topk, build_ddtree
from tests.support.ddtree import draft_logits
dev = "cuda"; V = 151936; L = 15
t0 = time.time(); res = []
print("| kind | bs | N | same gen | same scan | k3 us | scan us | gen us | k3/gen | total us |", flush=True)
rows = [("peaked", 1, 512), ("peaked", 1, 1024), ("peaked", 1, 256), ("peaked", 64, 256), ("peaked", 1, 64),
        ("peaked", 8, 512), ("normal", 1, 512), ("normal", 1, 1024), ("peaked", 64, 16), ("ties", 1, 1024),
        ("normal", 64, 256), ("peaked", 8, 1024)]
for kind, bs, N in rows:
    try:
        x = draft_logits(bs * 7 + N, bs, L, V, torch.bfloat16, kind=kind, device=dev)
        roots = torch.randint(0, V, (bs,), device=dev)
        lp, ids, _ = draft_topk(x, N)
        ci, ck = candidate_pairs(N, lp.shape[-1], dev)
        o = OLD.beam_prune_triton(lp, N, ci, ck)
        g = NEW.beam_prune_triton(lp, N, ci, ck); s = NEW.beam_prune_triton(lp, N, ci, ck, gen=False)
        sg = all(torch.equal(a, b) for a, b in zip(o, g)); ss = all(torch.equal(a, b) for a, b in zip(o, s))
        to = G(lambda: OLD.beam_prune_triton(lp, N, ci, ck)); tg = G(lambda: NEW.beam_prune_triton(lp, N, ci, ck))
        ts = G(lambda: NEW.beam_prune_triton(lp, N, ci, ck, gen=False))
        tot = G(lambda: build_ddtree(x, roots, N, N)) if kind != "ties" else float("nan")
        res.append(dict(kind=kind, bs=bs, N=N, same_gen=sg, same_scan=ss, k3=to, scan=ts, gen=tg, total=tot))
        print(f"| {kind} | {bs} | {N} | {sg} | {ss} | {to:.1f} | {ts:.1f} | {tg:.1f} | {to/tg:.2f} | {tot:.1f} |", flush=True)
    except Exception:
        import traceback; traceback.print_exc()
    if time.time() - t0 > float(os.environ.get("MAXS", "150")):
        break
print(f"elapsed {time.time()-t0:.0f}s")
json.dump(res, open(os.path.join(os.environ.get("OUT", "/tmp"), "micro4.json"), "w"), indent=1)
