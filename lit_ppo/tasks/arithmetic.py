"""The built-in default task: one-digit modular arithmetic, learnable by a tiny random model.

A prompt is ``"3+4="`` and the answer is ``(3 + 4) mod 10 = "7"``: one digit, then the end token.
The task is deliberately tiny so that a freshly initialised character-level causal LM gets a
reward signal from the first step (with sampling restricted to digits + EOS a random policy is
already right 10% of the time and well-formed 100% of the time) and visibly learns with GRPO in
minutes on CPU.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field
from typing import ClassVar, Sequence

from lit_ppo.tasks.base import Problem, split_problems, vocabulary_ids

_OPERATIONS = {
    "+": lambda a, b: a + b,
    "-": lambda a, b: a - b,
    "*": lambda a, b: a * b,
}
DIGITS = tuple("0123456789")


@dataclass
class ArithmeticTask:
    """``a<op>b=`` -> ``(a <op> b) mod modulus``, exact-match reward with a small format credit."""

    name: ClassVar[str] = "arithmetic"

    seed: int = 0
    """Seed of the problem generator; the same config always yields the same problems."""
    num_train: int = 10_000
    """Problems in the 'train' split (sampled with replacement: repeats are expected)."""
    num_test: int = 200
    """Problems in the 'test' split (drawn from an RNG stream independent of 'train')."""
    max_operand: int = 9
    """Operands are drawn uniformly from 0..max_operand (inclusive)."""
    modulus: int = 10
    """The answer is the result modulo this (10 keeps it one digit, so one token)."""
    operators: Sequence[str] = ("+",)
    """Operators to draw from, uniformly per problem; a subset of '+', '-', '*'."""
    format_credit: float = 0.1
    """Reward of a well-formed but wrong answer (a lone number of at most the answer's width).
    Gives the policy a gradient towards 'one digit, then stop' before it gets answers right."""

    _splits: dict[str, tuple[Problem, ...]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # Hydra/YAML hand over lists; a tuple keeps the config hashable and immutable.
        self.operators = tuple(self.operators)
        for name in ("num_train", "num_test", "max_operand"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"{name}={value!r} is invalid: must be an integer >= 0")
        if not isinstance(self.modulus, int) or isinstance(self.modulus, bool) or self.modulus < 2:
            raise ValueError(f"modulus={self.modulus!r} is invalid: must be an integer >= 2")
        if not self.operators or any(op not in _OPERATIONS for op in self.operators):
            raise ValueError(f"operators={self.operators!r} is invalid: must be a non-empty subset "
                             f"of {', '.join(map(repr, _OPERATIONS))}")
        if not 0.0 <= self.format_credit < 1.0:
            raise ValueError(f"format_credit={self.format_credit!r} is invalid: must be in [0, 1)")
        # Generated eagerly: 10k problems take milliseconds, and bad configs fail here.
        self._splits = {"train": self._generate("train", self.num_train),
                        "test": self._generate("test", self.num_test)}

    @property
    def answer_width(self) -> int:
        """Digits of the largest possible answer (1 for modulus <= 10)."""
        return len(str(self.modulus - 1))

    def _generate(self, split: str, n: int) -> tuple[Problem, ...]:
        # A string seed names an independent, reproducible stream per split (str seeds are
        # hashed with SHA-512 by `random`, so PYTHONHASHSEED does not matter).
        rng = random.Random(f"arithmetic/{split}/{self.seed}")
        problems = []
        for _ in range(n):
            a = rng.randint(0, self.max_operand)
            b = rng.randint(0, self.max_operand)
            op = rng.choice(self.operators)
            # Python's % is non-negative for a positive modulus, so '-' needs no special case.
            answer = _OPERATIONS[op](a, b) % self.modulus
            problems.append(Problem(prompt=f"{a}{op}{b}=", answer=str(answer)))
        return tuple(problems)

    def problems(self, split: str) -> Sequence[Problem]:
        """The problems of 'train' or 'test', in a fixed order."""
        return split_problems(self._splits, split)

    def reward(self, problem: Problem, completion: str) -> float:
        """1.0 for the exact answer (surrounding whitespace ignored), ``format_credit`` for another
        lone number of at most ``answer_width`` digits, 0.0 for anything else.

        ``completion`` is the decoded text without special tokens (so without the end token).
        """
        text = completion.strip()
        if text == problem.answer:
            return 1.0
        if re.fullmatch(rf"[0-9]{{1,{self.answer_width}}}", text):
            return float(self.format_credit)
        return 0.0

    def allowed_completion_tokens(self, tokenizer) -> list[int]:
        """Ids of the digits '0'..'9' and the tokenizer's EOS: all a completion needs."""
        return vocabulary_ids(tokenizer, DIGITS, "the arithmetic task")
