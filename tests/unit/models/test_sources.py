"""Model sources (``lit_ppo.models.sources``): ``load_causal_lm`` of the tiny model into ``$LIT_PPO_CACHE``, of a
local directory in another dtype, and of an unknown name."""

from __future__ import annotations

import pytest
import torch

from lit_ppo.models import TinyModelConfig, load_causal_lm


def test_load_causal_lm_sources(tmp_path, monkeypatch):
    monkeypatch.setenv("LIT_PPO_CACHE", str(tmp_path / "env-cache"))
    model, tok = load_causal_lm("tiny")
    assert (tmp_path / "env-cache" / TinyModelConfig().cache_name()).is_dir()
    assert model.dtype == torch.float32 and tok.eos_token == "<|end|>"
    # a local directory of any HF causal LM
    model.save_pretrained(tmp_path / "local")
    tok.save_pretrained(tmp_path / "local")
    local, local_tok = load_causal_lm(str(tmp_path / "local"), dtype=torch.bfloat16)
    assert local.dtype == torch.bfloat16 and local_tok.chat_template == tok.chat_template
    assert torch.equal(local.lm_head.weight, model.lm_head.weight.bfloat16())
    with pytest.raises(ValueError, match="'tiny', 'smollm2'"):
        load_causal_lm("gpt-17")
