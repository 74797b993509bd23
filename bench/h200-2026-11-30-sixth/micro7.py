"""Scratch (session 6, last 4 device-minutes): chain vs tight bound, peaked bs 1 N 512, bench inputs."""
import sys, time, torch
sys.path.insert(0, "."); sys.path.insert(0, "bench")
from _timing import gpu_graph_median_us as G
from patchsets.ddtree.modules import ddtree_kernels as KR
from patchsets.ddtree.modules.ddtree_tree import candidate_pairs, draft_topk
from tests.support.ddtree import draft_logits
t0 = time.time()
x = draft_logits(1, 1, 15, 151936, torch.bfloat16, kind="peaked", device="cuda")
lp, ids, _ = draft_topk(x, 512)
ci, ck = candidate_pairs(512, 512, "cuda")
a = KR.beam_prune_triton(lp, 512, ci, ck); print("chain compiled", round(time.time() - t0), flush=True)
b = KR.beam_prune_triton(lp, 512, ci, ck, bound="tight"); print("tight compiled", round(time.time() - t0), flush=True)
print("gtop same", torch.equal(a[4], b[4]), "beam sizes chain", a[1][0].sum(-1).tolist(), "tight", b[1][0].sum(-1).tolist(), flush=True)
tb = G(lambda: KR.beam_prune_triton(lp, 512, ci, ck, bound="tight")); ta = G(lambda: KR.beam_prune_triton(lp, 512, ci, ck))
tk = G(lambda: KR.tight_bound_triton(lp, 512))
print(f"peaked bs1 N512 beam chain {ta:.1f} us, tight {tb:.1f} us (of which tight_bound_triton {tk:.1f}), chain/tight {ta/tb:.2f}", flush=True)
for J in (32, 64):
    tj = G(lambda: KR.beam_prune_triton(lp, 512, ci, ck, bound="tight", tight_programs=J))
    print(f"  tight J={J}: {tj:.1f} us", flush=True)
