"""Scratch micro-benchmark (not committed): old vs new pruned beam and labels, side by side."""
import os, sys, time, json, statistics, torch, triton
sys.path.insert(0, "."); sys.path.insert(0, "bench")
from _timing import gpu_graph_median_us as G
from patchsets.ddtree.modules import ddtree_kernels as NEW
from scratch_gpu import old_kernels as OLD
from patchsets.ddtree.modules.ddtree_tree import candidate_pairs, draft_topk, build_ddtree, prefer_prep
from tests.support.ddtree import draft_logits, assert_prune_beam_matches
dev = "cuda"; V = 151936; L = 15
res = []
def line(*a):
    print(*a, flush=True)
t0 = time.time()
for kind in ("normal", "peaked"):
    for bs, N in [(1, 16), (1, 64), (1, 256), (1, 512), (1, 1024), (8, 512), (64, 256)]:
      try:
        x = draft_logits(bs * 7 + N, bs, L, V, torch.bfloat16, kind=kind, device=dev)
        roots = torch.randint(0, V, (bs,), device=dev)
        lp, ids, _ = draft_topk(x, N)
        ci, ck = candidate_pairs(N, lp.shape[-1], dev)
        o = OLD.beam_prune_triton(lp, N, ci, ck); n = NEW.beam_prune_triton(lp, N, ci, ck)
        same = all(torch.equal(a, b) for a, b in zip(o, n))
        ts = G(lambda: NEW.beam_triton(lp, N, ci, ck)) if N <= 64 else float("nan")
        to = G(lambda: OLD.beam_prune_triton(lp, N, ci, ck)); tn = G(lambda: NEW.beam_prune_triton(lp, N, ci, ck))
        nb = torch.full((bs,), N, dtype=torch.int64, device=dev)
        lo = OLD.label_count_triton(n[4], nb, roots, ids, n[0], n[2], n[3], N)
        ln = NEW.label_count_triton(n[4], nb, roots, ids, n[0], n[2], n[3], N)
        lsame = all(torch.equal(a, b) for a, b in zip(lo, ln))
        nbh = torch.randint(0, N + 1, (bs,), device=dev)
        lsame2 = all(torch.equal(a, b) for a, b in zip(OLD.label_count_triton(n[4], nbh, roots, ids, n[0], n[2], n[3], N),
                                                      NEW.label_count_triton(n[4], nbh, roots, ids, n[0], n[2], n[3], N)))
        tlo = G(lambda: OLD.label_count_triton(n[4], nb, roots, ids, n[0], n[2], n[3], N))
        tln = G(lambda: NEW.label_count_triton(n[4], nb, roots, ids, n[0], n[2], n[3], N))
        tot = G(lambda: build_ddtree(x, roots, N, N))
        prep = G(lambda: draft_topk(x, N))
        depth = int(ln[2].max())
        r = dict(kind=kind, bs=bs, N=N, depth=depth, beam_same=same, label_same=lsame and lsame2, sort_beam=ts,
                 prune_old=to, prune_new=tn, label_old=tlo, label_new=tln, total_new=tot, prep=prep)
        res.append(r)
        line(f"| {kind} | {bs} | {N} | {depth} | {same} | {lsame and lsame2} | {ts:.1f} | {to:.1f} | {tn:.1f} | {to/tn:.2f} | {tlo:.1f} | {tln:.1f} | {tlo/tln:.2f} | {prep:.1f} | {tot:.1f} |")
      except Exception as e:
        import traceback; traceback.print_exc()
line(f"elapsed {time.time()-t0:.0f}s")
# num_warps sweep + depth ablation, new prune, bs1 N512 peaked
x = draft_logits(1 * 7 + 512, 1, L, V, torch.bfloat16, kind="peaked", device=dev)
N = 512
lp, ids, _ = draft_topk(x, N)
ci, ck = candidate_pairs(N, lp.shape[-1], dev)
C = ci.numel(); NP = 512; CP = triton.next_power_of_2(C)
def launch(lpx, nw, Lx):
    score = torch.empty((1, Lx, N), dtype=torch.float32, device=dev)
    valid = torch.empty((1, Lx, N), dtype=torch.int8, device=dev)
    parent = torch.empty((1, Lx, N), dtype=torch.int64, device=dev)
    rank = torch.empty_like(parent); gtop = torch.empty((1, N), dtype=torch.int64, device=dev)
    scr = torch.empty((1, NP), dtype=torch.int64, device=dev)
    def f():
        NEW._beam_prune_kernel[(1,)](lpx, ci, ck, score, valid, parent, rank, gtop, scr, N, N, C, L=Lx, NP=NP, CP=CP,
                                     ROUNDS=15, S1=64, S2=256, LOGNP=9, num_warps=nw)
    return f
try:
  for nw in (4, 8, 16):
    line("nw", nw, "L15", f"{G(launch(lp.contiguous(), nw, 15)):.1f}")
  for Lx in (1, 2, 3, 5, 8, 12, 15):
    line("L", Lx, f"{G(launch(lp[:, :Lx].contiguous(), 8, Lx)):.1f}")
except Exception:
  import traceback; traceback.print_exc()
json.dump(res, open(os.path.join(os.environ.get("OUT", "/tmp"), "micro.json"), "w"), indent=1)
