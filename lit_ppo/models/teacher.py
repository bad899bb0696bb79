"""A teacher for on-policy distillation: a causal LM that shares the policy's tokenizer, frozen, scoring the
policy's own samples where the reference model does (docs/algorithms.md#opd)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from lit_ppo.config.model import NAMED_SOURCES
from lit_ppo.models.local_model import model_files_problem, model_source_dir

if TYPE_CHECKING:  # the check before a run reads tokenizer files only
    import torch


def vocabulary_problem(ours: dict[str, int], theirs: dict[str, int]) -> str | None:
    """Why the teacher's vocabulary ``theirs`` cannot score the policy's token ids (``ours``: token -> id), or None."""
    if ours == theirs:
        return None
    differing = sorted(set(ours.items()) ^ set(theirs.items()), key=lambda item: (item[1], item[0]))
    token, index = differing[0]
    side = "the policy's" if ours.get(token) == index else "the teacher's"
    return (f"has another tokenizer than the policy ({len(ours)} against {len(theirs)} entries; {side} maps "
            f"{token!r} to {index}): the teacher scores the policy's token ids, so it must share its vocabulary")


def _vocabulary(directory: Path) -> dict[str, int]:
    """The vocabulary, added tokens included, of the tokenizer in the model directory ``directory``: from its
    tokenizer.json by the tokenizers library where it has one (transformers' tokenizer classes take seconds to
    import), else as transformers loads it."""
    if (directory / "tokenizer.json").is_file():
        from tokenizers import Tokenizer

        return Tokenizer.from_file(str(directory / "tokenizer.json")).get_vocab(with_added_tokens=True)
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(directory, local_files_only=True).get_vocab()


def _policy_vocabulary(source: str, cache_dir: str | Path | None) -> dict[str, int] | None:
    """The vocabulary of the model source ``source`` if it can be read without loading a model, else None (a
    named source not converted yet)."""
    if source == "tiny":
        from lit_ppo.models.tiny import tiny_tokenizer_backend

        return tiny_tokenizer_backend().get_vocab(with_added_tokens=True)
    if source in NAMED_SOURCES:
        from lit_ppo.models.sources import source_cache_entry

        path = source_cache_entry(source, cache_dir)
    else:
        path = model_source_dir(source)
    return _vocabulary(path) if path.is_dir() else None


def teacher_tokenizer_problem(teacher: str, policy_source: str, cache_dir: str | Path | None = None) -> str | None:
    """Why ``teacher`` cannot teach the policy of ``policy_source`` as far as the files tell without torch: not a
    model directory, or another vocabulary (read from the tokenizers' files). ``model_dir_problem`` then
    checks that it is a causal LM."""
    problem = model_files_problem(teacher)
    if problem is not None:
        return problem
    ours = _policy_vocabulary(policy_source, cache_dir)  # None: checked when the policy loads (load_teacher)
    return None if ours is None else vocabulary_problem(ours, _vocabulary(model_source_dir(teacher)))


def load_teacher(teacher: str, policy_tokenizer, dtype: torch.dtype, cache_dir: str | Path | None = None):
    """The teacher, frozen (eval mode, no parameter requires grad); ValueError in one line for another vocabulary."""
    from lit_ppo.models.sources import load_causal_lm

    model, tokenizer = load_causal_lm(teacher, cache_dir, dtype)
    problem = vocabulary_problem(policy_tokenizer.get_vocab(), tokenizer.get_vocab())
    if problem is not None:
        raise ValueError(f"model.teacher={teacher} {problem}")
    model.eval().requires_grad_(False)
    return model
