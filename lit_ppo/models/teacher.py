"""A teacher for on-policy distillation: a causal LM that shares the policy's tokenizer, frozen, scoring the
policy's own samples where the reference model does (docs/algorithms.md#opd)."""

from __future__ import annotations

from pathlib import Path

import torch

from lit_ppo.models.local_model import model_dir_problem, model_source_dir
from lit_ppo.models.sources import MODEL_SOURCES, load_causal_lm, source_cache_entry
from lit_ppo.models.tiny import build_tiny_tokenizer


def vocabulary_problem(policy_tokenizer, teacher_tokenizer) -> str | None:
    """Why the teacher's tokenizer cannot score the policy's token ids (another vocabulary), or None."""
    ours, theirs = policy_tokenizer.get_vocab(), teacher_tokenizer.get_vocab()
    if ours == theirs:
        return None
    differing = sorted(set(ours.items()) ^ set(theirs.items()), key=lambda item: item[1])
    token, index = differing[0]
    side = "the policy's" if ours.get(token) == index else "the teacher's"
    return (f"has another tokenizer than the policy ({len(ours)} against {len(theirs)} entries; {side} maps "
            f"{token!r} to {index}): the teacher scores the policy's token ids, so it must share its vocabulary")


def _policy_tokenizer(source: str, cache_dir: str | Path | None):
    """The tokenizer of the model source ``source`` if it can be read without loading a model, else None (a
    named source not converted yet)."""
    from transformers import AutoTokenizer

    if source == "tiny":
        return build_tiny_tokenizer()
    path = source_cache_entry(source, cache_dir) if source in MODEL_SOURCES else model_source_dir(source)
    return AutoTokenizer.from_pretrained(path, local_files_only=True) if path.is_dir() else None


def teacher_problem(teacher: str, policy_source: str, cache_dir: str | Path | None = None) -> str | None:
    """Why ``teacher`` cannot teach the policy of ``policy_source``: not a causal LM directory, or another
    vocabulary. Reads config.json, the weights' headers and the tokenizers, no model."""
    problem = model_dir_problem(teacher)
    if problem is not None:
        return problem
    ours = _policy_tokenizer(policy_source, cache_dir)
    if ours is None:
        return None  # checked when the policy loads (load_teacher)
    from transformers import AutoTokenizer

    return vocabulary_problem(ours, AutoTokenizer.from_pretrained(model_source_dir(teacher), local_files_only=True))


def load_teacher(teacher: str, policy_tokenizer, dtype: torch.dtype, cache_dir: str | Path | None = None):
    """The teacher, frozen (eval mode, no parameter requires grad); ValueError in one line for another vocabulary."""
    model, tokenizer = load_causal_lm(teacher, cache_dir, dtype)
    problem = vocabulary_problem(policy_tokenizer, tokenizer)
    if problem is not None:
        raise ValueError(f"model.teacher={teacher} {problem}")
    model.eval().requires_grad_(False)
    return model
