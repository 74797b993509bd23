"""tests/live/tiny_models.py builds loadable, deterministic fixtures.

The random fixture is built twice (a few seconds each) and must be byte-identical; the trained
one (about half a minute) is built once and checked for the regime it is meant to be.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("transformers")
pytest.importorskip("tokenizers")
pytest.importorskip("safetensors")

from safetensors import safe_open  # noqa: E402

from tests.live import tiny_models as tm  # noqa: E402

FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "generation_config.json")


def _check_layout(d: Path) -> dict:
    info = json.loads((d / "fixture.json").read_text())
    assert info["block_sizes"] == [4, 8]
    assert len(info["prompts"]) == 5 and all(isinstance(p, str) and p for p in info["prompts"])
    vocab = info["tokenizer"]["config_vocab_size"]
    target_cfg = json.loads((d / "target" / "config.json").read_text())
    assert target_cfg["architectures"] == ["Qwen3ForCausalLM"] and target_cfg["vocab_size"] == vocab
    layers = target_cfg["num_hidden_layers"]
    for sub in ["target"] + [f"draft-b{b}" for b in info["block_sizes"]]:
        for f in FILES:
            assert (d / sub / f).is_file(), f"{sub}/{f}"
        with safe_open(str(d / sub / "model.safetensors"), "pt") as st:
            keys = set(st.keys())
            assert all(str(st.get_tensor(k).dtype) == "torch.float32" for k in keys)
        if sub == "target":
            assert {"model.embed_tokens.weight", "lm_head.weight", "model.norm.weight"} <= keys
            continue
        cfg = json.loads((d / sub / "config.json").read_text())
        dflash = cfg["dflash_config"]
        assert cfg["architectures"] == ["DFlashDraftModel"]
        assert cfg["block_size"] == dflash["block_size"] == int(sub.removeprefix("draft-b"))
        assert cfg["num_target_layers"] == layers
        assert all(0 <= i < layers - 1 for i in dflash["target_layer_ids"])  # SGLang captures layer id+1's input
        assert dflash["mask_token_id"] == info["tokenizer"]["mask_token_id"]
        tok = json.loads((d / sub / "tokenizer.json").read_text())
        assert tok["model"]["vocab"][dflash["mask_token"]] == dflash["mask_token_id"]
        assert {"fc.weight", "hidden_norm.weight", "norm.weight", "layers.0.self_attn.q_proj.weight"} <= keys
        assert not any("embed" in k or "lm_head" in k for k in keys)  # the target's are borrowed
    assert info["measured"]["block4"]["spec_accept_length"]  # figures from a real SGLang run ride along
    assert isinstance(info["measured"]["for_these_models"], bool)
    for p in info["prompt_details"]:
        assert len(p["greedy_ids"]) == info["max_new_tokens"]
        assert max(p["greedy_ids"]) < info["tokenizer"]["vocab"]  # never a padding id
        assert p["min_logit_margin"] >= tm.MIN_MARGIN
    return info


def test_random_fixture_is_deterministic_and_useless_to_draft(tmp_path: Path) -> None:
    a = tm.build_fixtures(tmp_path / "a", ["random"])["random"]
    b = tm.build_fixtures(tmp_path / "b", ["random"])["random"]
    assert tm.sha256_dir(a) == tm.sha256_dir(b)
    info = _check_layout(a)
    for block in info["block_sizes"]:
        assert info["offline"][f"block{block}"]["accept_length_mean"] < 1.2
    assert info["offline"]["window4_changed"] > 0.5  # most tokens need attention beyond the last 4


@pytest.mark.slow
def test_trained_fixture_drafts_often_but_not_always(tmp_path: Path) -> None:
    d = tm.build_fixtures(tmp_path, ["trained"])["trained"]
    info = _check_layout(d)
    b4 = info["offline"]["block4"]
    assert 1.8 <= b4["accept_length_mean"] <= 3.2
    assert all(n > 0 for n in b4["accept_histogram"])  # 0..3 accepted drafts all occur
    for top1, top2, top3 in b4["topk_hit_by_depth"]:
        assert 0.5 < top1 < top2 <= top3 < 1.0  # top-2 catches some of top-1's misses
