"""Layer 2, the models: the policy, the critic and the reference as transformers models, their sources
(tiny, SmolLM2, a local directory), log-probs under the sampling distribution, LoRA adapters and
packed forward passes. Pure torch / transformers / peft, no Lightning."""

from lit_ppo.models.cache import cache_entry, default_cache_dir
from lit_ppo.models.chat import PLAIN_CHAT_TEMPLATE, use_chat_template
from lit_ppo.models.critic import ValueModel, build_critic
from lit_ppo.models.hf_dir import write_hf_files, write_model_dir
from lit_ppo.models.local_model import (
    cached_hub_model,
    hub_cache_dir,
    looks_like_hub_id,
    model_dir_problem,
    model_source_dir,
    weights_problem,
)
from lit_ppo.models.logprobs import token_logprobs
from lit_ppo.models.policy import load_policy, load_policy_tokenizer
from lit_ppo.models.policy_copies import build_reference, model_from_weights
from lit_ppo.models.sources import MODEL_SOURCES, base_model_paths, load_causal_lm, source_cache_entry, torch_dtype
from lit_ppo.models.teacher import load_teacher, teacher_problem
from lit_ppo.models.tiny import (
    CHARACTERS,
    SPECIAL_TOKENS,
    TINY_CHAT_TEMPLATE,
    TinyModelConfig,
    build_tiny,
    build_tiny_tokenizer,
)

__all__ = ["CHARACTERS", "MODEL_SOURCES", "PLAIN_CHAT_TEMPLATE", "SPECIAL_TOKENS", "TINY_CHAT_TEMPLATE",
           "TinyModelConfig", "ValueModel", "base_model_paths", "build_critic", "build_reference", "build_tiny",
           "build_tiny_tokenizer", "cache_entry", "cached_hub_model", "default_cache_dir", "hub_cache_dir",
           "load_causal_lm", "load_policy", "load_policy_tokenizer", "load_teacher", "looks_like_hub_id",
           "model_dir_problem", "model_from_weights", "model_source_dir", "source_cache_entry", "teacher_problem",
           "token_logprobs", "torch_dtype", "use_chat_template", "weights_problem", "write_hf_files", "write_model_dir"]
