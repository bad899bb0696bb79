"""The tiny model and tokenizer (``lit_ppo.models.tiny``): the chat template, the special ids and the
round trip of text, a deterministic build that keeps the caller's RNG, and its cache entry reused."""

from __future__ import annotations

import pytest
import torch

import lit_ppo.models.tiny as tiny_source
from lit_ppo.models import TinyModelConfig, build_tiny
from tests.unit.values import same_weights as _same_weights


def test_chat_template_exact(tiny):
    _, tok = tiny
    assert tok.apply_chat_template([{"role": "user", "content": "3+4="}], add_generation_prompt=True,
                                   tokenize=False) == "<|user|>3+4=<|assistant|>"
    conversation = [{"role": "system", "content": "Add."}, {"role": "user", "content": "1+1="},
                    {"role": "assistant", "content": "2"}, {"role": "user", "content": "2+2="}]
    assert (tok.apply_chat_template(conversation, tokenize=False)
            == "<|system|>Add.<|user|>1+1=<|assistant|>2<|end|><|user|>2+2=")
    ids = tok.apply_chat_template([{"role": "user", "content": "3+4="}], add_generation_prompt=True)
    ids = ids["input_ids"] if not isinstance(ids, list) else ids
    assert ids == [2, tok.convert_tokens_to_ids("3"), tok.convert_tokens_to_ids("+"),
                   tok.convert_tokens_to_ids("4"), tok.convert_tokens_to_ids("="), 3]
    with pytest.raises(Exception, match="unknown chat role"):
        tok.apply_chat_template([{"role": "tool", "content": "x"}], tokenize=False)


def test_tokenizer_special_ids_and_round_trip(tiny):
    model, tok = tiny
    assert (tok.pad_token, tok.pad_token_id, tok.eos_token, tok.eos_token_id) == ("<|pad|>", 0, "<|end|>", 1)
    roles = ("<|user|>", "<|assistant|>", "<|system|>", "<|unk|>")
    assert [tok.convert_tokens_to_ids(t) for t in roles] == [2, 3, 4, 5]
    assert len(tok) == model.config.vocab_size == 6 + 22 + 52
    assert model.config.pad_token_id == 0 and model.generation_config.eos_token_id == 1

    text = "What is (12 + 3) * 4 / 2 - 1? Answer: 29.5, ok = yes"
    ids = tok(text)["input_ids"]
    assert len(ids) == len(text)  # one token per character, no BOS
    assert tok.convert_ids_to_tokens(ids) == list(text)
    assert tok.decode(ids) == text
    marked = tok("<|user|>Hi<|end|>")["input_ids"]
    assert marked == [2, tok.convert_tokens_to_ids("H"), tok.convert_tokens_to_ids("i"), 1]
    assert tok.decode(marked, skip_special_tokens=True) == "Hi"
    assert tok("a\u20acb")["input_ids"] == [tok.convert_tokens_to_ids("a"), 5, tok.convert_tokens_to_ids("b")]


def test_tiny_build_is_deterministic_and_keeps_rng(tmp_path):
    torch.manual_seed(123)
    before = torch.rand(3)
    torch.manual_seed(123)
    first, _ = build_tiny(TinyModelConfig(), tmp_path / "a")
    after = torch.rand(3)
    assert torch.equal(before, after)  # building does not consume the caller's RNG
    second, _ = build_tiny(TinyModelConfig(), tmp_path / "b")
    assert _same_weights(first, second)
    other, _ = build_tiny(TinyModelConfig(seed=1), tmp_path / "a")
    assert not _same_weights(first, other)
    cfg = first.config
    assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.num_attention_heads, cfg.intermediate_size,
            cfg.max_position_embeddings, cfg.initializer_range) == (2, 64, 2, 128, 128, 0.1)
    # initializer_range is really used: weights have std ~0.1, not the default 0.02
    assert 0.08 < first.model.layers[0].mlp.up_proj.weight.std().item() < 0.12


def test_tiny_cache_is_reused(tmp_path, monkeypatch):
    cfg = TinyModelConfig(hidden_size=32, intermediate_size=64)
    model, _ = build_tiny(cfg, tmp_path)
    entry = tmp_path / cfg.cache_name()
    assert entry.name.startswith("tiny-") and (entry / "model.safetensors").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == [entry.name]  # no temporary directory left
    stamp = (entry / "model.safetensors").stat().st_mtime_ns

    def no_rebuild(_cfg):
        raise AssertionError("rebuilt although the cache entry exists")

    monkeypatch.setattr(tiny_source, "_build_tiny_fresh", no_rebuild)
    again, _ = build_tiny(cfg, tmp_path)
    assert _same_weights(model, again)
    assert (entry / "model.safetensors").stat().st_mtime_ns == stamp
    # a different config is a different entry
    assert TinyModelConfig(seed=1).cache_name() != TinyModelConfig().cache_name()
    with pytest.raises(AssertionError, match="rebuilt"):
        build_tiny(TinyModelConfig(seed=5), tmp_path)
