"""Micro bench: the beam's per-depth merge of n (<= S)
unsorted survivor keys into the running top-N A, side by side — the package's _merge_keys with the
bitonic _merge_top (tl.sort of S lanes, then a network over NP lanes) and with its merge path
(sort S ascending, then each key's output slot from its rank in the other list by binary search
over a scratch copy, one scatter: merge="path"), and, for small S, ranks by counting without any
sort. Identical outputs are checked; on a
GPU each is timed with clock64. CPU check: TRITON_INTERPRET=1 python3 bench/micro/merge_variants.py --check"""
import sys, torch, triton
import triton.language as tl
sys.path.insert(0, ".")
from patchsets.ddtree.modules.ddtree_kernels import _count_below, _merge_keys, _scatter_slots, _MAXKEY


@triton.jit
def _clk():
    return tl.inline_asm_elementwise("mov.u64 $0, %clock64;", "=l", [], dtype=tl.int64, is_pure=False, pack=1)


@triton.jit
def _merge_count(A, key, m, scr, N, NP: tl.constexpr, S: tl.constexpr, LOGNP: tl.constexpr):
    """As _merge_path without the sort: a key's rank among the keys by an [S, S] count."""
    o = tl.arange(0, NP)
    os_ = tl.arange(0, S)
    T = tl.where(m, key, _MAXKEY)
    tl.store(scr + o, A)
    tl.debug_barrier()
    rt = tl.sum((T[None, :] < T[:, None]).to(tl.int32), axis=1)
    ca = tl.sum((T[None, :] < A[:, None]).to(tl.int32), axis=1)
    return _scatter_slots(scr, A, o + ca, T, rt + _count_below(scr, T, NP), NP)


@triton.jit
def _merge_kernel(a_ptr, k_ptr, n_ptr, scr, out_ptr, prof, N, NP: tl.constexpr, S: tl.constexpr, LOGNP: tl.constexpr,
                  VAR: tl.constexpr, REPS: tl.constexpr, PROF: tl.constexpr):
    o = tl.arange(0, NP)
    os_ = tl.arange(0, S)
    if PROF:
        tl.debug_barrier()
        t0 = _clk()
    for rep in range(REPS):
        A = tl.load(a_ptr + rep * NP + o)
        key = tl.load(k_ptr + rep * S + os_)
        m = os_ < tl.load(n_ptr + rep)
        if VAR == 0:
            out = _merge_keys(A, key, m, NP, S, LOGNP, scr, N, False)
        elif VAR == 1:  # the package's merge path (beam_prune_triton(merge="path"))
            out = _merge_keys(A, key, m, NP, S, LOGNP, scr, N, True)
        else:
            out = _merge_count(A, key, m, scr, N, NP, S, LOGNP)
        tl.store(out_ptr + rep * NP + o, tl.where(o < N, out, _MAXKEY))
    if PROF:
        tl.debug_barrier()
        t1 = _clk()
        tl.store(prof, t1 - t0)


def inputs(N, S, reps, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    NP = triton.next_power_of_2(N)
    A = torch.full((reps, NP), 2**63 - 1, dtype=torch.int64)
    K = torch.full((reps, S), 2**63 - 1, dtype=torch.int64)
    n = torch.zeros(reps, dtype=torch.int32)
    for r in range(reps):
        u = torch.randperm(2**20, generator=g)[:NP + S].to(torch.int64) * 7919 + 12345  # distinct keys
        na = N if r % 3 else N - 5 - r  # sometimes fewer than N valid in A
        A[r, :na] = u[:na].sort().values
        nk = [S, S // 2 + 1, 1, S - 3][r % 4]
        K[r, :nk] = u[NP:NP + nk]
        n[r] = nk
    to = lambda t: t.to(device)
    return to(A), to(K), to(n), NP


def ref(A, K, n, N):
    out = []
    for r in range(A.shape[0]):
        v = torch.cat([A[r], K[r, :int(n[r])]]).sort().values[:A.shape[1]].clone()
        v[N:] = 2**63 - 1
        out.append(v)
    return torch.stack(out)


def run(device, N, S, nw, prof_on, check, reps):
    A, K, n, NP = inputs(N, S, reps, device)
    r = ref(A.cpu(), K.cpu(), n.cpu(), N)
    scr = torch.empty(NP + S, dtype=torch.int64, device=device)
    for name, var in (("sort + bitonic merge_top (package)", 0), ("sort + merge path", 1), ("count ranks, no sort", 2)):
        if var == 2 and S > 64:
            continue
        out = torch.empty((reps, NP), dtype=torch.int64, device=device)
        prof = torch.zeros(1, dtype=torch.int64, device=device)
        try:
            for _ in range(3 if prof_on else 1):
                _merge_kernel[(1,)](A, K, n, scr, out, prof, N, NP=NP, S=S, LOGNP=NP.bit_length() - 1,
                                    VAR=var, REPS=reps, PROF=prof_on, num_warps=nw)
        except Exception as e:
            print(f"  {name}: failed {repr(e)[:300]}", flush=True)
            continue
        same = torch.equal(out.cpu(), r)
        t = f"{float(prof[0]) / reps / 1.98 / 1000:.3f} us per merge" if prof_on else ""
        print(f"  N {N} S {S} nw {nw} {name:36s} {t} equal-to-reference {same}", flush=True)
        if check:
            assert same, name


if __name__ == "__main__":
    if "--check" in sys.argv:
        for N, S in ((32, 16), (48, 64), (64, 32)):
            run("cpu", N, S, 4, False, True, 4)
    else:
        for N, S, nw in ((512, 64, 8), (512, 256, 8), (512, 512, 8), (512, 64, 16), (512, 256, 16), (1024, 256, 16)):
            run("cuda", N, S, nw, True, False, 8)
