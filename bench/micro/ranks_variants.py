"""Micro bench: the survivor-rank search of the pruned beam,
side by side — binary lifting (the package's _survivor_ranks), the same after a coalesced prefetch
of the lp row, lifting from a register row with tl.gather, and multi-way searches (2^BITS - 1
independent probes per level, fewer dependent rounds). All must give identical R (checked against
a torch count); on a GPU each is timed with clock64 over REPS thresholds. CPU check:
TRITON_INTERPRET=1 python3 bench/micro/ranks_variants.py --check"""
import sys, torch, triton
import triton.language as tl
sys.path.insert(0, ".")
from patchsets.ddtree.modules.ddtree_kernels import _beats, _survivor_ranks, _clean_lp


@triton.jit
def _clk():
    return tl.inline_asm_elementwise("mov.u64 $0, %clock64;", "=l", [], dtype=tl.int64, is_pure=False, pack=1)


@triton.jit
def _ranks_gather(score_prev, lp_row, cap, m_prev, K, ts, tsub, teq, NP: tl.constexpr, LOGKP: tl.constexpr):
    o = tl.arange(0, NP)
    hv = o < m_prev
    s = tl.load(score_prev + o, mask=hv, other=float("-inf"))
    c = tl.where(hv, cap, 0)
    KP: tl.constexpr = 1 << LOGKP
    ok_ = tl.arange(0, KP)
    row = _clean_lp(tl.load(lp_row + ok_, mask=ok_ < K, other=0.0))
    R = tl.zeros([NP], tl.int32)
    for t in tl.static_range(LOGKP + 1):
        nxt = R + (1 << (LOGKP - t))
        ok = nxt <= c
        x = s + tl.gather(row, tl.minimum(nxt - 1, KP - 1), 0)
        pk = (o << LOGKP) | (nxt - 1)
        R = tl.where(ok & _beats(x, pk, ts, tsub, teq), nxt, R)
    return R


@triton.jit
def _ranks_kernel(score_ptr, row_ptr, cap_ptr, ts_ptr, tsub_ptr, out_ptr, prof, m_prev, K, teq,
                  NP: tl.constexpr, LOGKP: tl.constexpr, VAR: tl.constexpr, BITS: tl.constexpr,
                  REPS: tl.constexpr, PROF: tl.constexpr):
    o = tl.arange(0, NP)
    cap = tl.load(cap_ptr + o)
    acc = tl.zeros([NP], tl.int32)
    KP: tl.constexpr = 1 << LOGKP
    if PROF:
        tl.debug_barrier()
        t0 = _clk()
    for rep in range(REPS):
        ts = tl.load(ts_ptr + rep)
        tsub = tl.load(tsub_ptr + rep)
        if VAR == 0:
            R = _survivor_ranks(score_ptr, row_ptr, cap, m_prev, ts, tsub, teq, NP, LOGKP)
        elif VAR == 1:  # prefetch the row coalesced, then the same lifting
            pre = tl.load(row_ptr + tl.arange(0, KP), mask=tl.arange(0, KP) < K, other=0.0)
            R = _survivor_ranks(score_ptr, row_ptr, cap, m_prev, ts, tsub, teq, NP, LOGKP)
            R = R + (tl.max(pre, axis=0) > 1.0e30).to(tl.int32)
        elif VAR == 2:
            R = _ranks_gather(score_ptr, row_ptr, cap, m_prev, K, ts, tsub, teq, NP, LOGKP)
        else:  # the package's multi-way search (beam_prune_triton(rank_bits=BITS))
            R = _survivor_ranks(score_ptr, row_ptr, cap, m_prev, ts, tsub, teq, NP, LOGKP, BITS)
        tl.store(out_ptr + rep * NP + o, R)
        acc += R
    if PROF:
        tl.debug_barrier()
        t1 = _clk()
        tl.store(prof, t1 - t0)
    tl.store(out_ptr + REPS * NP + o, acc)


def inputs(N=512, seed=0, device="cpu", reps=4, kind="peaked"):
    """A realistic depth: parent scores (sorted, m_prev of them), an lp row (non-increasing, with
    repeated values so that ties with ts happen), caps min(K, N // (i + 1)), and REPS thresholds
    around the N-th largest child score, some equal to a child's score."""
    g = torch.Generator().manual_seed(seed)
    K = N
    if kind == "peaked":
        row = torch.cat([torch.tensor([-0.01]), -3.0 - 5.0 * torch.rand(K - 1, generator=g)])
    else:
        row = -2.0 - 4.0 * torch.rand(K, generator=g)
    row = (row * 64).round() / 64  # repeated values: float ties
    row = row.sort(descending=True).values
    m_prev = int(N * 0.6)
    sp = -(torch.rand(N, generator=g) * 6.0 + 0.5)
    sp = ((sp * 64).round() / 64).sort(descending=True).values
    sp[m_prev:] = float("-inf")
    NP = triton.next_power_of_2(N)
    cap = torch.tensor([min(K, N // (i + 1)) if i < N else 0 for i in range(NP)], dtype=torch.int32)
    x = (sp[:m_prev, None] + row[None, :]).flatten()
    xs = x.sort(descending=True).values
    ts = torch.stack([xs[min(len(xs) - 1, int(N * f))] for f in torch.linspace(0.1, 1.0, reps)]).float()
    LOGKP = (triton.next_power_of_2(K)).bit_length() - 1
    tsub = torch.randint(0, m_prev << LOGKP, (reps,), generator=g, dtype=torch.int32)
    to = lambda t: t.to(device)
    return dict(score=to(sp.float()), row=to(row.float()), cap=to(cap), ts=to(ts), tsub=to(tsub), m_prev=m_prev,
                K=K, NP=NP, LOGKP=LOGKP, reps=reps)


def torch_ranks(d, rep, teq):
    s, row, cap = d["score"].cpu(), d["row"].cpu(), d["cap"].cpu()
    ts, tsub = float(d["ts"][rep]), int(d["tsub"][rep])
    R = torch.zeros(d["NP"], dtype=torch.int32)
    for i in range(d["m_prev"]):
        r = 0
        while r < int(cap[i]):
            x = float(torch.tensor(s[i]) + row[r])
            pk = (i << d["LOGKP"]) | r
            if x > ts or (x == ts and (pk < tsub or pk == teq)):
                r += 1
            else:
                break
        R[i] = r
    return R


VARIANTS = [("lifting (package)", 0, 1), ("prefetch + lifting", 1, 1), ("tl.gather lifting", 2, 1),
            ("4-way", 3, 2), ("8-way", 3, 3), ("16-way", 3, 4)]


def run(device, N, nw, prof_on, check, kind):
    d = inputs(N, device=device, reps=4 if check else 8, kind=kind)
    reps = d["reps"]
    teq = -1
    outs = {}
    for name, var, bits in VARIANTS:
        out = torch.zeros(((reps + 1) * d["NP"],), dtype=torch.int32, device=device)
        prof = torch.zeros(1, dtype=torch.int64, device=device)
        try:
            for _ in range(3 if prof_on else 1):
                _ranks_kernel[(1,)](d["score"], d["row"], d["cap"], d["ts"], d["tsub"], out, prof, d["m_prev"], d["K"],
                                    teq, NP=d["NP"], LOGKP=d["LOGKP"], VAR=var, BITS=bits, REPS=reps, PROF=prof_on,
                                    num_warps=nw)
        except Exception as e:
            print(f"  {name}: failed {repr(e)[:300]}", flush=True)
            continue
        outs[name] = out[:reps * d["NP"]].view(reps, d["NP"]).cpu()
        t = f"{float(prof[0]) / reps / 1.98 / 1000:.3f} us per call" if prof_on else ""
        same = torch.equal(outs[name], outs.get("lifting (package)", outs[name]))
        print(f"  {kind} N {N} nw {nw} {name:22s} {t} same-as-lifting {same} n_gen {outs[name].sum(1).tolist()}", flush=True)
    if check:
        ref = torch.stack([torch_ranks(d, r, teq) for r in range(reps)])
        for name, o in outs.items():
            assert torch.equal(o, ref), name
        print("  all variants == torch count", flush=True)


if __name__ == "__main__":
    if "--check" in sys.argv:
        for kind in ("peaked", "normal"):
            run("cpu", 64, 4, False, True, kind)
    else:
        for N, nw in ((512, 8), (512, 16), (1024, 16), (256, 4)):
            run("cuda", N, nw, True, False, "peaked")
