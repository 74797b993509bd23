"""Scratch (session 6): chain bound on/off in the pruned beam, side by side on the bench's inputs;
the bound prep's final-sort launch at 4 / 8 / 16 warps."""
import sys, time, os, torch, triton
sys.path.insert(0, "."); sys.path.insert(0, "bench")
from _timing import gpu_graph_median_us as G
from patchsets.ddtree.modules import ddtree_kernels as KR
from patchsets.ddtree.modules.ddtree_tree import candidate_pairs, draft_topk, build_ddtree
from tests.support.ddtree import draft_logits
dev = "cuda"; V = 151936; L = 15
t0 = time.time()
def same(a, b):
    return all(torch.equal(x, y) for x, y in zip(a, b))
print("| kind | bs | N | gtop same | beam no bound us | beam bound us | ratio | tree us |", flush=True)
rows = [("peaked", 1, 512), ("peaked", 1, 1024), ("normal", 1, 512), ("peaked", 64, 256), ("peaked", 1, 256),
        ("peaked", 8, 512), ("ties", 1, 1024), ("peaked", 1, 64), ("peaked", 64, 16), ("normal", 64, 256)]
for kind, bs, N in rows:
    if time.time() - t0 > float(os.environ.get("MICRO_S", "200")):
        print("out of time at", kind, bs, N); break
    try:
        x = draft_logits(bs, bs, L, V, torch.bfloat16, kind=kind, device=dev)
        roots = torch.randint(0, V, (bs,), device=dev)
        lp, ids, _ = draft_topk(x, N)
        ci, ck = candidate_pairs(N, lp.shape[-1], dev)
        a = KR.beam_prune_triton(lp, N, ci, ck, bound=False); b = KR.beam_prune_triton(lp, N, ci, ck)
        ok = torch.equal(a[4], b[4])
        ta = G(lambda: KR.beam_prune_triton(lp, N, ci, ck, bound=False)); tb = G(lambda: KR.beam_prune_triton(lp, N, ci, ck))
        tot = G(lambda: build_ddtree(x, roots, N, N)) if kind != "ties" else float("nan")
        print(f"| {kind} | {bs} | {N} | {ok} | {ta:.1f} | {tb:.1f} | {ta/tb:.2f} | {tot:.1f} |", flush=True)
    except Exception:
        import traceback; traceback.print_exc()

def bound_prep(x, k, fw):
    R, V = x.shape; chunk = 4096; sub_block = 64
    KP = max(16, triton.next_power_of_2(k)); cap = max(2 * KP, 256); CAPP = max(KP, triton.next_power_of_2(cap))
    NCH = triton.cdiv(V, chunk); NSB = NCH * (chunk // sub_block)
    pm = torch.empty((R, NCH), dtype=torch.float32, device=dev); ps = torch.empty_like(pm)
    sbm = torch.empty((R, NSB), dtype=torch.int32, device=dev)
    thr = torch.empty((R,), dtype=torch.int32, device=dev); cnt = torch.empty((R,), dtype=torch.int32, device=dev)
    cand = torch.empty((R, cap), dtype=torch.int64, device=dev); lse = torch.empty((R,), dtype=torch.float32, device=dev)
    lp = torch.empty((R, k), dtype=torch.float32, device=dev); ids = torch.empty((R, k), dtype=torch.int64, device=dev)
    KR._bd_pass_a[(R, NCH)](x, pm, ps, sbm, NCH, V=V, CH=chunk, SB=sub_block, num_warps=8)
    KR._bd_combine_a[(R,)](pm, ps, sbm, lse, thr, cnt, k, NCH, NSB, NCHP=max(16, triton.next_power_of_2(NCH)),
                           NSBP=max(16, triton.next_power_of_2(NSB)), ROUNDS=8, num_warps=8)
    KR._bd_pass_b[(R, NCH)](x, sbm, thr, cnt, cand, NCH, cap, V=V, CH=chunk, SB=sub_block, num_warps=8)
    KR._bd_final[(R,)](x, cand, cnt, lse, lp, ids, k, cap, V=V, CAPP=CAPP, KP=KP, num_warps=fw)
    keys = torch.empty((R, k), dtype=torch.int64, device=dev)
    KR._bd_fallback[(R,)](x, cnt, keys, lse, lp, ids, k, cap, NCH, V=V, CH=chunk, KP=KP, num_warps=8)
    return lp, ids, lse

print("\n| prep final | kind | bs | K | same 8 | same 16 | default us | 4 warps | 8 warps | 16 warps |", flush=True)
for kind, bs, k in [("peaked", 1, 512), ("peaked", 1, 256), ("normal", 1, 512), ("peaked", 64, 256)]:
    if time.time() - t0 > float(os.environ.get("MICRO_S", "200")) + 60:
        print("out of time at prep", kind, bs, k); break
    try:
        x2 = draft_logits(bs, bs, L, V, torch.bfloat16, kind=kind, device=dev).reshape(bs * L, V)
        ref = KR.topk_bound_triton(x2, k)
        s8, s16 = same(ref, bound_prep(x2, k, 8)), same(ref, bound_prep(x2, k, 16))
        td = G(lambda: KR.topk_bound_triton(x2, k))
        tw = [G(lambda: bound_prep(x2, k, fw)) for fw in (4, 8, 16)]
        print(f"| prep final | {kind} | {bs} | {k} | {s8} | {s16} | {td:.1f} | " + " | ".join(f"{t:.1f}" for t in tw) + " |", flush=True)
    except Exception:
        import traceback; traceback.print_exc()
