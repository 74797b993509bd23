"""Kernel timeline of build_ddtree (CUDA graph replay) under torch.profiler: per-kernel durations and gaps."""
import sys, os, torch
sys.path.insert(0, "."); sys.path.insert(0, "patchsets/ddtree/modules")
from tests.support.ddtree import draft_logits
from patchsets.ddtree.modules import ddtree_tree as T
from torch.profiler import profile, ProfilerActivity

def run(bs, N, kind):
    x = draft_logits(bs, bs, 15, 151936, torch.bfloat16, kind=kind, device="cuda")
    roots = torch.randint(0, 151936, (bs,), device="cuda")
    fn = lambda: T.build_ddtree(x, roots, N, N)
    for _ in range(3): fn()
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    for _ in range(20): g.replay()
    torch.cuda.synchronize()
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
    ts = []
    for _ in range(30):
        ev[0].record(); g.replay(); ev[1].record(); torch.cuda.synchronize(); ts.append(ev[0].elapsed_time(ev[1]) * 1000)
    ts.sort()
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        for _ in range(10):
            g.replay()
        torch.cuda.synchronize()
    evs = [e for e in p.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    evs.sort(key=lambda e: e.time_range.start)
    n = len(evs) // 10
    print(f"== {kind} bs {bs} N {N}: graph median {ts[len(ts)//2]:.1f} us, {n} kernels per replay")
    per = {}
    for i, e in enumerate(evs):
        per.setdefault(i % n, []).append((e.name, e.time_range.elapsed_us(), e.time_range.start))
    t0s = [evs[k * n].time_range.start for k in range(10)]
    for i in range(n):
        d = sorted(v[1] for v in per[i]); st = sorted(v[2] - t0s[k] for k, v in enumerate(per[i]))
        print(f"  {i:2d} {per[i][0][0][:40]:40s} dur {d[len(d)//2]:7.1f}  start {st[len(st)//2]:7.1f}")
    last = [evs[k * n + n - 1].time_range.end - t0s[k] for k in range(10)]
    print(f"  span first start -> last end: {sorted(last)[5]:.1f} us")

for bs, N, kind in [(1, 512, "peaked"), (1, 1024, "peaked"), (1, 512, "normal"), (64, 256, "peaked")]:
    run(bs, N, kind)
