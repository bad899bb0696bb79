"""The task protocol: a source of problems and a verifiable reward for a completion."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence, runtime_checkable


@dataclass(frozen=True)
class Problem:
    """One prompt of a task."""

    prompt: str
    """The user message (the chat template is applied by the rollout workflow)."""
    answer: str
    """The gold answer the reward checks against."""


@runtime_checkable
class Task(Protocol):
    name: str
    """Short name, used in logs and run names."""

    def problems(self, split: str) -> Sequence[Problem]:
        """The problems of 'train' or 'test', in a fixed order (deterministic for a given task config)."""

    def reward(self, problem: Problem, completion: str) -> float:
        """Reward of a completion's text, in [0, 1]; anything but a finite real number is an invalid
        reward (see data.on_invalid_reward)."""

    def allowed_completion_tokens(self, tokenizer) -> list[int] | None:
        """Token ids completions may use (the tokenizer's EOS included), or None for all."""


SPLITS = ("train", "test")


def split_problems(splits: dict[str, Sequence[Problem]], split: str) -> Sequence[Problem]:
    """``splits[split]``, with the error every task gives for an unknown split."""
    if split not in splits:
        raise ValueError(f"split={split!r} is invalid: must be one of {', '.join(map(repr, SPLITS))}")
    return splits[split]
