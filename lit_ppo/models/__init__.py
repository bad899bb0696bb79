"""Layer 2, the models: the policy, the critic and the reference as transformers models, their sources
(tiny, SmolLM2, a local directory), log-probs under the sampling distribution, LoRA adapters and
packed forward passes. Pure torch / transformers / peft, no Lightning."""

from lit_ppo.models.hf_dir import write_hf_files, write_model_dir
from lit_ppo.models.loading import (CHARACTERS, MODEL_SOURCES, PLAIN_CHAT_TEMPLATE, SPECIAL_TOKENS, TINY_CHAT_TEMPLATE,
                                    TinyModelConfig, ValueModel, base_model_paths, build_critic, build_reference,
                                    build_tiny, build_tiny_tokenizer, cache_entry, cached_hub_model, default_cache_dir,
                                    hub_cache_dir, load_causal_lm, looks_like_hub_id, model_dir_problem,
                                    model_from_weights, model_source_dir, source_cache_entry, token_logprobs,
                                    torch_dtype, use_chat_template, weights_problem)

__all__ = ["CHARACTERS", "MODEL_SOURCES", "PLAIN_CHAT_TEMPLATE", "SPECIAL_TOKENS", "TINY_CHAT_TEMPLATE", "TinyModelConfig",
           "ValueModel", "base_model_paths", "build_critic", "build_reference", "build_tiny", "build_tiny_tokenizer", "cache_entry",
           "cached_hub_model", "default_cache_dir", "hub_cache_dir", "load_causal_lm", "looks_like_hub_id",
           "model_dir_problem", "model_from_weights", "model_source_dir", "source_cache_entry", "token_logprobs",
           "torch_dtype", "use_chat_template", "weights_problem", "write_hf_files", "write_model_dir"]
