"""Fourth call of the eighth session (the last 4 device-minutes): the pruned beam after 19be65a
(one sort + merge per tier, _merge_tier) on the H200 — its beams against the torch beam
(_beam_search: each depth's pruned beam is a prefix of the full beam, bit for bit), its compile
time on the device's CPU, and its CUDA-graph median beside the figures of call 2 (85.7 µs at
peaked bs 1 N 512, 63.6 µs at peaked bs 64 N 256, the kernels of 42e8a96)."""
import sys, time, torch
sys.path.insert(0, "."); sys.path.insert(0, "bench")
from patchsets.ddtree.modules import ddtree_kernels as K
from patchsets.ddtree.modules.ddtree_tree import _beam_search, candidate_pairs, draft_topk
from tests.support.ddtree import draft_logits
from _timing import gpu_graph_median_us as G

t_start = time.time()
for bs, N in ((1, 512), (64, 256)):
    if time.time() - t_start > 100:
        print(f"bs {bs} N {N}: skipped (time)"); break
    x = draft_logits(bs, bs, 15, 151936, torch.bfloat16, kind="peaked", device="cuda")  # the bench's inputs
    lp, _, _ = draft_topk(x, N, use_triton=False)
    lp = lp.contiguous()
    ci, ck = candidate_pairs(N, lp.shape[-1], "cuda")
    t0 = time.time(); out = K.beam_prune_triton(lp, N, ci, ck); torch.cuda.synchronize()
    first = time.time() - t0
    full = _beam_search(lp, N)
    ok = True
    for b in range(bs):
        for d in range(15):
            m = int(out[1][b, d].sum())
            ok &= bool(out[1][b, d, :m].all())
            for f, p in zip(full, out[:4]):
                ok &= torch.equal(f[b, d, :m].view(torch.int32) if f.dtype == torch.float32 else f[b, d, :m],
                                  p[b, d, :m].view(torch.int32) if p.dtype == torch.float32 else p[b, d, :m])
    t = G(lambda: K.beam_prune_triton(lp, N, ci, ck))
    print(f"peaked bs {bs} N {N}: first call (compile + run) {first:.1f} s; beams equal the torch beam's "
          f"prefixes: {ok}; CUDA-graph median {t:.1f} us", flush=True)
