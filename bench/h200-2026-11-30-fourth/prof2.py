"""Scratch (not committed): per-phase clock64 profile of the current pruned beam kernel (source rewritten)."""
import os, sys, json, inspect, re, importlib, torch, triton
sys.path.insert(0, ".")
from patchsets.ddtree.modules import ddtree_kernels as K_
from patchsets.ddtree.modules.ddtree_tree import candidate_pairs, draft_topk
from tests.support.ddtree import draft_logits

src = inspect.getsource(K_._beam_prune_kernel.fn)
lines = src.split("\n")
out = []
ind = lambda l: l[:len(l) - len(l.lstrip())]
first_n = True
for i, l in enumerate(lines):
    if "su_ptr,  #" in l:
        out.append(l); out.append(ind(l) + "prof,"); continue
    if l.strip().startswith("for d in range(1, L):"):
        out.append(l); out.append(ind(l) + "    _mark(prof, d, 0)"); continue
    if l.strip().startswith("n_alive = tl.sum(alive") and first_n:
        first_n = False
        out.append(l); out.append(ind(l) + "tl.store(prof + d * 8 + 6, n_alive.to(tl.int64))")
        out.append(ind(l) + "_mark(prof, d, 1)"); continue
    if l.strip().startswith("if n_alive > 0:"):
        out.append(ind(l) + "tl.store(prof + d * 8 + 7, n_alive.to(tl.int64))")
        out.append(ind(l) + "_mark(prof, d, 2)"); out.append(l); continue
    if l.strip().startswith("sub = (A2 & 1073741823)"):
        out.append(ind(l) + "_mark(prof, d, 3)"); out.append(l); continue
    if l.strip().startswith("A = tl.where(isb, ((A2 >> 30)"):
        out.append(l); out.append(ind(l) + "_mark(prof, d, 4)"); continue
    if l.strip() == "m_prev = m_d":
        out.append(l); continue
    if l.strip().startswith("tl.store(gtop_ptr"):
        out.append(ind(l) + "_mark(prof, 15, 5)"); out.append(l); continue
    out.append(l)
src2 = "\n".join(out).replace("tl.debug_barrier()\n    tl.store(gtop_ptr", "tl.debug_barrier()\n    tl.store(gtop_ptr")
# end-of-depth mark: after the last debug_barrier inside the loop
src2 = re.sub(r"(        m_prev = m_d\n        tl.debug_barrier\(\)\n)", r"\1        _mark(prof, d, 5)\n", src2)
hdr = ("import triton\nimport triton.language as tl\n"
       "from patchsets.ddtree.modules.ddtree_kernels import *\n"
       "from patchsets.ddtree.modules.ddtree_kernels import (" + ", ".join(
           n for n in dir(K_) if n.startswith("_") and not n.startswith("__")) + ")\n\n"
       "@triton.jit\ndef _clk():\n    return tl.inline_asm_elementwise(\"mov.u64 $0, %clock64;\", \"=l\", [], dtype=tl.int64, is_pure=False, pack=1)\n\n"
       "@triton.jit\ndef _mark(prof, d, p):\n    tl.debug_barrier()\n    tl.store(prof + d * 8 + p, _clk())\n\n")
open("scratch_gpu/_prof_gen.py", "w").write(hdr + "@triton.jit\n" + src2.split("\n", 1)[1] if src2.startswith("@") else hdr + "@triton.jit\n" + src2)
G = importlib.import_module("scratch_gpu._prof_gen")


def run(kind, N, L=15, V=151936, bs=1):
    dev = "cuda"
    x = draft_logits(bs * 7 + N, bs, L, V, torch.bfloat16, kind=kind, device=dev)
    lp, ids, _ = draft_topk(x, N)
    Kk = lp.shape[-1]
    ci, ck = candidate_pairs(N, Kk, dev)
    C = ci.numel(); NP = max(16, triton.next_power_of_2(N)); CP = max(NP, triton.next_power_of_2(C))
    KP = triton.next_power_of_2(Kk)
    S3, S4 = min(2 * NP, CP), min(4 * NP, CP)
    ref = K_.beam_prune_triton(lp[:1], N, ci, ck)
    score = torch.empty((1, L, N), dtype=torch.float32, device=dev)
    valid = torch.empty((1, L, N), dtype=torch.int8, device=dev)
    parent = torch.empty((1, L, N), dtype=torch.int64, device=dev)
    rank = torch.empty_like(parent); gtop = torch.empty((1, N), dtype=torch.int64, device=dev)
    scr = torch.empty((1, NP), dtype=torch.int64, device=dev)
    ss = torch.empty((1, S4), dtype=torch.float32, device=dev); su = torch.empty((1, S4), dtype=torch.int32, device=dev)
    prof = torch.zeros((17, 8), dtype=torch.int64, device=dev)
    nw = 4 if CP <= 1024 else (8 if CP <= 4096 else 16)
    for rep in range(5):
        prof.zero_()
        G._beam_prune_kernel[(1,)](lp[:1].contiguous(), ci, ck, score, valid, parent, rank, gtop, scr, ss, su, prof,
                                   Kk, N, C, L=L, NP=NP, CP=CP, ROUNDS=15, S1=min(64, NP), S2=min(256, NP), S3=S3,
                                   S4=S4, LOGNP=NP.bit_length() - 1, LOGKP=KP.bit_length() - 1, num_warps=nw)
        torch.cuda.synchronize()
    same = all(torch.equal(a, b) for a, b in zip(ref, (score, valid.bool(), parent, rank, gtop)))
    p = prof.cpu()
    ghz = 1.98
    print(f"== {kind} N {N} nw {nw} same {same}")
    print("  d  n_alive n_tight | cand pass | tighten | compact+merge | labels | rest | total us")
    tot = [0.0] * 5
    for d in range(1, L):
        t = [int(v) for v in p[d]]
        if t[0] == 0: continue
        def us(a, b):
            return (t[b] - t[a]) / ghz / 1000 if t[b] and t[a] else 0.0
        ph = [us(0, 1), us(1, 2), us(2, 3), us(3, 4), us(4, 5) if t[4] else us(2, 5)]
        for i in range(5): tot[i] += ph[i]
        print(f"  {d:2d} {t[6]:6d} {t[7]:6d} | " + " ".join(f"{v:7.2f}" for v in ph) + f" | {us(0, 5):.2f}")
    print("  sum           | " + " ".join(f"{v:7.2f}" for v in tot))
    return dict(kind=kind, N=N, same=same, prof=p.tolist())


if __name__ == "__main__":
    res = []
    for kind, N in [("peaked", 512), ("peaked", 1024), ("peaked", 256), ("normal", 512)]:
        try:
            res.append(run(kind, N))
        except Exception:
            import traceback; traceback.print_exc()
    json.dump(res, open(os.path.join(os.environ.get("OUT", "/tmp"), "prof2.json"), "w"))
