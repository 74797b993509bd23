"""Micro bench: the whole pruned beam (chain bound) with
gen_wide 2 (default) / 1 and 8 / 16 warps, side by side on the bench's inputs; outputs compared
with the default. gen_wide 1 drops the W-lane selection, which is ~30 s of the kernel's 73 s
compile (CPU, make_ttgir) and was never entered on peaked bs 1 N 512 with the chain bound.
`python3 bench/micro/beam_variants.py compile I` compiles configuration I (run them in parallel), then
`python3 bench/micro/beam_variants.py time` times all from Triton's cache."""
import sys, torch
sys.path.insert(0, "."); sys.path.insert(0, "bench")
from patchsets.ddtree.modules import ddtree_kernels as K_
from patchsets.ddtree.modules.ddtree_tree import candidate_pairs, draft_topk
from tests.support.ddtree import draft_logits

CONFIGS = [  # (kind, bs, N, gen_wide, num_warps or None for the default)
    ("peaked", 1, 512, 2, None), ("peaked", 1, 512, 1, None), ("peaked", 1, 512, 2, 16), ("peaked", 1, 512, 1, 16),
    ("peaked", 1, 1024, 2, None), ("peaked", 1, 1024, 1, None), ("peaked", 64, 256, 2, None), ("peaked", 64, 256, 1, None),
]


def launch(lp, N, ci, ck, gen_wide, nw):
    return K_.beam_prune_triton(lp, N, ci, ck, gen_wide=gen_wide, num_warps=nw)


def inputs(kind, bs, N):
    x = draft_logits(bs, bs, 15, 151936, torch.bfloat16, kind=kind, device="cuda")  # the bench's inputs
    lp, _, _ = draft_topk(x, N)
    lp = lp.contiguous()
    ci, ck = candidate_pairs(N, lp.shape[-1], "cuda")
    return lp, ci, ck


if __name__ == "__main__":
    if sys.argv[1] == "compile":
        kind, bs, N, gw, nw = CONFIGS[int(sys.argv[2])]
        lp, ci, ck = inputs(kind, bs, N)
        launch(lp, N, ci, ck, gw, nw); torch.cuda.synchronize()
        print("compiled", CONFIGS[int(sys.argv[2])], flush=True)
    else:
        from _timing import gpu_graph_median_us as G
        cache = {}
        for kind, bs, N, gw, nw in CONFIGS:
            if (kind, bs, N) not in cache:
                lp, ci, ck = inputs(kind, bs, N)
                cache[(kind, bs, N)] = (lp, ci, ck, launch(lp, N, ci, ck, 2, None))
            lp, ci, ck, ref = cache[(kind, bs, N)]
            out = launch(lp, N, ci, ck, gw, nw)
            same = all(torch.equal(a, b) for a, b in zip(ref, out))
            t = G(lambda: launch(lp, N, ci, ck, gw, nw))
            print(f"{kind} bs {bs} N {N} gen_wide {gw} warps {nw or 'default'}: {t:.1f} us, outputs same as default {same}", flush=True)
