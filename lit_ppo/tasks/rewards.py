"""Reward functions with TRL's signature, the built-in ones, and their weighted sum.

A reward function is called as ``fn(prompts, completions, **columns) -> list[float | None]``, as in
TRL: ``prompts`` and ``completions`` are lists (strings, or lists of chat messages for a prompt
given as messages, the completion then being ``[{'role': 'assistant', 'content': text}]``), and
every other column of the dataset arrives as a keyword argument holding a list of the same length,
so reward functions written for TRL work unchanged (they should accept ``**kwargs``). A value of
None means "not applicable to this sample". The sample's reward is ``sum_i w_i * r_i`` over the
functions that returned a number; if every function returned None, the reward is None, which the
workflow treats as an invalid reward (``data.on_invalid_reward``: stop the run, or drop the group).

Built-ins, named without a module path: ``exact_match`` (the completion, stripped, equals the gold
answer), ``math_verify`` (math-verify judges them equivalent, as in the gsm8k task) and ``format``
(the completion matches a regular expression, ``format_pattern``). The built-ins get the gold answer
(the ``answer_key`` column) as ``answer``.
"""

from __future__ import annotations

import functools
import re
import threading
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from lit_ppo.errors import RunStopped
from lit_ppo.tasks.base import reward_float, reward_problem
from lit_ppo.tasks.gsm8k import math_equal
from lit_ppo.utils.imports import import_object

DEFAULT_FORMAT_PATTERN = r"\\boxed\{.+\}"
"""The ``format`` reward's default: a \\boxed{...} answer somewhere in the completion."""


def _number(value: Any) -> float | None:
    """``value`` as a float if it is a usable reward (``reward_problem``), else None."""
    return None if reward_problem(value) is not None else reward_float(value)


def completion_text(completion: Any) -> str:
    """The text of a completion: a string as is, a list of messages as its last message's content."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, (list, tuple)) and completion and isinstance(completion[-1], dict):
        return str(completion[-1].get("content", ""))
    return str(completion)


def exact_match(prompts: list, completions: list, answer: list, **kwargs) -> list[float]:
    """1.0 where the completion, stripped of surrounding whitespace, equals the answer, else 0.0."""
    return [float(completion_text(c).strip() == str(a).strip()) for c, a in zip(completions, answer, strict=True)]


MATH_VERIFY_TIMEOUT_S = 5.0
"""Seconds one ``math_verify`` check may take before it counts as 0.0 (sympy can stall on adversarial text)."""


def _bounded_math_equal(gold: str, text: str) -> bool:
    """``math_equal`` within ``MATH_VERIFY_TIMEOUT_S``; a stalled check runs on in a daemon thread."""
    result: list[bool] = []
    worker = threading.Thread(target=lambda: result.append(math_equal(gold, text)), daemon=True,
                              name="math-verify-reward")
    worker.start()
    worker.join(MATH_VERIFY_TIMEOUT_S)
    return bool(result and result[0])


def math_verify(prompts: list, completions: list, answer: list, **kwargs) -> list[float]:
    """1.0 where math-verify judges the completion equivalent to the answer, else 0.0 (also on any
    error or after ``MATH_VERIFY_TIMEOUT_S``)."""
    return [float(_bounded_math_equal(str(a), completion_text(c))) for c, a in zip(completions, answer, strict=True)]


def format_reward(prompts: list, completions: list, pattern: str = DEFAULT_FORMAT_PATTERN, **kwargs) -> list[float]:
    """1.0 where the regular expression ``pattern`` matches somewhere in the completion, else 0.0."""
    compiled = re.compile(pattern, re.DOTALL)
    return [float(compiled.search(completion_text(c)) is not None) for c in completions]


BUILTINS: dict[str, Callable] = {"exact_match": exact_match, "math_verify": math_verify, "format": format_reward}
"""Built-in reward name -> function; these receive the gold answer as ``answer``."""


@dataclass(frozen=True)
class RewardFunction:
    """One configured reward function."""

    name: str
    """As configured: a built-in name or a dotted path."""
    fn: Callable
    """The function, TRL's signature."""
    weight: float
    """Its weight in the sum."""
    builtin: bool
    """A built-in: it gets the gold answer as ``answer``."""


def resolve_reward_fns(names: Sequence[str], weights: Sequence[float] | None, format_pattern: str,
                       prefix: str = "data.task_kwargs.") -> tuple[RewardFunction, ...]:
    """The functions of ``reward_fns`` with their ``reward_weights`` (None: all 1.0); ValueError naming
    the key for an empty or malformed list, a weight count that differs, or a function that cannot be
    imported."""
    if isinstance(names, str) or not isinstance(names, Sequence) or not names:
        raise ValueError(f"{prefix}reward_fns={names!r} is invalid: must be a non-empty list of built-in names "
                         f"({', '.join(BUILTINS)}) or dotted paths module.function")
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
        if isinstance(weight, bool) or _number(weight) is None:
            raise ValueError(f"{prefix}reward_weights[{i}]={weight!r} is invalid: must be a finite number")
        if isinstance(name, str) and name in BUILTINS:
            fn = BUILTINS[name]
            if name == "format":
                fn = functools.partial(fn, pattern=format_pattern)
            resolved.append(RewardFunction(name, fn, float(weight), True))
            continue
        if not isinstance(name, str) or "." not in name:
            raise ValueError(f"{prefix}reward_fns[{i}]={name!r} is invalid: must be a built-in "
                             f"({', '.join(BUILTINS)}) or a dotted path module.function")
        fn = import_object(name, f"{prefix}reward_fns[{i}]", "function")
        if not callable(fn):
            raise ValueError(f"{prefix}reward_fns[{i}]={name!r} is not a function")
        resolved.append(RewardFunction(name, fn, float(weight), False))
    return tuple(resolved)


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def combined_rewards(fns: Sequence[RewardFunction], prompts: list, completions: list, columns: dict[str, list],
                     answers: list[str]) -> list[Any]:
    """The weighted sum per sample of every function's reward (None where every function returned None;
    a returned value that is not a finite real number is passed on as is, for the workflow's check).

    RunStopped in one line naming the function (and the first sample) if it raises, or returns
    something other than a list with one value per sample."""
    n = len(completions)
    totals: list[Any] = [None] * n
    for f in fns:
        kwargs = dict(columns)
        if f.builtin:
            kwargs["answer"] = answers
        try:
            values = f.fn(prompts, completions, **kwargs)
        except Exception as e:
            reason = f"{type(e).__name__}: {str(e).splitlines()[0]}" if str(e) else type(e).__name__
            which = "completion" if n == 1 else f"first of {n} completions"
            raise RunStopped(f"reward function {f.name!r} raised {reason} for prompt {_short(prompts[0])} "
                             f"({which} {_short(completions[0], 40)})") from e
        if isinstance(values, (str, bytes)) or not hasattr(values, "__len__") or len(values) != n:
            got = f"{len(values)} values" if hasattr(values, "__len__") and not isinstance(values, (str, bytes)) \
                else _short(values, 40)
            raise RunStopped(f"reward function {f.name!r} returned {got} for {n} completions: it must return a "
                             f"list with one float (or None) per completion")
        for i, value in enumerate(values):
            if value is None or (totals[i] is not None and _number(totals[i]) is None):
                continue  # not applicable, or this sample already holds an invalid value
            number = _number(value)
            totals[i] = value if number is None else (totals[i] or 0.0) + f.weight * number
    return totals
