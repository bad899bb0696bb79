"""Hugging Face model directories (``lit_ppo.models.hf_dir``): tied weights are written once and load back tied."""

from __future__ import annotations

import torch

from lit_ppo.models import TinyModelConfig, build_tiny, load_causal_lm, write_hf_files


def test_save_checkpoint_stores_tied_weights_once(tmp_path):
    from safetensors import safe_open
    from transformers import LlamaConfig, LlamaForCausalLM

    _, tok = build_tiny(TinyModelConfig(), tmp_path / "cache")
    torch.manual_seed(0)
    tied = LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                        num_attention_heads=1, num_key_value_heads=1, tie_word_embeddings=True))
    write_hf_files(tied, tok, tmp_path / "tied")
    with safe_open(tmp_path / "tied" / "model.safetensors", "pt") as f:
        assert "model.embed_tokens.weight" in f.keys() and "lm_head.weight" not in f.keys()
    loaded, loaded_tok = load_causal_lm(str(tmp_path / "tied"))
    assert loaded.lm_head.weight is loaded.model.embed_tokens.weight
    assert all(torch.equal(a, b) for a, b in zip(tied.state_dict().values(), loaded.state_dict().values()))
    assert loaded_tok.chat_template == tok.chat_template
