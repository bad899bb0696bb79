"""Helpers shared by the task tests: the GSM8K sample file and a character-level tokenizer."""

from __future__ import annotations

from pathlib import Path

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
GSM8K_SAMPLE = FIXTURES / "gsm8k_sample.jsonl"


def char_tokenizer(chars: str = "0123456789+-*= "):
    """A character-level tokenizer like the tiny model's: one token per char, EOS '<|end|>'."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(["<unk>", "<|end|>", *chars])}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    return PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<|end|>", unk_token="<unk>")
