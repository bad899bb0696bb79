"""Layer 2, the models: the policy, the critic and the reference as transformers models, their sources
(tiny, SmolLM2, a local directory), log-probs under the sampling distribution, LoRA adapters and
packed forward passes. Pure torch / transformers / peft, no Lightning.

Each name below loads its module on first use (PEP 562), so that a check reading one model file imports
what that needs and not transformers' model code (seconds on a CPU)."""

import importlib

_HOMES = {
    "cache": ("cache_entry", "default_cache_dir"),
    "chat": ("PLAIN_CHAT_TEMPLATE", "use_chat_template"),
    "critic": ("ValueModel", "build_critic"),
    "hf_dir": ("write_hf_files", "write_model_dir"),
    "local_model": ("cached_hub_model", "hub_cache_dir", "looks_like_hub_id", "model_dir_problem",
                    "model_source_dir", "weights_problem"),
    "logprobs": ("token_logprobs",),
    "policy": ("load_policy", "load_policy_tokenizer"),
    "policy_copies": ("build_reference", "model_from_weights"),
    "sources": ("MODEL_SOURCES", "base_model_paths", "load_causal_lm", "source_cache_entry", "torch_dtype"),
    "teacher": ("load_teacher", "teacher_tokenizer_problem"),
    "tiny": ("CHARACTERS", "SPECIAL_TOKENS", "TINY_CHAT_TEMPLATE", "TinyModelConfig", "build_tiny",
             "build_tiny_tokenizer"),
}
"""Module of lit_ppo.models -> the names it gives the package."""
_MODULE_OF = {name: module for module, names in _HOMES.items() for name in names}

__all__ = sorted(_MODULE_OF)


def __getattr__(name: str):
    if name not in _MODULE_OF:
        raise AttributeError(f"module 'lit_ppo.models' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"lit_ppo.models.{_MODULE_OF[name]}"), name)
    globals()[name] = value  # looked up once
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
