"""Scratch (session 7): clock64 cost of the beam's per-depth primitives at NP lanes, 4 vs 8 warps."""
import sys, torch, triton
import triton.language as tl
sys.path.insert(0, ".")
from patchsets.ddtree.modules.ddtree_kernels import (_bitonic_merge_asc, _merge_top, _max_combine, _MAXKEY, _clean_lp)


@triton.jit
def _clk():
    return tl.inline_asm_elementwise("mov.u64 $0, %clock64;", "=l", [], dtype=tl.int64, is_pure=False, pack=1)


@triton.jit
def _mk(prof, i):
    tl.debug_barrier()
    tl.store(prof + i, _clk())


@triton.jit
def _prim_kernel(key_ptr, row_ptr, g_ptr, out_ptr, prof, NP: tl.constexpr, LOGNP: tl.constexpr, REPS: tl.constexpr):
    o = tl.arange(0, NP)
    A = tl.load(key_ptr + o)
    acc = tl.zeros([NP], tl.int64)
    _mk(prof, 0)
    for _ in tl.static_range(REPS):  # 1: bitonic merge NP
        A = _bitonic_merge_asc(A ^ acc, LOGNP)
        acc += A & 1
    _mk(prof, 1)
    o2 = tl.arange(0, 256)
    k2 = tl.load(key_ptr + o2)
    for _ in tl.static_range(REPS):  # 2: sort 256 desc
        k2 = tl.sort(k2 ^ 1, descending=True)
    _mk(prof, 2)
    o3 = tl.arange(0, 64)
    k3 = tl.load(key_ptr + o3)
    for _ in tl.static_range(REPS):  # 3: sort 64 desc
        k3 = tl.sort(k3 ^ 1, descending=True)
    _mk(prof, 3)
    for _ in tl.static_range(REPS):  # 4: merge_top NP with 256
        A = _merge_top(A, k2, NP, 256, LOGNP)
        k2 = k2 ^ (tl.max(A, axis=0) & 1)
    _mk(prof, 4)
    c = (A & 3).to(tl.int32)
    for _ in tl.static_range(REPS):  # 5: cumsum NP int32
        c = tl.cumsum(c, axis=0) & 7
    _mk(prof, 5)
    for _ in tl.static_range(REPS):  # 6: running max NP int32
        c = tl.associative_scan(c, 0, _max_combine) ^ 1
    _mk(prof, 6)
    R = (c & 0)
    s = tl.load(g_ptr + o).to(tl.float32)
    for _ in tl.static_range(REPS):  # 7: 10 dependent lifting loads (global row, f32)
        for t in tl.static_range(10):
            nxt = R + (1 << (9 - t))
            x = s + _clean_lp(tl.load(row_ptr + nxt - 1, mask=nxt <= 512, other=0.0))
            R = tl.where((nxt <= 512) & (x > -3.0), nxt, R)
        s = s + R.to(tl.float32) * 0.0
    _mk(prof, 7)
    for _ in tl.static_range(REPS):  # 8: store -> barrier -> gather load round trip
        tl.store(g_ptr + o, R)
        tl.debug_barrier()
        R = tl.load(g_ptr + ((o * 7 + R) & (NP - 1)))
    _mk(prof, 8)
    v = tl.zeros([], tl.int64)
    for _ in tl.static_range(REPS):  # 9: max reduce NP int64
        v += tl.max(A ^ v, axis=0)
    _mk(prof, 9)
    for _ in tl.static_range(REPS):  # 10: sum reduce NP int32
        v += tl.sum(R + v.to(tl.int32), axis=0)
    _mk(prof, 10)
    # 11: lifting with the row loaded once into registers + tl.gather
    rowv = tl.load(row_ptr + o)
    for _ in tl.static_range(REPS):
        R2 = R & 0
        for t in tl.static_range(10):
            nxt = R2 + (1 << (9 - t))
            x = s + tl.gather(rowv, tl.minimum(nxt - 1, NP - 1), 0)
            R2 = tl.where((nxt <= 512) & (x > -3.0), nxt, R2)
        R = R ^ R2
    _mk(prof, 11)
    tl.store(out_ptr + o, A + acc + k2.sum() + k3.sum() + c.to(tl.int64) + R.to(tl.int64) + v)


def main():
    names = ["bitonic merge NP", "sort 256 desc", "sort 64 desc", "merge_top NP+256", "cumsum NP i32",
             "running max NP i32", "lifting 10 global loads", "store/barrier/gather", "max NP i64", "sum NP i32",
             "lifting 10 tl.gather"]
    NP = 512
    key = torch.randint(0, 2**62, (NP,), device="cuda", dtype=torch.int64)
    row = torch.sort(torch.randn(NP, device="cuda"), descending=True).values.contiguous()
    g = torch.randint(0, 100, (NP,), device="cuda", dtype=torch.int32)
    out = torch.empty(NP, dtype=torch.int64, device="cuda")
    for nw in (8, 4):
        prof = torch.zeros(16, dtype=torch.int64, device="cuda")
        try:
            for _ in range(3):
                _prim_kernel[(1,)](key, row, g, out, prof, NP=NP, LOGNP=9, REPS=2, num_warps=nw)
            torch.cuda.synchronize()
        except Exception as e:
            print("nw", nw, "failed", repr(e)[:400]); continue
        p = prof.cpu().tolist()
        print(f"NP {NP} nw {nw}: " + "; ".join(f"{n} {(p[i+1]-p[i])/2/1.98/1000:.3f} us" for i, n in enumerate(names)), flush=True)


if __name__ == "__main__":
    main()
