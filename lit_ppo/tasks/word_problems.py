"""One-step word problems in plain English, scored by the last number of the completion.

``"Noah has 73 shells and gives away 6 of them. How many shells does Noah have left?"`` -> ``67``.
Each problem is one addition, subtraction or multiplication of small numbers dressed in a sentence,
so a small instruction-tuned model (SmolLM2-135M-Instruct) can solve some of them from the start and
RL has room to improve both its arithmetic and its habit of answering at length (completions cut off
by ``gconfig.max_new_tokens`` score 0). The reward asks for no format: the last number written is
the answer, as a reader would take it.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field
from typing import ClassVar, Sequence

from lit_ppo.tasks.base import Problem, split_problems

NAMES = ("Noah", "Emma", "Liam", "Olivia", "Ava", "Lucas", "Mia", "Ethan", "Sofia", "Leo", "Grace", "Omar",
         "Priya", "Mateo", "Hana", "Jonas")
ITEMS = ("shells", "apples", "stickers", "marbles", "pencils", "cookies", "stamps", "coins", "books", "cards",
         "flowers", "balloons")
TEMPLATES = {
    "+": ("{name} has {a} {items}. {name} finds {b} more {items}. How many {items} does {name} have now?",
          "There are {a} {items} in a box. {name} puts {b} more {items} in the box. How many {items} are in the "
          "box now?"),
    "-": ("{name} has {a} {items} and gives away {b} of them. How many {items} does {name} have left?",
          "There are {a} {items} on a table. {name} takes {b} of them. How many {items} are left on the table?"),
    "*": ("{name} buys {a} bags with {b} {items} in each bag. How many {items} does {name} buy in total?",
          "{name} makes {a} rows of {items} with {b} {items} in each row. How many {items} are there in all?"),
}
"""Two phrasings per operation, filled with a name, an object and the two numbers."""
NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def last_number(text: str) -> str | None:
    """The last number written in ``text`` (thousands separators dropped, ``67.0`` as ``67``), or None."""
    found = NUMBER.findall(text)
    if not found:
        return None
    number = found[-1].replace(",", "")
    if "." in number and float(number).is_integer():
        number = str(int(float(number)))
    return number


@dataclass
class WordProblemsTask:
    """One-step word problems (``+``, ``-``, ``*``); reward 1.0 iff the completion's last number is the answer."""

    name: ClassVar[str] = "word_problems"

    seed: int = 0
    """Seed of the problem generator; the same config always yields the same problems."""
    num_train: int = 5000
    """Problems in the 'train' split."""
    num_test: int = 128
    """Problems in the 'test' split (an RNG stream independent of 'train'; a problem whose text is a
    'train' problem's, or an earlier 'test' problem's, is skipped: the split is held out)."""
    operators: Sequence[str] = ("+", "-", "*")
    """Operations to draw from, uniformly per problem; a subset of '+', '-', '*'."""
    max_sum_operand: int = 99
    """Largest operand of an addition or subtraction (the second is smaller than the first for '-')."""
    max_product_operand: int = 12
    """Largest operand of a multiplication."""

    _splits: dict[str, tuple[Problem, ...]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.operators = tuple(self.operators)
        for name, low in (("num_train", 0), ("num_test", 0), ("max_sum_operand", 10), ("max_product_operand", 3)):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise ValueError(f"{name}={value!r} is invalid: must be an integer >= {low}")
        if not self.operators or any(op not in TEMPLATES for op in self.operators):
            raise ValueError(f"operators={self.operators!r} is invalid: must be a non-empty subset of "
                             f"{', '.join(map(repr, TEMPLATES))}")
        train = self._generate("train", self.num_train)
        self._splits = {"train": train,
                        "test": self._generate("test", self.num_test, exclude={p.prompt for p in train})}

    def _operands(self, rng: random.Random, op: str) -> tuple[int, int, int]:
        if op == "*":
            a, b = rng.randint(2, self.max_product_operand), rng.randint(2, self.max_product_operand)
            return a, b, a * b
        a = rng.randint(10, self.max_sum_operand)
        if op == "+":
            b = rng.randint(2, self.max_sum_operand)
            return a, b, a + b
        b = rng.randint(2, a - 1)
        return a, b, a - b

    def _generate(self, split: str, n: int, exclude: set[str] | None = None) -> tuple[Problem, ...]:
        """``n`` problems of ``split``'s stream; with ``exclude``, none of those texts and no text twice."""
        rng = random.Random(f"word_problems/{split}/{self.seed}")  # a string seed: one stream per split
        seen = None if exclude is None else set(exclude)
        problems = []
        for _ in range(100 * (n + 10)):  # draws: a space too small to hold n new problems ends the loop
            if len(problems) == n:
                break
            op = rng.choice(self.operators)
            a, b, answer = self._operands(rng, op)
            text = rng.choice(TEMPLATES[op]).format(name=rng.choice(NAMES), items=rng.choice(ITEMS), a=a, b=b)
            if seen is None or text not in seen:
                problems.append(Problem(prompt=text, answer=str(answer)))
                if seen is not None:
                    seen.add(text)
        if len(problems) < n:
            raise ValueError(f"num_{split}={n} is invalid: these settings make too few problems that are not "
                             f"'train' problems; lower it or widen the operands")
        return tuple(problems)

    def problems(self, split: str) -> Sequence[Problem]:
        """The problems of 'train' or 'test', in a fixed order."""
        return split_problems(self._splits, split)

    def reward(self, problem: Problem, completion: str) -> float:
        """1.0 iff the last number of ``completion`` equals the answer, else 0.0."""
        return float(last_number(completion) == problem.answer)

    def allowed_completion_tokens(self, tokenizer) -> None:
        """Free text: every token."""
        return None
