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


def test_a_model_directory_names_its_class_and_records_its_base_model(tiny, tmp_path):
    import json

    from transformers import AutoConfig, AutoModelForCausalLM, LlamaForCausalLM

    from lit_ppo.config.model import MODEL_RECORD
    from lit_ppo.models import write_model_dir

    trained, tokenizer = tiny
    config = trained.config.to_dict()
    config["architectures"] = None
    model = LlamaForCausalLM(type(trained.config).from_dict(config))  # as the tiny model is built: from its config
    first = write_model_dir(model, tokenizer, tmp_path / "first", source="tiny")
    # The class vLLM and the Auto classes load: without it vLLM resolves the bare LlamaModel.
    assert json.loads((first / "config.json").read_text())["architectures"] == ["LlamaForCausalLM"]
    assert AutoConfig.from_pretrained(first).architectures == ["LlamaForCausalLM"]
    loaded = AutoModelForCausalLM.from_pretrained(first)
    assert type(loaded).__name__ == "LlamaForCausalLM"
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), loaded.state_dict().values()))
    assert model.config.architectures is None  # the trained model's own config is left as it was
    assert json.loads((first / MODEL_RECORD).read_text()) == {"base_model": "tiny"}
    # A run from that directory records the model it came from, through any chain of runs.
    second = write_model_dir(model, tokenizer, tmp_path / "second", source=str(first))
    assert json.loads((second / MODEL_RECORD).read_text()) == {"base_model": "tiny"}
    # A directory lit_ppo did not write is its own base model; and without a source, nothing is recorded.
    plain = tmp_path / "plain"
    write_hf_files(model, tokenizer, plain)
    third = write_model_dir(model, tokenizer, tmp_path / "third", source=str(plain))
    assert json.loads((third / MODEL_RECORD).read_text()) == {"base_model": str(plain)}
    assert not (write_model_dir(model, tokenizer, tmp_path / "fourth") / MODEL_RECORD).exists()
