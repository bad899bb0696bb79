"""The ``"tiny"`` model source: a 2-layer Llama and a character-level tokenizer built locally from a
seeded config, cached as ``tiny-<hash>`` (``lit_ppo.models.cache``)."""

from __future__ import annotations

import hashlib
import json
import string
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from lit_ppo.models.cache import _cached
from lit_ppo.models.local_model import _load_dir

if TYPE_CHECKING:  # torch is imported where the model is built: the checks read its tokenizer alone
    import torch

PAD, END, USER, ASSISTANT, SYSTEM, UNK = "<|pad|>", "<|end|>", "<|user|>", "<|assistant|>", "<|system|>", "<|unk|>"
SPECIAL_TOKENS = (PAD, END, USER, ASSISTANT, SYSTEM, UNK)
"""Special tokens of the tiny tokenizer, ids 0-5 in this order; ``<|end|>`` is EOS."""
CHARACTERS = tuple("0123456789+-*/=().,?: " + string.ascii_lowercase + string.ascii_uppercase)
"""Ordinary tokens of the tiny tokenizer, one per character; any other character maps to ``<|unk|>``."""

# One role token per message, no whitespace; an assistant turn ends with EOS, which is what the
# policy learns to emit to stop.
TINY_CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- if message['role'] not in ['system', 'user', 'assistant'] -%}"
    "{{ raise_exception('unknown chat role: ' + message['role']) }}"
    "{%- endif -%}"
    "<|{{ message['role'] }}|>{{ message['content'] }}"
    "{%- if message['role'] == 'assistant' -%}<|end|>{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|assistant|>{%- endif -%}"
)
_TINY_FORMAT = 2  # bump when the build recipe changes, so old cache entries are not reused


@dataclass
class TinyModelConfig:
    """A tiny Llama for CPU runs and tests; its tokenizer is character-level (``build_tiny_tokenizer``)."""

    num_layers: int = 2
    """Decoder layers."""
    hidden_size: int = 64
    """Width of the residual stream."""
    num_heads: int = 2
    """Attention heads (no grouped-query attention); must divide ``hidden_size``. Two heads give a
    head size of 32, the smallest the vLLM CPU attention kernels support."""
    intermediate_size: int = 128
    """Width of the SwiGLU MLP."""
    initializer_range: float = 0.1
    """Std of the normal weight init. The usual 0.02 gives near-uniform next-token distributions
    that RL barely moves (measured: learning stalls); 0.1 starts with usable diversity."""
    seed: int = 0
    """Seed of the weight init: same config and seed, bitwise identical weights."""
    max_position_embeddings: int = 128
    """Longest sequence (prompt + completion) in tokens."""

    def __post_init__(self):
        for name in ("num_layers", "hidden_size", "num_heads", "intermediate_size", "max_position_embeddings"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)!r} is invalid: must be a positive int")
        if self.hidden_size % self.num_heads:
            raise ValueError(f"num_heads={self.num_heads} is invalid: must divide hidden_size={self.hidden_size}")
        if not self.initializer_range > 0:
            raise ValueError(f"initializer_range={self.initializer_range!r} is invalid: must be > 0")

    def cache_name(self) -> str:
        """Cache entry name: ``tiny-<hash>`` of the config and the tokenizer recipe."""
        recipe = {"config": asdict(self), "special": SPECIAL_TOKENS, "chars": CHARACTERS,
                  "template": TINY_CHAT_TEMPLATE, "format": _TINY_FORMAT}
        return "tiny-" + hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:16]


def tiny_tokenizer_backend():
    """The character-level ``tokenizers.Tokenizer`` under the tiny model's tokenizer: what reading its
    vocabulary needs, without transformers."""
    from tokenizers import Tokenizer, decoders, models

    vocab = {token: i for i, token in enumerate(SPECIAL_TOKENS + CHARACTERS)}
    # BPE without merges and without a pre-tokenizer = one token per character, unknowns -> <|unk|>.
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=UNK))
    backend.add_special_tokens(list(SPECIAL_TOKENS))  # matched whole, before the character split
    backend.decoder = decoders.Fuse()  # join characters without the default space separator
    return backend


def build_tiny_tokenizer(model_max_length: int = 128):
    """The character-level ``PreTrainedTokenizerFast`` of the tiny model (no download)."""
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(
        tokenizer_object=tiny_tokenizer_backend(), pad_token=PAD, eos_token=END, unk_token=UNK,
        additional_special_tokens=[USER, ASSISTANT, SYSTEM], chat_template=TINY_CHAT_TEMPLATE,
        model_max_length=model_max_length,
    )


def _build_tiny_fresh(cfg: TinyModelConfig):
    """A freshly initialised tiny LlamaForCausalLM and its tokenizer (not cached)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = build_tiny_tokenizer(cfg.max_position_embeddings)
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers, num_attention_heads=cfg.num_heads, num_key_value_heads=cfg.num_heads,
        max_position_embeddings=cfg.max_position_embeddings, initializer_range=cfg.initializer_range,
        pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id, bos_token_id=None,
        tie_word_embeddings=False,
    )
    with torch.random.fork_rng(devices=[]):  # seed the init without disturbing the caller's RNG
        torch.manual_seed(cfg.seed)
        model = LlamaForCausalLM(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.bos_token_id = None
    return model, tokenizer


def build_tiny(cfg: TinyModelConfig | None = None, cache_dir: str | Path | None = None,
               dtype: torch.dtype | None = None):
    """``(model, tokenizer)`` of the tiny config in ``dtype`` (None: float32): built and saved to
    ``cache_dir/tiny-<hash>`` on first use, loaded from there afterwards (so every call returns the same
    weights)."""
    import torch

    return _load_dir(tiny_dir(cfg or TinyModelConfig(), cache_dir), dtype or torch.float32)


def tiny_dir(cfg: TinyModelConfig, cache_dir: str | Path | None = None) -> Path:
    """The cache entry ``cache_dir/tiny-<hash>`` of the tiny config, built and saved on first use."""

    def write(tmp: Path) -> None:
        from lit_ppo.models.hf_dir import write_hf_files

        write_hf_files(*_build_tiny_fresh(cfg), tmp)

    return _cached(cache_dir, cfg.cache_name(), write)
