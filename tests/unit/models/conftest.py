"""Fixtures shared by the model tests: the tiny model and tokenizer, and a right-padded batch of its tokens."""

from __future__ import annotations

import pytest

from lit_ppo.models import TinyModelConfig, build_tiny


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return build_tiny(TinyModelConfig(), tmp_path_factory.mktemp("cache"))


@pytest.fixture(scope="module")
def batch(tiny):
    """Right-padded rows of different lengths; row 2 is a single token (no label at all)."""
    _, tok = tiny
    texts = ["<|user|>3+4=<|assistant|>7<|end|>", "<|user|>12*3=<|assistant|>36", "A"]
    enc = tok(texts, padding=True, padding_side="right", return_tensors="pt")
    return enc["input_ids"], enc["attention_mask"].bool()
