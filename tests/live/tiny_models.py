"""Tiny seeded model fixtures for live SGLang DFlash / DDTree tests on CPU.

Usage::

    python tests/live/tiny_models.py OUTDIR [--fixture trained|random|all]

or ``build_fixtures(Path(OUTDIR), ["trained", "random"])`` from a conftest.

Every fixture is a directory::

    OUTDIR/<fixture>/target/     tiny Qwen3ForCausalLM (float32)
    OUTDIR/<fixture>/draft-b4/   DFlash draft, block size 4 (DFlashDraftModel, float32)
    OUTDIR/<fixture>/draft-b8/   DFlash draft, block size 8
    OUTDIR/<fixture>/fixture.json  what it is, seeds, default prompts, acceptance figures

Each model directory holds ``config.json``, ``model.safetensors``, ``tokenizer.json``,
``tokenizer_config.json`` and ``generation_config.json``: what ``sglang.Engine`` loads.

Regimes:

``trained``  (regime a) A target trained on a synthetic language, and drafts trained on
    the target's own greedy continuations. The draft is right often but not always, and
    when its top-1 is wrong its top-2 / top-3 often holds the target's token, so trees
    (which branch on top-k) can accept paths that the chain does not. Block-4 DFLASH
    accept length is about 2.5, per-step accepts spread over 0..3 (see fixture.json).
    The drafts are deliberately trained short of convergence (DRAFT_STEPS): trained to
    the end they learn the cycles that greedy decoding of any small language falls into,
    and accept nearly whole blocks.
``random``  (regime b) Seeded random weights, same shapes. The draft is almost never
    right (accept length about 1.04), and the target's greedy output depends on attention
    over the whole context (about 85% of its tokens change when attention sees only the
    last 4 tokens), so a wrong tree mask or a KV-cache bug changes tokens.

The synthetic language: 40 "words", each a fixed run of 1-3 syllables whose first syllable
belongs to it alone. The tokenizer (byte-level BPE, full byte alphabet, whose pre-tokenizer
splits text into syllables) makes every syllable of the language one token, so once a word
has started its remaining tokens are determined. The next word is drawn from 4 candidates
(probabilities 0.4 / 0.3 / 0.2 / 0.1) picked by the previous word and the class (one of 4)
of the word before it; near-equal first choices make the target's greedy pick depend on
context in ways a one-layer draft only partly learns.

Shapes (both regimes): hidden 64, 3 target layers, 4 query heads / 2 KV heads, head_dim 16,
MLP 128, untied embeddings, RoPE theta 10000; tokenizer 371 tokens, config vocab_size 384
(rows 371..383 of ``embed_tokens`` and ``lm_head`` are zero; the default prompts never emit
them). The draft: 1 layer of the same shape, ``fc`` [64, 2*64] over the target's hidden states
after layers 0 and 1 (``target_layer_ids`` [0, 1]), no embedding or LM head of its own.
Everything float32.

SGLang's DFlash draft math, as reimplemented by :class:`DFlashDraft` (from
``sglang/srt/models/dflash.py`` and ``speculative/dflash_worker_v2.py``, 0.5.23):

* context: ``ctx = hidden_norm(fc(concat_k target_hidden_k))`` for every committed
  position; in each draft layer its K/V are ``k_norm(k_proj(ctx))`` + RoPE at the
  position, ``v_proj(ctx)`` (no ``input_layernorm`` on the context);
* block: ``[bonus, MASK x (B-1)]`` embedded with the target's embedding, positions
  ``prefix_len + 0..B-1``; a pre-norm Qwen3 layer whose queries attend to all context
  K/V plus the whole block, non-causally (the layer is ``ENCODER_ONLY`` because the
  config has ``layer_types`` ["full_attention"] and no ``is_causal``);
* ``norm`` then the target's ``lm_head``; block positions 1..B-1 give the draft tokens.

Checked against SGLang itself: the chain accept lengths this module predicts offline
(fixture.json ``offline``) equal, prompt by prompt, the ``spec_accept_length`` a real
SGLang 0.5.23 engine reports (``measured``); a causal in-block mask, or features taken one
layer earlier, predict different ones.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import inspect
import json
import math
import os
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from torch import nn

FIXTURES = ("trained", "random")
BLOCK_SIZES = (4, 8)
SEEDS = {"language": 7, "tokenizer": 7, "target_data": 8, "target": 11, "draft_data": 99, "draft": 23,
         "random": 1234, "prompts": 5}
EOS_TOKEN = "<|endoftext|>"
MASK_TOKEN = "<|MASK|>"
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)

HIDDEN, LAYERS, HEADS, KV_HEADS, HEAD_DIM, MLP = 64, 3, 4, 2, 16, 128
DRAFT_LAYERS = 1
TARGET_LAYER_IDS = (0, 1)  # SGLang captures the input of layer id+1: ids < LAYERS - 1
ROPE_THETA = 10000.0
RMS_EPS = 1e-6
SEQ_LEN = 64          # training sequence length (tokens)
TARGET_STEPS = 200    # target training steps (batch 32 x SEQ_LEN)
DRAFT_STEPS = {4: 200, 8: 300}  # chosen so block-4 accept length lands near 2.5, not 4
RANDOM_STD = 1.0      # regime (b): matrices N(0, RANDOM_STD^2 / fan_in); 0.5 left the output mostly a bigram map
RANDOM_LM_HEAD_STD = 4.0
N_NEW = 32            # tokens the live tests generate per prompt
PROMPT_WORDS = (1, 3, 6, 12, 24)  # default prompts: this many words each
N_EVAL_PROMPTS = 24   # prompts (defaults first) behind the offline figures
MIN_MARGIN = 1e-2     # default prompts: every greedy token's logit is this far above any other (float noise ~1e-5)
N_CLASSES = 4
TAIL_LENGTHS = (0, 0, 1, 1, 2)


# ----------------------------------------------------------------------------- language


@dataclass(frozen=True)
class Language:
    """A seeded word-level language; see the module docstring."""

    words: tuple[str, ...]
    word_class: tuple[int, ...]
    # (class of the word two back, previous word) -> 4 candidate next words, likeliest first
    next_words: dict[tuple[int, int], tuple[int, ...]]
    probs: tuple[float, ...] = (0.4, 0.3, 0.2, 0.1)

    def sample(self, rng: random.Random, n_words: int) -> str:
        """A text of ``n_words`` words separated by single spaces."""
        ids = [rng.randrange(len(self.words))]
        while len(ids) < n_words:
            two_back = self.word_class[ids[-2]] if len(ids) > 1 else 0
            ids.append(rng.choices(self.next_words[(two_back, ids[-1])], self.probs)[0])
        return " ".join(self.words[i] for i in ids)


def make_language(seed: int) -> Language:
    """40 words over 14x5 consonant-vowel syllables; first syllables are unique per word."""
    rng = random.Random(seed)
    syllables = sorted(c + v for c in "bdfgklmnprstvz" for v in "aeiou")
    rng.shuffle(syllables)
    heads, tails = syllables[:40], syllables[40:64]
    words = tuple(h + "".join(rng.choice(tails) for _ in range(rng.choice(TAIL_LENGTHS))) for h in heads)
    word_class = tuple(rng.randrange(N_CLASSES) for _ in words)
    n = len(words)
    next_words = {(c, w): tuple(rng.sample(range(n), 4)) for c in range(N_CLASSES) for w in range(n)}
    return Language(words, word_class, next_words)


def train_tokenizer(lang: Language, seed: int) -> Tokenizer:
    """Byte-level BPE trained on the language; its pre-tokenizer splits text into syllables
    (an optional leading space, consonants, one vowel), so BPE merges stop at a syllable."""
    rng = random.Random(seed)
    corpus = [lang.sample(rng, 40) for _ in range(400)]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(" ?[^aeiou ]*[aeiou]"), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=1000, special_tokens=[EOS_TOKEN, MASK_TOKEN], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())  # any text encodes
    tok.train_from_iterator(corpus, trainer)
    return tok


def write_tokenizer(tok: Tokenizer, d: Path) -> None:
    """tokenizer.json, tokenizer_config.json (PreTrainedTokenizerFast) and generation_config.json."""
    tok.save(str(d / "tokenizer.json"))
    eos = tok.token_to_id(EOS_TOKEN)
    specials = {
        str(tok.token_to_id(s)): {
            "content": s, "special": True, "lstrip": False, "rstrip": False, "normalized": False, "single_word": False,
        }
        for s in (EOS_TOKEN, MASK_TOKEN)
    }
    cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None, "eos_token": EOS_TOKEN, "pad_token": EOS_TOKEN, "unk_token": None,
        "model_max_length": 4096, "clean_up_tokenization_spaces": False,
        "added_tokens_decoder": specials, "chat_template": CHAT_TEMPLATE,
    }
    _write_json(d / "tokenizer_config.json", cfg)
    _write_json(d / "generation_config.json", {"eos_token_id": eos, "pad_token_id": eos, "do_sample": False})


# ----------------------------------------------------------------------------- configs


def _base_config(vocab_size: int, eos: int) -> dict[str, object]:
    return {
        "model_type": "qwen3", "hidden_size": HIDDEN, "intermediate_size": MLP,
        "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS, "head_dim": HEAD_DIM,
        "vocab_size": vocab_size, "max_position_embeddings": 4096, "rms_norm_eps": RMS_EPS,
        "rope_theta": ROPE_THETA, "rope_parameters": {"rope_type": "default", "rope_theta": ROPE_THETA},
        "hidden_act": "silu", "attention_bias": False, "tie_word_embeddings": False,
        "torch_dtype": "float32", "bos_token_id": eos, "eos_token_id": eos, "pad_token_id": eos,
        "use_sliding_window": False, "sliding_window": None, "attention_dropout": 0.0,
        "initializer_range": 0.02,
    }


def target_config(vocab_size: int, eos: int) -> dict[str, object]:
    """config.json of the Qwen3ForCausalLM target."""
    return dict(_base_config(vocab_size, eos), architectures=["Qwen3ForCausalLM"],
                num_hidden_layers=LAYERS, max_window_layers=LAYERS)


def draft_config(vocab_size: int, eos: int, block: int, mask_id: int) -> dict[str, object]:
    """config.json of a DFlash draft in SGLang's checkpoint format."""
    return dict(
        _base_config(vocab_size, eos), architectures=["DFlashDraftModel"], num_hidden_layers=DRAFT_LAYERS,
        max_window_layers=DRAFT_LAYERS, num_target_layers=LAYERS, block_size=block,
        dflash_config={"block_size": block, "target_layer_ids": list(TARGET_LAYER_IDS),
                       "mask_token": MASK_TOKEN, "mask_token_id": mask_id},
    )


def _hf_target(cfg: dict[str, object]) -> nn.Module:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    fields = {k: v for k, v in cfg.items() if k not in ("architectures", "model_type", "torch_dtype", "rope_theta")}
    model = Qwen3ForCausalLM(Qwen3Config(**fields))
    return model.float()


# ----------------------------------------------------------------------------- draft


class RMSNorm(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + RMS_EPS) * self.weight


def rope(x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """Neox-style RoPE. x [..., T, heads, HEAD_DIM], pos [..., T] int64."""
    inv = 1.0 / ROPE_THETA ** (torch.arange(0, HEAD_DIM, 2, dtype=torch.float32) / HEAD_DIM)
    ang = pos.to(torch.float32)[..., None] * inv  # [..., T, HEAD_DIM/2]
    cos, sin = torch.cat([ang, ang], -1).cos()[..., None, :], torch.cat([ang, ang], -1).sin()[..., None, :]
    x1, x2 = x[..., : HEAD_DIM // 2], x[..., HEAD_DIM // 2 :]
    return x * cos + torch.cat([-x2, x1], -1) * sin


class DraftAttention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.q_proj = nn.Linear(HIDDEN, HEADS * HEAD_DIM, bias=False)
        self.k_proj = nn.Linear(HIDDEN, KV_HEADS * HEAD_DIM, bias=False)
        self.v_proj = nn.Linear(HIDDEN, KV_HEADS * HEAD_DIM, bias=False)
        self.o_proj = nn.Linear(HEADS * HEAD_DIM, HIDDEN, bias=False)
        self.q_norm = RMSNorm(HEAD_DIM)
        self.k_norm = RMSNorm(HEAD_DIM)

    def kv(self, h: torch.Tensor, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """h [N, T, HIDDEN] -> K (normed, roped), V: [N, T, KV_HEADS, HEAD_DIM]."""
        k = self.k_norm(self.k_proj(h).unflatten(-1, (KV_HEADS, HEAD_DIM)))
        return rope(k, pos), self.v_proj(h).unflatten(-1, (KV_HEADS, HEAD_DIM))

    def forward(self, h: torch.Tensor, pos: torch.Tensor, ctx_k: torch.Tensor, ctx_v: torch.Tensor,
                mask: torch.Tensor) -> torch.Tensor:
        """h [N, Q, HIDDEN] block inputs (normed); ctx_k/ctx_v [N, C, KV_HEADS, HEAD_DIM];
        mask [N, Q, C + Q] bool (True = may attend)."""
        q = rope(self.q_norm(self.q_proj(h).unflatten(-1, (HEADS, HEAD_DIM))), pos)
        k, v = self.kv(h, pos)
        k, v = torch.cat([ctx_k, k], 1), torch.cat([ctx_v, v], 1)
        rep = HEADS // KV_HEADS
        k, v = k.repeat_interleave(rep, 2), v.repeat_interleave(rep, 2)
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                             attn_mask=mask[:, None])
        return self.o_proj(out.transpose(1, 2).flatten(-2))


class DraftMLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(HIDDEN, MLP, bias=False)
        self.up_proj = nn.Linear(HIDDEN, MLP, bias=False)
        self.down_proj = nn.Linear(MLP, HIDDEN, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DraftLayer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(HIDDEN)
        self.self_attn = DraftAttention()
        self.post_attention_layernorm = RMSNorm(HIDDEN)
        self.mlp = DraftMLP()

    def forward(self, residual: torch.Tensor, pos: torch.Tensor, ctx: torch.Tensor, ctx_pos: torch.Tensor,
                mask: torch.Tensor) -> torch.Tensor:
        """Pre-norm layer over the block's residual stream [N, Q, HIDDEN]; the projected
        context ctx [N, C, HIDDEN] only supplies K/V, without input_layernorm (as SGLang)."""
        ctx_k, ctx_v = self.self_attn.kv(ctx, ctx_pos)
        residual = residual + self.self_attn(self.input_layernorm(residual), pos, ctx_k, ctx_v, mask)
        return residual + self.mlp(self.post_attention_layernorm(residual))


class DFlashDraft(nn.Module):
    """SGLang's DFlash draft, in plain torch; its state_dict is the checkpoint
    (``fc``, ``hidden_norm``, ``layers.N.*``, ``norm``; float32)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(len(TARGET_LAYER_IDS) * HIDDEN, HIDDEN, bias=False)
        self.hidden_norm = RMSNorm(HIDDEN)
        self.layers = nn.ModuleList([DraftLayer() for _ in range(DRAFT_LAYERS)])
        self.norm = RMSNorm(HIDDEN)

    def forward(self, feats: torch.Tensor, block_embeds: torch.Tensor, block_pos: torch.Tensor,
                mask: torch.Tensor) -> torch.Tensor:
        """feats [N, C, K*HIDDEN] captured target hidden states of context positions 0..C-1;
        block_embeds [N, Q, HIDDEN] target embeddings of the block tokens; block_pos [N, Q];
        mask [N, Q, C + Q] bool. Returns final-normed hidden states [N, Q, HIDDEN]."""
        ctx = self.hidden_norm(self.fc(feats))
        ctx_pos = torch.arange(feats.shape[1]).expand(feats.shape[:2])
        residual = block_embeds
        for layer in self.layers:
            residual = layer(residual, block_pos, ctx, ctx_pos, mask)
        return self.norm(residual)


def block_inputs(tokens: torch.Tensor, anchors: torch.Tensor, block: int, mask_id: int
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """tokens [N, T], anchors [N, A] (bonus positions). Returns block ids [N, A*B]
    ([bonus, MASK...] per anchor), positions [N, A*B] and the attention mask [N, A*B, T + A*B]:
    anchor a's queries see context positions < a and their own block, all of it."""
    n, t = tokens.shape
    a = anchors.shape[1]
    ids = torch.full((n, a, block), mask_id, dtype=torch.long)
    ids[:, :, 0] = tokens.gather(1, anchors)
    pos = anchors[:, :, None] + torch.arange(block)
    ctx_ok = torch.arange(t)[None, None, :] < anchors[:, :, None]  # [N, A, T]
    own = torch.eye(a, dtype=torch.bool)[None].expand(n, a, a)
    mask = torch.cat([ctx_ok[:, :, None, :].expand(n, a, block, t),
                      own[:, :, None, :, None].expand(n, a, block, a, block).flatten(-2)], -1)
    return ids.flatten(1), pos.flatten(1), mask.flatten(1, 2)


# ----------------------------------------------------------------------------- target helpers


def capture(model: nn.Module, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """tokens [N, T] -> (logits [N, T, V], draft features [N, T, K*HIDDEN]: the residual
    stream after each layer in TARGET_LAYER_IDS, concatenated, as SGLang captures it)."""
    out = model(input_ids=tokens, output_hidden_states=True)
    feats = torch.cat([out.hidden_states[i + 1] for i in TARGET_LAYER_IDS], -1)
    return out.logits, feats


@functools.cache
def _cache_arg() -> str:
    """transformers 5.24 renamed ``past_key_values`` (argument and output) to ``cache``."""
    from transformers import Qwen3ForCausalLM

    return "cache" if "cache" in inspect.signature(Qwen3ForCausalLM.forward).parameters else "past_key_values"


@torch.no_grad()
def greedy(model: nn.Module, tokens: torch.Tensor, n_new: int, n_real: int) -> torch.Tensor:
    """tokens [N, T] -> [N, T + n_new]: greedy continuation (KV-cached), never choosing a
    padding id (>= n_real)."""
    out = model(input_ids=tokens, use_cache=True)
    for i in range(n_new):
        nxt = out.logits[:, -1, :n_real].argmax(-1, keepdim=True)
        tokens = torch.cat([tokens, nxt], 1)
        if i + 1 < n_new:
            out = model(input_ids=nxt, use_cache=True, **{_cache_arg(): getattr(out, _cache_arg())})
    return tokens


def train_target(model: nn.Module, data: torch.Tensor, steps: int, seed: int) -> float:
    """Next-token training on data [N, SEQ_LEN] (batch 32, AdamW, one-cycle LR); returns the last loss."""
    g = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.0, betas=(0.9, 0.98))
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=1e-2, total_steps=steps, pct_start=0.1)
    model.train()
    loss = torch.tensor(0.0)
    for _ in range(steps):
        batch = data[torch.randint(0, data.shape[0], (32,), generator=g)]
        logits = model(input_ids=batch).logits
        loss = F.cross_entropy(logits[:, :-1].flatten(0, 1), batch[:, 1:].flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
    model.eval()
    return loss.item()


def train_draft(target: nn.Module, corpus: list[tuple[int, torch.Tensor, torch.Tensor]], block: int,
                steps: int, seed: int, mask_id: int) -> DFlashDraft:
    """Trains a draft to predict the target's greedy tokens: corpus items are (prompt length,
    tokens [N, SEQ_LEN] = prompt + target greedy continuation, features [N, SEQ_LEN, K*HIDDEN]).
    Each example is a block anchored at a greedy position p: context = positions < p, block =
    [tokens[p], MASK...], labels tokens[p+1..p+B-1]. The target's embedding and lm_head are frozen."""
    emb, head = target.model.embed_tokens.weight.detach(), target.lm_head.weight.detach()
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    draft = DFlashDraft()
    opt = torch.optim.AdamW(draft.parameters(), lr=3e-3, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=3e-3, total_steps=steps, pct_start=0.1)
    batch, anchors_per_seq = 32, 32 // block
    for step in range(steps):
        plen, tokens, feats = corpus[step % len(corpus)]
        rows = torch.randint(0, tokens.shape[0], (batch,), generator=g)
        tokens, feats = tokens[rows], feats[rows]
        anchors = plen + torch.randint(0, SEQ_LEN - block - plen + 1, (batch, anchors_per_seq), generator=g)
        ids, pos, mask = block_inputs(tokens, anchors, block, mask_id)
        hidden = draft(feats, emb[ids], pos, mask).unflatten(1, (anchors_per_seq, block))[:, :, 1:]
        labels = tokens.gather(1, (anchors[:, :, None] + torch.arange(1, block)).flatten(1))
        loss = F.cross_entropy((hidden @ head.T).flatten(0, 2), labels.flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
    return draft.eval()


@torch.no_grad()
def greedy_corpus(target: nn.Module, lang: Language, tok: Tokenizer, seed: int, n_real: int
                  ) -> list[tuple[int, torch.Tensor, torch.Tensor]]:
    """Sampled prompts of 4..48 tokens (64 per length), each continued greedily by the target
    to SEQ_LEN tokens, with the target features the draft reads (see :func:`train_draft`)."""
    rng = random.Random(seed)
    corpus = []
    for plen in range(4, 52, 4):
        prompts = torch.tensor([sample_ids(lang, tok, rng, plen) for _ in range(64)])
        tokens = greedy(target, prompts, SEQ_LEN - plen, n_real)
        corpus.append((plen, tokens, capture(target, tokens)[1]))
    return corpus


def sample_ids(lang: Language, tok: Tokenizer, rng: random.Random, n_tokens: int) -> list[int]:
    """The first n_tokens token ids of a sampled text."""
    ids: list[int] = []
    while len(ids) < n_tokens:
        ids = tok.encode(lang.sample(rng, n_tokens)).ids
    return ids[:n_tokens]


def randomize_(model: nn.Module, seed: int, lm_head_std: float) -> None:
    """Regime (b) weights: norms 1, embeddings N(0, 1), lm_head N(0, lm_head_std^2 / fan_in),
    every other matrix N(0, RANDOM_STD^2 / fan_in)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            elif "embed_tokens" in name:
                p.normal_(0.0, 1.0, generator=g)
            else:
                std = (lm_head_std if name == "lm_head.weight" else RANDOM_STD) / math.sqrt(p.shape[1])
                p.normal_(0.0, std, generator=g)


# ----------------------------------------------------------------------------- measuring


@dataclass
class PromptRun:
    """One prompt's target greedy output (token ids) and how robust it is."""

    prompt: list[int]
    greedy: list[int]          # the target's n_new greedy tokens
    min_margin: float          # smallest (greedy token's logit - best other logit, padding ids included)
    window_changed: float      # fraction of greedy tokens that change when attention sees only the last 4 tokens


@torch.no_grad()
def run_prompt(target: nn.Module, prompt: list[int], n_new: int, n_real: int) -> tuple[PromptRun, torch.Tensor]:
    """The greedy run of one prompt; also returns the tokens [1, len + n_new + 8] (8 extra
    greedy tokens so every block anchored in the output has labels)."""
    tokens = greedy(target, torch.tensor([prompt]), n_new + max(BLOCK_SIZES), n_real)
    logits = target(input_ids=tokens).logits[0, len(prompt) - 1 : len(prompt) - 1 + n_new]  # all ids, padding too
    nxt = tokens[0, len(prompt) : len(prompt) + n_new]
    chosen = logits.gather(1, nxt[:, None])[:, 0]
    margin = float((chosen - logits.scatter(1, nxt[:, None], float("-inf")).max(-1).values).min())
    ends = torch.arange(len(prompt), len(prompt) + n_new)  # greedy token i sits at ends[i]
    starts = (ends - 4).clamp(min=0)
    windows = torch.stack([tokens[0, a : a + 4] for a in starts.tolist()])  # causal: later tokens do not matter
    w_logits = target(input_ids=windows, position_ids=starts[:, None] + torch.arange(4)).logits
    changed = int((w_logits[torch.arange(n_new), ends - 1 - starts, :n_real].argmax(-1) != nxt).sum())
    run = PromptRun(prompt, nxt.tolist(), margin, changed / n_new)
    return run, tokens


@torch.no_grad()
def draft_topk(target: nn.Module, draft: DFlashDraft, tokens: torch.Tensor, plen: int, n_new: int,
               block: int, mask_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """For every bonus position p in plen..plen+n_new-1: the draft's top-3 ids at block
    depths 1..B-1 [n_new, B-1, 3] and the target's greedy tokens there [n_new, B-1]."""
    feats = capture(target, tokens)[1]
    anchors = torch.arange(plen, plen + n_new)[None]
    ids, pos, mask = block_inputs(tokens, anchors, block, mask_id)
    emb, head = target.model.embed_tokens.weight, target.lm_head.weight  # all rows, as SGLang
    hidden = draft(feats, emb[ids], pos, mask).unflatten(1, (n_new, block))[0, :, 1:]
    labels = tokens[0, anchors[0][:, None] + torch.arange(1, block)]
    return (hidden @ head.T).topk(3, -1).indices, labels


def chain_accepts(top1: torch.Tensor, labels: torch.Tensor, n_new: int) -> list[int]:
    """Accepted draft tokens of each DFLASH step (greedy chain) until n_new tokens exist;
    top1/labels [n_new, B-1] indexed by the bonus position minus the prompt length."""
    accepts: list[int] = []
    done = 1  # the prefill's token
    while done < n_new:
        row = (top1[done - 1] == labels[done - 1]).long()
        accepts.append(int(row.cumprod(0).sum()))
        done += accepts[-1] + 1
    return accepts


# ----------------------------------------------------------------------------- building


@dataclass
class Models:
    """A fixture's models before they are written: target and drafts by block size."""

    target: nn.Module
    drafts: dict[int, DFlashDraft]


def _trained_models(lang: Language, tok: Tokenizer, cfg: dict[str, object], n_real: int, mask_id: int) -> Models:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEEDS["target"])
        target = _hf_target(cfg)
    rng = random.Random(SEEDS["target_data"])
    data = torch.tensor([sample_ids(lang, tok, rng, SEQ_LEN) for _ in range(4000)])
    train_target(target, data, TARGET_STEPS, SEEDS["target"])
    _zero_padding_(target, n_real)
    target.requires_grad_(False)
    corpus = greedy_corpus(target, lang, tok, SEEDS["draft_data"], n_real)
    with torch.random.fork_rng(devices=[]):
        drafts = {b: train_draft(target, corpus, b, DRAFT_STEPS[b], SEEDS["draft"] + b, mask_id) for b in BLOCK_SIZES}
    return Models(target, drafts)


def _random_models(cfg: dict[str, object], n_real: int) -> Models:
    with torch.random.fork_rng(devices=[]):
        target = _hf_target(cfg)
        drafts = {b: DFlashDraft() for b in BLOCK_SIZES}
    randomize_(target, SEEDS["random"], RANDOM_LM_HEAD_STD)
    for b, d in drafts.items():
        randomize_(d, SEEDS["random"] + b, RANDOM_LM_HEAD_STD)
    _zero_padding_(target, n_real)
    target.requires_grad_(False).eval()
    return Models(target, {b: d.requires_grad_(False).eval() for b, d in drafts.items()})


def _zero_padding_(target: nn.Module, n_real: int) -> None:
    """Rows of embed_tokens / lm_head beyond the tokenizer's vocabulary are zero."""
    with torch.no_grad():
        target.model.embed_tokens.weight[n_real:] = 0.0
        target.lm_head.weight[n_real:] = 0.0


def _measure(lang: Language, tok: Tokenizer, m: Models, n_real: int, mask_id: int) -> dict[str, object]:
    """Default prompts (greedy top-1 margins >= MIN_MARGIN) and the offline figures."""
    rng = random.Random(SEEDS["prompts"])
    defaults: list[tuple[str, PromptRun, torch.Tensor]] = []
    for words in PROMPT_WORDS:
        for _ in range(100):
            text = lang.sample(rng, words)
            run, tokens = run_prompt(m.target, tok.encode(text).ids, N_NEW, n_real)
            if run.min_margin >= MIN_MARGIN:
                defaults.append((text, run, tokens))
                break
        else:
            raise RuntimeError(f"no {words}-word prompt with greedy margins >= {MIN_MARGIN}")
    extra = [run_prompt(m.target, sample_ids(lang, tok, rng, rng.choice((4, 8, 16, 32))), N_NEW, n_real)
             for _ in range(N_EVAL_PROMPTS - len(defaults))]
    runs = [(r, t) for _, r, t in defaults] + extra
    offline: dict[str, object] = {}
    for b, draft in m.drafts.items():
        steps, hits, lengths = [], torch.zeros(b - 1, 3), []
        for run, tokens in runs:
            top, labels = draft_topk(m.target, draft, tokens, len(run.prompt), N_NEW, b, mask_id)
            hits += (top == labels[..., None]).long().cumsum(-1).clamp(max=1).sum(0)
            acc = chain_accepts(top[..., 0], labels, N_NEW)
            steps.append(acc)
            lengths.append(N_NEW / len(acc))
        offline[f"block{b}"] = {
            "accept_length_default_prompts": [round(x, 4) for x in lengths[: len(defaults)]],
            "accept_steps_default_prompts": steps[: len(defaults)],
            "accept_length_mean": round(sum(lengths) / len(lengths), 4),
            "accept_histogram": [sum(a.count(k) for a in steps) for k in range(b)],
            "topk_hit_by_depth": [[round(float(x), 4) for x in row] for row in hits / (len(runs) * N_NEW)],
        }
    offline["about"] = (
        "this module's torch reimplementation of the DFlash draft, not SGLang; over n_prompts prompts (the "
        "defaults first), N_NEW greedy tokens each. accept_length = N_NEW / DFLASH steps (SGLang's "
        "spec_accept_length); accept_histogram[k] = steps that accepted k draft tokens; topk_hit_by_depth[d-1] "
        "= [top-1, top-2, top-3]: share of bonus positions where the draft's top-k at depth d holds the "
        "target's greedy token; window4_changed = share of greedy tokens that change when the target's "
        "attention sees only the last 4 tokens")
    offline["n_prompts"] = len(runs)
    offline["window4_changed"] = round(sum(r.window_changed for r, _ in runs) / len(runs), 4)
    details = [{"text": text, "ids": run.prompt, "greedy_ids": run.greedy, "min_logit_margin": round(run.min_margin, 5)}
               for text, run, _ in defaults]
    return {"prompts": [text for text, _, _ in defaults], "prompt_details": details, "offline": offline}


def build_fixtures(out: Path, names: list[str] | tuple[str, ...] = FIXTURES) -> dict[str, Path]:
    """Builds the named fixtures under out (see the module docstring); returns name -> dir.
    Deterministic: same script and library versions give byte-identical files."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as fast for these sizes, and a busy 2-core machine does not thrash
    try:
        lang = make_language(SEEDS["language"])
        tok = train_tokenizer(lang, SEEDS["tokenizer"])
        n_real = tok.get_vocab_size()
        vocab = (n_real + 63) // 64 * 64
        eos, mask_id = tok.token_to_id(EOS_TOKEN), tok.token_to_id(MASK_TOKEN)
        cfg = target_config(vocab, eos)
        dirs = {}
        for name in names:
            if name not in FIXTURES:
                raise ValueError(f"unknown fixture {name!r} (one of {FIXTURES})")
            m = (_trained_models(lang, tok, cfg, n_real, mask_id) if name == "trained"
                 else _random_models(cfg, n_real))
            d = out / name
            (d / "target").mkdir(parents=True, exist_ok=True)
            _write_json(d / "target" / "config.json", cfg)
            _save(m.target.state_dict(), d / "target")
            write_tokenizer(tok, d / "target")
            for b, draft in m.drafts.items():
                dd = d / f"draft-b{b}"
                dd.mkdir(exist_ok=True)
                _write_json(dd / "config.json", draft_config(vocab, eos, b, mask_id))
                _save(draft.state_dict(), dd)
                write_tokenizer(tok, dd)
            info = {
                "fixture": name,
                "regime": REGIMES[name],
                "target": "target",
                "drafts": {str(b): f"draft-b{b}" for b in m.drafts},
                "block_sizes": list(m.drafts),
                "seeds": SEEDS,
                "steps": {"target": TARGET_STEPS, "draft": {str(b): DRAFT_STEPS[b] for b in BLOCK_SIZES}}
                if name == "trained" else {"random_std": RANDOM_STD, "lm_head_std": RANDOM_LM_HEAD_STD},
                "tokenizer": {"vocab": n_real, "config_vocab_size": vocab, "eos_token_id": eos,
                              "mask_token_id": mask_id},
                "max_new_tokens": N_NEW,
                "torch": torch.__version__,
                **_measure(lang, tok, m, n_real, mask_id),
            }
            models_sha = sha256_dir(d, skip=("fixture.json",))
            info["models_sha256"] = models_sha
            info["measured"] = dict(MEASURED_RUN, **MEASURED[name],
                                    for_these_models=MEASURED[name]["models_sha256"] == models_sha)
            _write_json(d / "fixture.json", info)
            dirs[name] = d
        return dirs
    finally:
        torch.set_num_threads(threads)


REGIMES = {
    "trained": "(a) target trained on a synthetic language; DFlash drafts trained on its greedy continuations: "
               "right often, not always; top-2/top-3 often hold the target's token when top-1 misses",
    "random": "(b) seeded random weights; the draft is almost never right; the target's output depends on "
              "attention over the whole context",
}

# Measured in a real SGLang 0.5.23 engine on CPU, per default prompt, from the models whose
# sha256 (every file but fixture.json) is models_sha256; fixture.json's measured.for_these_models
# says whether a build reproduced them (re-measure when training changes). spec_accept_length is
# SGLang's completion_tokens / spec_verify_ct.
MEASURED_RUN: dict[str, str] = {
    "date": "2026-12-02",
    "sglang": "0.5.23 (CPU: SGLANG_PLATFORM=sglpatch_cpu, tests/live/cpu_platform; TRITON_INTERPRET=1)",
    "command": ("python measure_sglang.py FIXTURE_DIR OUT.json [draft-b4|draft-b8] (a scratch script): "
                "sglang.Engine(model_path=target, device='cpu', dtype='float32', attention_backend='triton', "
                "disable_cuda_graph=True, mem_fraction_static=0.3, max_total_tokens=4096, max_running_requests=4, "
                "skip_server_warmup=True, random_seed=0[, speculative_algorithm='DFLASH', "
                "speculative_draft_model_path=draft, speculative_draft_attention_backend='triton']); "
                "the 5 default prompts one at a time, then as one batch; temperature 0, max_new_tokens 32, ignore_eos"),
}
MEASURED: dict[str, dict[str, object]] = {
    "trained": {
        "models_sha256": "45bada8f3300d91aa7a12d9af1b3c8516c1f1c8f7ec5bdc0730beb9320f469d7",
        "no_spec_equals_hf_greedy": True,
        "no_spec_single_equals_batched": True,
        "block4": {
            "spec_accept_length": [1.6, 2.6667, 2.9091, 2.2857, 2.0],
            "spec_accept_length_batched": [1.6, 2.6667, 2.9091, 2.2857, 2.0],
            "spec_num_correct_drafts": [12, 20, 23, 18, 15],
            "spec_verify_ct": [20, 12, 11, 14, 16],
            "equals_no_spec": True,  # single and batched
            "equals_offline_prediction": True,
        },
        "block8": {
            "spec_accept_length": [1.3913, 3.2, 3.5556, 2.0, 2.1333],
            "spec_accept_length_batched": [1.3913, 3.2, 3.5556, 2.0, 2.1333],
            "spec_num_correct_drafts": [13, 21, 22, 21, 16],
            "spec_verify_ct": [23, 10, 9, 16, 15],
            "equals_no_spec": True,  # single and batched
            "equals_offline_prediction": True,
        },
    },
    "random": {
        "models_sha256": "61760601e14172186c37df2de2454ac00281a74680139ddb381073904d25e8d5",
        "no_spec_equals_hf_greedy": True,
        "no_spec_single_equals_batched": True,
        "block4": {
            "spec_accept_length": [1.0323, 1.0667, 1.1034, 1.0323, 1.0323],
            "spec_accept_length_batched": [1.0323, 1.0667, 1.1034, 1.0323, 1.0323],
            "spec_num_correct_drafts": [0, 1, 2, 0, 0],
            "spec_verify_ct": [31, 30, 29, 31, 31],
            "equals_no_spec": True,  # single and batched
            "equals_offline_prediction": True,
        },
        "block8": {
            "spec_accept_length": [1.0323, 1.0323, 1.0323, 1.0323, 1.0323],
            "spec_accept_length_batched": [1.0323, 1.0323, 1.0323, 1.0323, 1.0323],
            "spec_num_correct_drafts": [0, 0, 0, 0, 0],
            "spec_verify_ct": [31, 31, 31, 31, 31],
            "equals_no_spec": True,  # single and batched
            "equals_offline_prediction": True,
        },
    },
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--fixture", choices=(*FIXTURES, "all"), default="all")
    a = ap.parse_args(argv)
    t0 = time.time()
    dirs = build_fixtures(a.out, FIXTURES if a.fixture == "all" else (a.fixture,))
    for name, d in dirs.items():
        off = json.loads((d / "fixture.json").read_text())["offline"]
        print(name, d, {k: v["accept_length_mean"] for k, v in off.items() if isinstance(v, dict)})
    print(f"built in {time.time() - t0:.1f} s")
    return 0


# ----------------------------------------------------------------------------- io


def _write_json(path: Path, obj: object) -> None:
    path.write_text(json.dumps(obj, indent=1, sort_keys=True) + "\n")


def _save(state: dict[str, torch.Tensor], d: Path) -> None:
    path = d / "model.safetensors"
    save_file({k: v.detach().to(torch.float32).contiguous() for k, v in state.items()},
              str(path), metadata={"format": "pt"})
    os.chmod(path, 0o644)   # safetensors writes 0600; the tests' SSH user loads the models too


def sha256_dir(d: Path, skip: tuple[str, ...] = ()) -> str:
    """sha256 over the relative paths and bytes of every file under d (sorted), but files named in skip."""
    h = hashlib.sha256()
    for p in sorted(d.rglob("*")):
        if p.is_file() and p.name not in skip:
            h.update(str(p.relative_to(d)).encode() + b"\0" + p.read_bytes())
    return h.hexdigest()


if __name__ == "__main__":
    sys.exit(main())
