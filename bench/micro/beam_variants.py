"""Micro bench: the whole pruned beam (chain bound) with other keyword settings — gen_wide 1
against the default 2 — side by side on the bench's inputs (CUDA-graph medians, ratios to the
default); outputs compared with the default. gen_wide 1 drops the W-lane selection, which is ~30 s
of the kernel's ~73 s compile (CPU, make_ttgir).
`python3 bench/micro/beam_variants.py compile I` compiles configuration I (run them in parallel), then
`python3 bench/micro/beam_variants.py time [I ...]` times those (default: all) from Triton's cache."""
import sys, torch
sys.path.insert(0, "."); sys.path.insert(0, "bench")
from patchsets.ddtree.modules import ddtree_kernels as K_
from patchsets.ddtree.modules.ddtree_tree import candidate_pairs, draft_topk
from tests.support.ddtree import draft_logits

CONFIGS = [  # (kind, bs, N, beam_prune_triton keywords); {} is the default
    ("peaked", 1, 512, {}), ("peaked", 1, 512, dict(gen_wide=1)),
    ("normal", 1, 512, {}), ("normal", 1, 512, dict(gen_wide=1)),
    ("peaked", 1, 1024, {}), ("peaked", 1, 1024, dict(gen_wide=1)),
    ("peaked", 64, 256, {}), ("peaked", 64, 256, dict(gen_wide=1)),
]


def launch(lp, N, ci, ck, kw):
    return K_.beam_prune_triton(lp, N, ci, ck, **kw)


def inputs(kind, bs, N):
    x = draft_logits(bs, bs, 15, 151936, torch.bfloat16, kind=kind, device="cuda")  # the bench's inputs
    lp, _, _ = draft_topk(x, N)
    lp = lp.contiguous()
    ci, ck = candidate_pairs(N, lp.shape[-1], "cuda")
    return lp, ci, ck


if __name__ == "__main__":
    if sys.argv[1] == "compile":
        kind, bs, N, kw = CONFIGS[int(sys.argv[2])]
        lp, ci, ck = inputs(kind, bs, N)
        launch(lp, N, ci, ck, kw); torch.cuda.synchronize()
        print("compiled", CONFIGS[int(sys.argv[2])], flush=True)
    else:  # time [I ...] (default: all), e.g. only the configurations whose compile finished
        from _timing import gpu_graph_median_us as G
        pick = [int(i) for i in sys.argv[2:]] or range(len(CONFIGS))
        cache = {}
        base = {}
        for kind, bs, N, kw in (CONFIGS[i] for i in pick):
            if (kind, bs, N) not in cache:
                lp, ci, ck = inputs(kind, bs, N)
                cache[(kind, bs, N)] = (lp, ci, ck, launch(lp, N, ci, ck, {}))
            lp, ci, ck, ref = cache[(kind, bs, N)]
            out = launch(lp, N, ci, ck, kw)
            same = all(torch.equal(a, b) for a, b in zip(ref, out))
            t = G(lambda: launch(lp, N, ci, ck, kw))
            base.setdefault((kind, bs, N), t)
            print(f"{kind} bs {bs} N {N} {kw or 'default'}: {t:.1f} us ({base[(kind, bs, N)] / t:.2f}x the default), "
                  f"outputs same {same}", flush=True)
