"""Scratch (session 7): per-phase clock64 profile of the GEN pruned beam (chain bound), and num_warps sweep."""
import os, sys, json, inspect, importlib, torch, triton
sys.path.insert(0, "."); sys.path.insert(0, "bench")
from patchsets.ddtree.modules import ddtree_kernels as K_
from patchsets.ddtree.modules.ddtree_tree import candidate_pairs, draft_topk
from tests.support.ddtree import draft_logits
from _timing import gpu_graph_median_us as G

src = inspect.getsource(K_._beam_prune_kernel.fn)
lines = src.split("\n")
out = []
ind = lambda l: l[:len(l) - len(l.lstrip())]
seen = set()
for l in lines:
    s = l.strip()
    if s.startswith("tval_ptr,"):
        out.append(l); out.append(ind(l) + "prof,"); continue
    if s == "for d in range(1, L):":
        out.append(l); out.append(ind(l) + "    _mark(prof, d, 0)"); continue
    if s.startswith("ts, tsub = _threshold(") and "t1" not in seen:
        seen.add("t1"); out.append(l); out.append(ind(l) + "_mark(prof, d, 1)"); continue
    if s == "n_gen = tl.sum(R, axis=0)" and "ng" not in seen:
        seen.add("ng"); out.append(l); out.append(ind(l) + "tl.store(prof + d * 12 + 9, n_gen.to(tl.int64))")
        out.append(ind(l) + "_mark(prof, d, 2)"); continue
    if s == "if fits:":
        out.append(ind(l) + "tl.store(prof + d * 12 + 10, n_gen.to(tl.int64))")
        out.append(ind(l) + "_mark(prof, d, 3)"); out.append(l); continue
    if s == "_mark_blocks(own, R, d, offs_n)":
        out.append(l); out.append(ind(l) + "_mark(prof, d, 4)"); continue
    if s == "if done == 0:  # scan the candidate table: (i, r) packed as i * 2**LOGKP + r in int32":
        out.append(ind(l) + "_mark(prof, d, 5)"); out.append(l); continue
    if s == "if n_new > 0:":
        out.append(ind(l) + "_mark(prof, d, 6)"); out.append(l); continue
    if s.startswith("A = tl.where(isb, ((A2 >> 30)"):
        out.append(l); out.append(ind(l) + "_mark(prof, d, 7)"); continue
    if s == "m_prev = m_d":
        out.append(l); out.append(ind(l) + "tl.debug_barrier()"); out.append(ind(l) + "_mark(prof, d, 8)"); continue
    if s.startswith("b = tl.program_id(0)"):
        out.append(l); out.append(ind(l) + "_mark(prof, 0, 0)"); continue
    if s.startswith("offs_c = tl.arange(0, CP)"):
        out.append(ind(l) + "_mark(prof, 0, 1)"); out.append(l); continue
    if s.startswith("tl.store(gtop_ptr"):
        out.append(ind(l) + "_mark(prof, 15, 0)"); out.append(l); continue
    out.append(l)
src2 = "\n".join(out)
hdr = ("import triton\nimport triton.language as tl\n"
       "from patchsets.ddtree.modules.ddtree_kernels import *\n"
       "from patchsets.ddtree.modules.ddtree_kernels import (" + ", ".join(
           n for n in dir(K_) if n.startswith("_") and not n.startswith("__")) + ")\n\n"
       "@triton.jit\ndef _clk():\n    return tl.inline_asm_elementwise(\"mov.u64 $0, %clock64;\", \"=l\", [], dtype=tl.int64, is_pure=False, pack=1)\n\n"
       "@triton.jit\ndef _mark(prof, d, p):\n    tl.debug_barrier()\n    tl.store(prof + d * 12 + p, _clk())\n\n")
body = src2 if src2.startswith("@triton.jit") else "@triton.jit\n" + src2
open("scratch_gpu/_prof8_gen.py", "w").write(hdr + body)
Gm = importlib.import_module("scratch_gpu._prof8_gen")


def launch(kern, lp, N, ci, ck, nw, prof=None, tiers=(64, 256)):
    bs, L, Kk = lp.shape
    dev = lp.device
    C = ci.numel(); NP = max(16, triton.next_power_of_2(N)); CP = max(NP, triton.next_power_of_2(C))
    KP = triton.next_power_of_2(Kk)
    score = torch.empty((bs, L, N), dtype=torch.float32, device=dev)
    valid = torch.empty((bs, L, N), dtype=torch.int8, device=dev)
    parent = torch.empty((bs, L, N), dtype=torch.int64, device=dev)
    rank = torch.empty_like(parent); gtop = torch.empty((bs, N), dtype=torch.int64, device=dev)
    scr = torch.empty((bs, NP), dtype=torch.int64, device=dev)
    S3, S4 = (NP, NP) if NP > 64 else (min(2 * NP, CP), min(4 * NP, CP))
    ss = torch.empty((bs, S4), dtype=torch.float32, device=dev); su = torch.empty((bs, S4), dtype=torch.int32, device=dev)
    W = 2 * NP
    own = torch.empty((bs, W), dtype=torch.int32, device=dev)
    tval = torch.empty((1, 1), dtype=torch.float32, device=dev)
    extra = (prof,) if prof is not None else ()
    kern[(bs,)](lp, ci, ck, score, valid, parent, rank, gtop, scr, ss, su, own, tval, *extra, Kk, N, C, L=L, NP=NP, CP=CP,
                ROUNDS=15, S1=min(tiers[0], NP), S2=min(tiers[1], NP), S3=S3, S4=S4, LOGNP=NP.bit_length() - 1,
                LOGKP=KP.bit_length() - 1, GEN=True, W=W, BOUND=1, DP=16, JT=1, num_warps=nw)
    return score, valid.bool(), parent, rank, gtop


def run(kind, N, bs=1, L=15, V=151936, nws=(4, 8, 16)):
    x = draft_logits(1, bs, L, V, torch.bfloat16, kind=kind, device="cuda")
    lp, ids, _ = draft_topk(x, N)
    lp = lp.contiguous()
    Kk = lp.shape[-1]
    ci, ck = candidate_pairs(N, Kk, "cuda")
    ref = K_.beam_prune_triton(lp, N, ci, ck)
    res = dict(kind=kind, N=N, bs=bs)
    t_def = G(lambda: K_.beam_prune_triton(lp, N, ci, ck))
    print(f"== {kind} bs {bs} N {N}: default beam_prune_triton {t_def:.1f} us; beams {ref[1][0].sum(-1).tolist()}", flush=True)
    if bs == 1:
        for nw in nws[:1]:
            prof = torch.zeros((17, 12), dtype=torch.int64, device="cuda")
            for _ in range(4):
                prof.zero_(); launch(Gm._beam_prune_kernel, lp, N, ci, ck, nw, prof); torch.cuda.synchronize()
            p = prof.cpu().tolist()
            ghz = 1.98
            us = lambda a, b: (b - a) / ghz / 1000 if a and b else 0.0
            print(f"  [nw {nw}] pre-loop (depth 0 + chain bound) {us(p[0][0], p[0][1]):.2f} us; loop {us(p[1][0], p[15][0]):.2f} us")
            print("   d  ngen0 ngen | tau   ranks  retry  mark  merge  (scan) labels rest | total")
            tot = [0.0] * 8
            for d in range(1, L):
                t = p[d]
                if not t[0]:
                    continue
                ph = [us(t[0], t[1]), us(t[1], t[2]), us(t[2], t[3]), us(t[3], t[4]) if t[4] else 0.0,
                      us(t[4], t[5]) if t[4] else 0.0, us(t[5], t[6]), us(t[6], t[7]) if t[7] else 0.0,
                      us(t[7] or t[6], t[8])]
                for i in range(8): tot[i] += ph[i]
                print(f"  {d:2d} {t[9]:5d} {t[10]:5d} | " + " ".join(f"{v:5.2f}" for v in ph) + f" | {us(t[0], t[8]):.2f}")
            print("  sum         | " + " ".join(f"{v:5.2f}" for v in tot), flush=True)
            res[f"prof_nw{nw}"] = p
    for nw in nws:
        try:
            o = launch(K_._beam_prune_kernel, lp, N, ci, ck, nw)
            same = all(torch.equal(a, b) for a, b in zip(ref, o))
            t = G(lambda: launch(K_._beam_prune_kernel, lp, N, ci, ck, nw))
            print(f"   nw {nw:2d}: {t:.1f} us same {same}", flush=True)
            res[f"nw{nw}"] = t
        except Exception as e:
            print("   nw", nw, "failed", repr(e)[:300], flush=True)
    return res


if __name__ == "__main__":
    res = []
    for kind, N, bs, nws in [("peaked", 512, 1, (8, 4))]:
        try:
            res.append(run(kind, N, bs, nws=nws))
        except Exception:
            import traceback; traceback.print_exc()
        json.dump(res, open(os.path.join(os.environ.get("OUT", "/tmp"), "prof8.json"), "w"))
