"""Every DDTree Triton kernel compiles for sm_90 (H100/H200) — on the CPU, no GPU needed.

Triton's interpreter (test_ddtree_kernels.py) does not type-check loop-carried variables or
globals; the real compiler does. Skipped where Triton is not installed (CI's CPU torch has none).
"""

from __future__ import annotations

import pytest

triton = pytest.importorskip("triton")

from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from patchsets.ddtree.kernels import ddtree_beam as KB  # noqa: E402
from patchsets.ddtree.kernels import ddtree_prep as KP  # noqa: E402
from patchsets.ddtree.kernels import ddtree_verify_attention as KA  # noqa: E402
from patchsets.ddtree.kernels import ddtree_verify_inputs as KV  # noqa: E402
from patchsets.ddtree.kernels import ddtree_walk as KW  # noqa: E402
from patchsets.ddtree.modules.ddtree_tree import candidate_pairs  # noqa: E402

pytestmark = pytest.mark.slow

I64, I8, F32 = "*i64", "*i8", "*fp32"
C = "constexpr"
BEAM_PRUNE_SIG = KB.BEAM_PRUNE_SIGNATURE


def _beam_prune(n: int, k: int, **kw) -> tuple[dict, int]:
    """``beam_prune_triton``'s own constexprs and warps at budget n, top-k k, L = 15."""
    return KB.beam_prune_constexprs(15, k, n, candidate_pairs(n, k, "cpu")[0].numel(), **kw)


CASES = [
    (KV._tree_links_kernel, dict(parents_ptr=I64, valid_ptr=I8, ri_ptr=I64, rnt_ptr=I64, rns_ptr=I64,
                                N1=C, BLOCK=C), dict(N1=513, BLOCK=256), 4),
    (KV._tree_mask_kernel, dict(parents_ptr=I64, valid_ptr=I8, mask_ptr=I8, N1=C, MAX_DEPTH=C,
                               BLOCK_R=C, BLOCK_C=C), dict(N1=513, MAX_DEPTH=15, BLOCK_R=32, BLOCK_C=256), 4),
    (KV._custom_mask_kernel, dict(tree_mask_ptr=I8, prefix_ptr=I64, start_ptr=I64, out_ptr=I8, N1=C,
                                 BLOCK_R=C, BLOCK_C=C), dict(N1=513, BLOCK_R=8, BLOCK_C=256), 4),
    (KW._greedy_walk_kernel, dict(tokens_ptr=I64, parents_ptr=I64, valid_ptr=I8, target_ptr=I64,
                                 acc_idx_ptr=I64, acc_len_ptr=I64, bonus_ptr=I64, N1=C, L=C, BLOCK=C),
     dict(N1=513, L=15, BLOCK=1024), 8),
    (KP._lse_kernel, dict(x_ptr="*bf16", out_ptr=F32, V=C, BLOCK=C), dict(V=151936, BLOCK=2048), 8),
    (KP._tie_fix_kernel, dict(x_ptr="*bf16", thr_ptr="*bf16", ngt_ptr=I64, ids_ptr=I64, K="i32", V=C,
                             BLOCK=C), dict(V=151936, BLOCK=2048), 8),
    (KP._prep_partial_kernel, dict(x_ptr="*bf16", thr_ptr="*bf16", pm_ptr=F32, ps_ptr=F32, pc_ptr=I64,
                                  NCH="i32", V=C, CH=C), dict(V=151936, CH=4096), 8),
    (KP._prep_combine_kernel, dict(pm_ptr=F32, ps_ptr=F32, pc_ptr=I64, lse_ptr=F32, pstart_ptr=I64,
                                  NCH="i32", NCHP=C), dict(NCHP=64), 1),
    (KP._tie_write_kernel, dict(x_ptr="*bf16", thr_ptr="*bf16", ngt_ptr=I64, pstart_ptr=I64, pc_ptr=I64,
                               ids_ptr=I64, K="i32", NCH="i32", V=C, CH=C), dict(V=151936, CH=4096), 8),
    (KB._beam_kernel, dict(lp_ptr=F32, ci_ptr=I64, ck_ptr=I64, score_ptr=F32, valid_ptr=I8, parent_ptr=I64,
                          rank_ptr=I64, gtop_ptr=I64, scratch_ptr=I64, scratch2_ptr=I64, K="i32", N="i32",
                          C="i32", L=C, NP=C, CP=C), dict(L=15, NP=256, CP=2048), 8),
    (KB._beam_select_kernel, dict(lp_ptr=F32, ci_ptr=I64, ck_ptr=I64, score_ptr=F32, valid_ptr=I8,
                                 parent_ptr=I64, rank_ptr=I64, gtop_ptr=I64, gkey_ptr=I64, scr_ptr=I64,
                                 K="i32", N="i32", C="i32", L=C, NP=C, CP=C, GP=C, ROUNDS=C),
     dict(L=15, NP=512, CP=4096, GP=8192, ROUNDS=15), 16),
    (KB._beam_prune_kernel, BEAM_PRUNE_SIG, *_beam_prune(512, 512)),
    (KB._tight_bound_kernel, dict(lp_ptr=F32, tval_ptr=F32, fs_ptr=F32, own_ptr="*i32", N="i32", K="i32",
                                 L=C, DP=C, J=C, NP=C, LOGKP=C),
     dict(L=15, DP=16, J=128, NP=512, LOGKP=9), 4),
    (KB._beam_prune_kernel, BEAM_PRUNE_SIG, *_beam_prune(16, 8, gen=False, bound="tight", programs=8)),
    (KV._label_depth_kernel, dict(gtop_ptr=I64, nb_ptr=I64, root_ptr=I64, ids_ptr=I64, score_ptr=F32,
                                 parent_ptr=I64, rank_ptr=I64, slot_ptr=I64, cnt_ptr="*i32",
                                 tok_ptr=I64, par_ptr=I64, dep_ptr=I64, val_ptr=I8, sco_ptr=F32,
                                 num_ptr=I64, ri_ptr=I64, rnt_ptr=I64, rns_ptr=I64, K="i32", N="i32",
                                 L=C, NP=C, N1P=C, LINKS=C),
     dict(L=15, NP=512, N1P=1024, LINKS=True), 4),
    # radix passes: T = 1 (one program per chunk), 38 (one looping program per row) and 13
    *[case for T in (1, 38, 13) for case in (
        (KP._rk_pass_a, dict(x_ptr="*bf16", pm_ptr=F32, ps_ptr=F32, h_ptr="*i32", NCH="i32", V=C, CH=C,
                            T=C), dict(V=151936, CH=4096, T=T), 8),
        (KP._rk_pass_b, dict(x_ptr="*bf16", b1_ptr="*i32", h_ptr="*i32", cg_ptr="*i32", V=C, CH=C, T=C),
         dict(V=151936, CH=4096, T=T), 8),
        (KP._rk_pass_c, dict(x_ptr="*bf16", t_ptr="*i32", ngt_ptr="*i32", og_ptr="*i32", oe_ptr="*i32",
                            cg_ptr="*i32", ce_ptr="*i32", key_ptr=I64, K="i32", V=C, CH=C, T=C),
         dict(V=151936, CH=4096, T=T), 8),
    )],
    (KP._rk_combine_a, dict(pm_ptr=F32, ps_ptr=F32, h_ptr="*i32", lse_ptr=F32, b1_ptr="*i32",
                           ab_ptr="*i32", K="i32", NCH="i32", P="i32", NCHP=C, PP=C),
     dict(NCHP=64, PP=64), 4),
    (KP._rk_combine_b, dict(b1_ptr="*i32", ab_ptr="*i32", h_ptr="*i32", cg_ptr="*i32", t_ptr="*i32",
                           ngt_ptr="*i32", og_ptr="*i32", oe_ptr="*i32", ce_ptr="*i32", K="i32",
                           P="i32", PP=C), dict(PP=64), 4),
    (KP._rk_final, dict(x_ptr="*bf16", key_ptr=I64, lse_ptr=F32, lp_ptr=F32, ids_ptr=I64, K="i32",
                       V=C, KP=C), dict(V=151936, KP=512), 4),
    # bound prep
    (KP._bd_pass_a, dict(x_ptr="*bf16", pm_ptr=F32, ps_ptr=F32, sbm_ptr="*i32", NCH="i32", V=C, CH=C,
                        SB=C, W32=C), dict(V=151936, CH=4096, SB=64, W32=False), 8),
    (KP._bd_combine_a, dict(pm_ptr=F32, ps_ptr=F32, sbm_ptr="*i32", lse_ptr=F32, thr_ptr="*i32",
                           cnt_ptr="*i32", K="i32", NCH="i32", NSB="i32", NCHP=C, NSBP=C, SPC=C, ROUNDS=C),
     dict(NCHP=64, NSBP=4096, SPC=64, ROUNDS=8), 8),
    (KP._bd_pass_b, dict(x_ptr="*bf16", sbm_ptr="*i32", thr_ptr="*i32", cnt_ptr="*i32", cand_ptr=I64,
                        NCH="i32", CAP="i32", V=C, CH=C, SB=C), dict(V=151936, CH=4096, SB=64), 8),
    (KP._bd_final, dict(x_ptr="*bf16", cand_ptr=I64, cnt_ptr="*i32", lse_ptr=F32, lp_ptr=F32,
                       ids_ptr=I64, K="i32", CAP="i32", V=C, CAPP=C, KP=C),
     dict(V=151936, CAPP=1024, KP=512), 16),
    (KP._bd_fallback, dict(x_ptr="*bf16", cnt_ptr="*i32", key_ptr=I64, lse_ptr=F32, lp_ptr=F32,
                          ids_ptr=I64, K="i32", CAP="i32", NCH="i32", V=C, CH=C, KP=C),
     dict(V=151936, CH=4096, KP=512), 8),
    # small-K prep: pass A for fp32 (_bd_pass_a's 32-bit image), the row select for both images
    (KP._bd_pass_a, dict(x_ptr=F32, pm_ptr=F32, ps_ptr=F32, sbm_ptr=I64, NCH="i32", V=C, CH=C, SB=C, W32=C),
     dict(V=151936, CH=4096, SB=128, W32=True), 8),
    *[(KP._sk_select, dict(x_ptr=xt, pm_ptr=F32, ps_ptr=F32, sbm_ptr=st, gsc_ptr="*i32", csc_ptr=I64,
                           lse_ptr=F32, lp_ptr=F32, ids_ptr=I64, K="i32", NCH="i32", NSB="i32", CAP="i32",
                           V=C, SB=C, SPC=C, W32=C, NCHP=C, NSBP=C, GS=C, GRP=C, CAPP=C, KP=C, ROUNDS=C),
       dict(V=151936, SB=128, SPC=32, W32=w32, NCHP=64, NSBP=2048, GS=32, GRP=16, CAPP=256, KP=32,
            ROUNDS=14 if w32 else 8), 8)
      for xt, st, w32 in (("*bf16", "*i32", False), (F32, I64, True))],
    # tree-verify attention: Qwen3-8B heads (GQA 4, D 128) at T 16 (one 64-row block, split prefix),
    # T 65 (three 128-row blocks, one split), T 16 causal (a chain step: no mask), and T 16 with a
    # mask row read per query row (FOLD_G off: a group that is no power of two)
    *[(KA._tree_verify_attn_kernel, dict(
        Q="*bf16", K_new="*bf16", V_new="*bf16", O="*bf16", K_buf="*bf16", V_buf="*bf16",
        qo_indptr="*i32", kv_indptr="*i32", kv_indices=I64, custom_mask="*u8", mask_indptr=I64,
        Acc=F32, Ml=F32, qk_scale="fp32", **{f"stride_{n}": "i64" for n in (
            "qt", "qh", "kt", "kh", "vt", "vh", "ot", "oh", "kbt", "kbh", "vbt", "vbh")},
        n_kv_heads="i32", G=C, MB=C, SPLITS=C, D=C, DV=C, BLOCK_M=C, BLOCK_N=C, BLOCK_D=C, BLOCK_DV=C,
        BLOCK_T=C, ANCESTORS_FIRST=C, CAUSAL=C, FOLD_G=C),
       dict(G=4, MB=mb, SPLITS=sp, D=128, DV=128, BLOCK_M=bm, BLOCK_N=64, BLOCK_D=128, BLOCK_DV=128,
            BLOCK_T=16 if bm < 128 else 32, ANCESTORS_FIRST=True, CAUSAL=causal, FOLD_G=fold), 4)
      for mb, sp, bm, causal, fold in ((1, 16, 64, False, True), (3, 1, 128, False, True),
                                       (1, 16, 64, True, True), (1, 16, 64, False, False))],
    (KA._tree_verify_merge_kernel, dict(O="*bf16", Acc=F32, Ml=F32, qo_indptr="*i32", stride_ot="i64",
                                        stride_oh="i64", n_kv_heads="i32", G=C, MB=C, SPLITS=C, DV=C,
                                        BLOCK_M=C, BLOCK_DV=C),
     dict(G=4, MB=1, SPLITS=16, DV=128, BLOCK_M=64, BLOCK_DV=128), 4),
]


def _compile_all():
    for fn, sig, consts, warps in CASES:
        k = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=consts),
                           target=GPUTarget("cuda", 90, 32), options={"num_warps": warps})
        assert k.asm.get("ptx"), fn
        print("compiled", getattr(fn, "__name__", fn))


def test_kernels_compile_for_sm90():
    """Compiled in a child process without TRITON_INTERPRET (under it, kernels are interpreted
    functions that cannot be compiled)."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    code = "import tests.unit.test_ddtree_kernels_compile as t; t._compile_all()"
    r = subprocess.run([sys.executable, "-c", code], cwd=root, env=env, capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    assert r.stdout.count("compiled") == len(CASES)
