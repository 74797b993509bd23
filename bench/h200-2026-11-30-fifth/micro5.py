"""Scratch (not committed as code to maintain): session 5 kernels against 0c4f5ae (k5), side by side.
Beam (bench inputs draft_logits(bs, bs, ...), as bench/tree_build.py), bound prep, labels + links."""
import sys, time, json, os, torch
sys.path.insert(0, "."); sys.path.insert(0, "bench")
from _timing import gpu_graph_median_us as G
from patchsets.ddtree.modules import ddtree_kernels as NEW
from scratch_gpu import k5_kernels as OLD
from patchsets.ddtree.modules.ddtree_tree import candidate_pairs, draft_topk, build_ddtree
from tests.support.ddtree import draft_logits
dev = "cuda"; V = 151936; L = 15
t0 = time.time(); res = []
OUT = os.environ.get("OUT", "/tmp")
def same(a, b):
    return all(torch.equal(x, y) for x, y in zip(a, b))
print("| kind | bs | N | same gw2 | same gw1 | old beam us | gw1 us | gw2 us | gw4 us | old/gw2 | total us |", flush=True)
rows = [("peaked", 1, 512), ("peaked", 1, 1024), ("peaked", 1, 256), ("peaked", 64, 256), ("peaked", 8, 512),
        ("normal", 1, 512), ("ties", 1, 1024), ("peaked", 1, 64), ("peaked", 64, 16)]
for kind, bs, N in rows:
    if time.time() - t0 > float(os.environ.get("MICRO_S", "200")):
        print("out of time at", kind, bs, N); break
    try:
        x = draft_logits(bs, bs, L, V, torch.bfloat16, kind=kind, device=dev)
        roots = torch.randint(0, V, (bs,), device=dev)
        lp, ids, _ = draft_topk(x, N)
        ci, ck = candidate_pairs(N, lp.shape[-1], dev)
        o = OLD.beam_prune_triton(lp, N, ci, ck)
        n2 = NEW.beam_prune_triton(lp, N, ci, ck); n1 = NEW.beam_prune_triton(lp, N, ci, ck, gen_wide=1)
        s2, s1 = same(o, n2), same(o, n1)
        to = G(lambda: OLD.beam_prune_triton(lp, N, ci, ck)); t2 = G(lambda: NEW.beam_prune_triton(lp, N, ci, ck))
        t1 = G(lambda: NEW.beam_prune_triton(lp, N, ci, ck, gen_wide=1))
        t4 = G(lambda: NEW.beam_prune_triton(lp, N, ci, ck, gen_wide=4)) if (bs, N) in ((1, 512), (1, 1024)) else float("nan")
        tot = G(lambda: build_ddtree(x, roots, N, N)) if kind != "ties" else float("nan")
        res.append(dict(part="beam", kind=kind, bs=bs, N=N, same_gw2=s2, same_gw1=s1, old=to, gw1=t1, gw2=t2, gw4=t4, total=tot))
        print(f"| {kind} | {bs} | {N} | {s2} | {s1} | {to:.1f} | {t1:.1f} | {t2:.1f} | {t4:.1f} | {to/t2:.2f} | {tot:.1f} |", flush=True)
    except Exception:
        import traceback; traceback.print_exc()
print("\n| part | kind | bs | N | same | old us | new us | old/new |", flush=True)
for kind, bs, N in [("peaked", 1, 512), ("normal", 1, 1024), ("peaked", 64, 256), ("ties", 1, 512)]:
    try:
        x = draft_logits(bs, bs, L, V, torch.bfloat16, kind=kind, device=dev)
        x2 = x.reshape(bs * L, V)
        a, b = OLD.topk_bound_triton(x2, N), NEW.topk_bound_triton(x2, N)
        to = G(lambda: OLD.topk_bound_triton(x2, N)); tn = G(lambda: NEW.topk_bound_triton(x2, N))
        res.append(dict(part="prep_bound", kind=kind, bs=bs, N=N, same=same(a, b), old=to, new=tn))
        print(f"| prep bound | {kind} | {bs} | {N} | {same(a, b)} | {to:.1f} | {tn:.1f} | {to/tn:.2f} |", flush=True)
        roots = torch.randint(0, V, (bs,), device=dev)
        lp, ids, _ = draft_topk(x, N)
        ci, ck = candidate_pairs(N, lp.shape[-1], dev)
        bo = NEW.beam_prune_triton(lp, N, ci, ck)
        nb = torch.full((bs,), N, dtype=torch.int64, device=dev)
        def old_lab():
            lo = OLD.label_count_triton(bo[4], nb, roots, ids, bo[0], bo[2], bo[3], N)
            return lo + OLD.tree_arrays_triton(lo[1], lo[3], L)
        def new_lab():
            lo = NEW.label_count_triton(bo[4], nb, roots, ids, bo[0], bo[2], bo[3], N, links=True)
            return lo + (NEW.tree_mask_triton(lo[1], lo[3], L),)
        a, b = old_lab(), new_lab()
        ok = same(a[:6], b[:6]) and same(a[6:], b[6:])
        to = G(old_lab); tn = G(new_lab)
        res.append(dict(part="labels+arrays", kind=kind, bs=bs, N=N, same=ok, old=to, new=tn))
        print(f"| labels+arrays | {kind} | {bs} | {N} | {ok} | {to:.1f} | {tn:.1f} | {to/tn:.2f} |", flush=True)
    except Exception:
        import traceback; traceback.print_exc()
json.dump(res, open(os.path.join(OUT, "micro5.json"), "w"), indent=1)
print(f"micro5 done in {time.time() - t0:.0f} s")
