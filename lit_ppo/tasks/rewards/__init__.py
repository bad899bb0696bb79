"""Rewards of ``data=dataset``, in four forms given in ``reward_fns`` (TRL's ``reward_funcs``):

- a function, ``module.function``, called as TRL calls it (``lit_ppo.tasks.rewards.calls``), plain or
  ``async def``;
- a built-in, named without a module path: ``exact_match``, ``math_verify``, ``format``
  (``lit_ppo.tasks.rewards.builtins``);
- a reward model: a local ``AutoModelForSequenceClassification`` directory (or the hub id of one in the
  local Hugging Face cache), scored in batches with its own tokenizer and chat template, set up by
  ``data.task_kwargs.reward_model`` (``lit_ppo.tasks.rewards.model``);
- ``judge``: an LLM judge, a local model or an OpenAI-compatible endpoint, set up by
  ``data.task_kwargs.judge`` (``lit_ppo.tasks.rewards.judge``).

Each resolves to a ``RewardFunction``; a sample's reward is their weighted sum (``score_calls``).
"""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Any, Sequence

from lit_ppo.tasks.rewards.builtins import (
    BUILTINS,
    DEFAULT_FORMAT_PATTERN,
    NEEDS_ANSWER,
    exact_match,
    format_reward,
    math_verify,
)
from lit_ppo.tasks.rewards.calls import (
    CALL_KEYWORDS,
    DEFAULT_REWARD_CONCURRENCY,
    GroupScores,
    RewardCall,
    RewardFunction,
    TrainerState,
    _callable_name,
    _number,
    check_call_signatures,
    completion_text,
    metric_names,
    score_calls,
)
from lit_ppo.tasks.rewards.judge import JUDGE, LLMJudge
from lit_ppo.tasks.rewards.model import RewardModel, is_model_path
from lit_ppo.utils.imports import import_object
from lit_ppo.utils.text import did_you_mean

__all__ = ["BUILTINS", "CALL_KEYWORDS", "DEFAULT_FORMAT_PATTERN", "DEFAULT_REWARD_CONCURRENCY", "GroupScores",
           "JUDGE", "LLMJudge", "NEEDS_ANSWER", "RewardCall", "RewardFunction", "RewardModel", "TrainerState",
           "check_call_signatures", "completion_text", "exact_match", "format_reward", "math_verify",
           "resolve_reward_fns", "score_calls"]

FORMS = (f"built-in names ({', '.join(BUILTINS)}), {JUDGE}, dotted paths module.function or reward model "
         f"directories")


def resolve_reward_fns(names: Sequence[str], weights: Sequence[float] | None, format_pattern: str,
                       prefix: str = "data.task_kwargs.", reward_model: dict[str, Any] | None = None,
                       judge: dict[str, Any] | None = None) -> tuple[RewardFunction, ...]:
    """The functions of ``reward_fns`` with their ``reward_weights`` (None: all 1.0), reward models set up by
    the settings ``reward_model`` and the judge by ``judge``; ValueError naming the key for an empty or
    malformed list, a weight count that differs, a function that cannot be imported, a directory that is
    not a reward model, bad settings, or settings that no entry uses. Nothing loads here: a reward model
    loads at its first scoring."""
    if isinstance(names, str) or not isinstance(names, Sequence) or not names:
        raise ValueError(f"{prefix}reward_fns={names!r} is invalid: must be a non-empty list of {FORMS}")
    if weights is None:
        weights = [1.0] * len(names)
    if isinstance(weights, str) or not isinstance(weights, Sequence):
        raise ValueError(f"{prefix}reward_weights={weights!r} is invalid: must be a list of numbers or null")
    if len(weights) != len(names):
        raise ValueError(f"{prefix}reward_weights has {len(weights)} values but {prefix}reward_fns has "
                         f"{len(names)}: give one weight per function (or null for all 1.0)")
    try:
        re.compile(format_pattern)
    except (re.error, TypeError) as e:
        raise ValueError(f"{prefix}format_pattern={format_pattern!r} is invalid: not a regular expression "
                         f"({e})") from None
    resolved = []
    for i, (name, weight) in enumerate(zip(names, weights)):
        where = f"{prefix}reward_fns[{i}]"
        if isinstance(weight, bool) or _number(weight) is None:
            raise ValueError(f"{prefix}reward_weights[{i}]={weight!r} is invalid: must be a finite number")
        if isinstance(name, str) and name in BUILTINS:
            fn = BUILTINS[name]
            if name == "format":
                fn = functools.partial(fn, pattern=format_pattern)
            resolved.append((name, fn, float(weight), True, name in NEEDS_ANSWER, name))
        elif name == JUDGE:
            if judge is None:
                raise ValueError(f"{where}={JUDGE!r} needs {prefix}judge: the judge's settings (model, and "
                                 f"base_url for an OpenAI-compatible endpoint)")
            fn = LLMJudge.from_settings(judge, f"{prefix}judge")
            resolved.append((name, fn, float(weight), True, fn.needs_answer, JUDGE))
        elif isinstance(name, str) and is_model_path(name):
            fn = RewardModel.from_settings(name, reward_model, where, f"{prefix}reward_model")
            resolved.append((name, fn, float(weight), False, False, Path(name).name))
        elif not isinstance(name, str) or "." not in name:
            close = did_you_mean(name, [*BUILTINS, JUDGE]) if isinstance(name, str) else ""
            raise ValueError(f"{where}={name!r} is invalid{close}: must be a built-in ({', '.join(BUILTINS)}), "
                             f"{JUDGE}, a dotted path module.function or a reward model directory")
        else:
            fn = import_object(name, where, "function")
            if not callable(fn):
                raise ValueError(f"{where}={name!r} is not a function")
            resolved.append((name, fn, float(weight), False, False, _callable_name(fn)))
    if judge is not None and JUDGE not in names:
        raise ValueError(f"{prefix}judge is set but {prefix}reward_fns has no {JUDGE!r}: add it to the list, or "
                         f"remove {prefix}judge")
    if reward_model is not None and not any(isinstance(n, str) and is_model_path(n) for n in names):
        raise ValueError(f"{prefix}reward_model is set but no entry of {prefix}reward_fns is a reward model "
                         f"directory: add one, or remove {prefix}reward_model")
    metrics = metric_names([r[5] for r in resolved])
    return tuple(RewardFunction(*r[:5], metric) for r, metric in zip(resolved, metrics))
