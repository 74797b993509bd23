"""Scratch (not committed): e2fc9b4 ('mid') vs current beam, pre-session vs current bound prep."""
import sys, time, torch
sys.path.insert(0, "."); sys.path.insert(0, "bench")
from _timing import gpu_graph_median_us as G
from patchsets.ddtree.modules import ddtree_kernels as NEW
from scratch_gpu import mid_kernels as MID, old_kernels as OLD
from patchsets.ddtree.modules.ddtree_tree import candidate_pairs, draft_topk, build_ddtree
from tests.support.ddtree import draft_logits
dev = "cuda"; V = 151936; L = 15
print("| kind | bs | N | beam same | beam mid us | beam new us | ratio | prep same | prep old us | prep new us | ratio | total us |")
for kind in ("normal", "peaked", "ties"):
    for bs, N in [(1, 64), (1, 512), (1, 1024), (8, 512), (64, 256)]:
      try:
        x = draft_logits(bs * 7 + N, bs, L, V, torch.bfloat16, kind=kind, device=dev)
        roots = torch.randint(0, V, (bs,), device=dev)
        x2 = x.reshape(bs * L, V)
        po = OLD.topk_bound_triton(x2, N); pn = NEW.topk_bound_triton(x2, N)
        pr = NEW.topk_radix_triton(x2, N)
        psame = all(torch.equal(a, b) for a, b in zip(po, pn)) and all(torch.equal(a, b) for a, b in zip(pr, pn))
        tpo = G(lambda: OLD.topk_bound_triton(x2, N)); tpn = G(lambda: NEW.topk_bound_triton(x2, N))
        lp = pn[0].view(bs, L, N)
        ci, ck = candidate_pairs(N, N, dev)
        m = MID.beam_prune_triton(lp, N, ci, ck); n = NEW.beam_prune_triton(lp, N, ci, ck)
        bsame = all(torch.equal(a, b) for a, b in zip(m, n))
        tbm = G(lambda: MID.beam_prune_triton(lp, N, ci, ck)); tbn = G(lambda: NEW.beam_prune_triton(lp, N, ci, ck))
        tot = G(lambda: build_ddtree(x, roots, N, N))
        print(f"| {kind} | {bs} | {N} | {bsame} | {tbm:.1f} | {tbn:.1f} | {tbm/tbn:.2f} | {psame} | {tpo:.1f} | {tpn:.1f} | {tpo/tpn:.2f} | {tot:.1f} |", flush=True)
      except Exception:
        import traceback; traceback.print_exc()
