"""Plot the expected accept length sum_{u in T} q(u) of the DDTree tree vs the linear chain.

Drafter: a tiny randomly initialised Llama (transformers, seeded) as the target; the drafter's
per-depth distributions q_1..q_L are the target's logits along its own greedy chain plus Gaussian
noise (as in tests/unit/test_ddtree_lossless.py). For each budget N, the DDTree tree is the N best
prefixes (K = N) and its expected accepted draft tokens under q is sum_u q(u) (paper, Prop. 1);
the chain with N nodes is the argmax path of length min(N, L). Averaged over several contexts.
Runs on the CPU. Usage: python bench/accept_plot.py --out bench/results/DATE-cpu-accept-plot.png (the
recorded run: bench/results/2026-11-30-cpu-accept-plot.md and its .png)
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from patchsets.ddtree.modules.ddtree_reference import build_tree_reference  # noqa: E402


@torch.no_grad()
def drafter_logits(model, ctx, L, noise, gen):
    seq = list(ctx)
    out = []
    for _ in range(L):
        lg = model(torch.tensor([seq])).logits[0, -1].float()
        out.append(lg + noise * torch.randn(lg.shape, generator=gen))
        seq.append(int(lg.argmax()))
    return torch.stack(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=f"bench/results/{time.strftime('%Y-%m-%d')}-cpu-accept-plot.png",
                    help="the PNG to write (default: a dated file under bench/results/, beside its .md)")
    ap.add_argument("--vocab", type=int, default=256)
    ap.add_argument("--contexts", type=int, default=8)
    ap.add_argument("--noise", type=float, default=0.5)
    ap.add_argument("--init-range", type=float, default=0.6)
    a = ap.parse_args()
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=a.vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      initializer_range=a.init_range)
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).eval()
    gen = torch.Generator().manual_seed(1)
    L = 15
    budgets = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]
    tree_e = torch.zeros(len(budgets), dtype=torch.float64)
    chain_e = torch.zeros(len(budgets), dtype=torch.float64)
    for c in range(a.contexts):
        ctx = torch.randint(0, a.vocab, (6,), generator=gen).tolist()
        x = drafter_logits(model, ctx, L, a.noise, gen)
        logq = torch.log_softmax(x.double(), -1)
        top1 = torch.cumsum(logq.max(-1).values, 0).exp()  # q(argmax prefix of length d)
        for i, N in enumerate(budgets):
            t = build_tree_reference(x, N, N)
            tree_e[i] += t.scores.double().exp().sum()
            chain_e[i] += top1[: min(N, L)].sum()
    tree_e /= a.contexts
    chain_e /= a.contexts
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    ax.plot(budgets, tree_e.numpy(), "o-", label="DDTree tree (best N prefixes)")
    ax.plot(budgets, chain_e.numpy(), "s--", label="linear chain (argmax, length min(N, L))")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("node budget N (draft tokens verified per step, root excluded)")
    ax.set_ylabel("expected accepted draft tokens  Σ q(u)")
    ax.set_title(f"Tiny Llama drafter (V={a.vocab}, init {a.init_range}, L={L}, noise σ={a.noise}), mean of {a.contexts} contexts",
                 fontsize=9)
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(a.out, dpi=120)
    for N, te, ce in zip(budgets, tree_e.tolist(), chain_e.tolist()):
        print(f"N={N:5d} tree={te:7.3f} chain={ce:7.3f}")


if __name__ == "__main__":
    main()
