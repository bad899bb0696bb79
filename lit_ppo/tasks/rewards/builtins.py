"""The built-in reward functions, named without a module path in ``reward_fns``: ``exact_match`` (the
completion, stripped, equals the gold answer), ``math_verify`` (math-verify judges them equivalent, as in
the gsm8k task) and ``format`` (the completion matches a regular expression, ``format_pattern``). They get
the gold answer (the ``answer_key`` column) as ``answer``; ``exact_match`` and ``math_verify`` need it."""

from __future__ import annotations

import re
import threading
from typing import Callable

from lit_ppo.tasks.gsm8k import math_equal
from lit_ppo.tasks.rewards.calls import completion_text

DEFAULT_FORMAT_PATTERN = r"\\boxed\{.+\}"
"""The ``format`` reward's default: a \\boxed{...} answer somewhere in the completion."""


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
NEEDS_ANSWER = ("exact_match", "math_verify")
"""The built-ins that compare with the gold answer (the ``answer_key`` column)."""
