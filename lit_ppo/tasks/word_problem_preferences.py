"""A hidden preference over answers to word problems (``lit_ppo.tasks.word_problems``), for the RLHF recipe
(docs/recipes.md): of two answers, the correct one wins (its last number is the problem's answer), and of two
correct ones the shorter.

The reward model never sees the rule, only pairs that it decided: ``rule_pairs`` is an ``rm.pairs_fn`` that
writes, for each problem, answers in the style of SmolLM2-135M-Instruct (short ones: the two numbers, the
operation and a result; a long one: a paragraph of working before the same result; and that paragraph cut off
before its result, as a completion that runs out of tokens ends) and pairs them by the rule:

- a short correct answer over the same sentence with a wrong result (the arithmetic decides),
- a short correct answer over the long correct one (brevity decides),
- the long correct answer over its cut-off start (correctness comes before brevity: the cut-off is shorter, but
  its last number is an operand),
- a short correct answer over the cut-off start (both criteria agree).

``correct`` is the rule's first criterion as a reward function (``reward_fns``): 1.0 where the completion's last
number is the answer. Given with weight 0 beside the reward model, it only measures: the policy trains on the
reward model's score alone, and evaluation counts a held-out problem solved by the rule (``accuracy_reward``).
"""

from __future__ import annotations

import random
import re

from lit_ppo.tasks.base import Problem
from lit_ppo.tasks.rewards.calls import completion_text
from lit_ppo.tasks.word_problems import last_number

OPERATIONS = (("gives away", "-"), ("takes", "-"), ("more", "+"), ("each", "*"))
"""Words of a problem's template that name its operation (``word_problems.TEMPLATES``), searched in order."""
SHORT = ("{a} {op} {b} = {x}. The answer is {x} {items}.",
         "So, {a} {op} {b} = {x} {items}.",
         "There are {a} {op} {b} = {x} {items}.")
"""Short answers, in the style of the model's own."""
LONG = ("To find the answer, we need to {verb} the two numbers in the problem, {a} and {b}. {a} {op} {b} = {x}. "
        "So the answer is {x} {items}. I hope this helps!")
"""A long answer: the same result after a paragraph of working, as the untrained model often writes."""
VERBS = {"+": "add", "-": "subtract", "*": "multiply"}


def correct(prompts: list, completions: list, answer: list, **kwargs) -> list[float]:
    """1.0 where the last number of the completion is the answer, else 0.0 (the rule's first criterion)."""
    return [float(last_number(completion_text(c)) == str(a)) for c, a in zip(completions, answer, strict=True)]


def prefers(first: str, second: str, answer: str) -> bool:
    """Whether the rule ranks the answer ``first`` above ``second``: correct before wrong, then shorter."""
    def rank(text: str) -> tuple[bool, int]:
        return last_number(text) == answer, -len(text)

    return rank(first) > rank(second)


def _parts(problem: Problem) -> dict:
    """The operands, operation and object of ``problem``'s text (a word_problems problem)."""
    a, b = (int(n) for n in re.findall(r"\d+", problem.prompt)[:2])
    op = next(sign for words, sign in OPERATIONS if words in problem.prompt)
    items = re.search(r"How many (\w+)", problem.prompt).group(1)
    return {"a": a, "b": b, "op": op, "items": items}


def _wrong(answer: int, rng: random.Random) -> int:
    """A plausible wrong result near ``answer``: off by 1 to 10, never negative."""
    while True:
        wrong = answer + rng.choice((-1, 1)) * rng.randint(1, 10)
        if wrong >= 0 and wrong != answer:
            return wrong


def _cut_off(long: str, parts: dict, answer: int) -> str | None:
    """The long answer stopped in its working before its result, at the last point where its last number is
    not the answer (None if there is none)."""
    for end in (f"{parts['a']} {parts['op']} {parts['b']} =", f"in the problem, {parts['a']} and"):
        cut = long[:long.index(end) + len(end)]
        if last_number(cut) != str(answer):
            return cut
    return None


def rule_pairs(problem: Problem) -> list[dict]:
    """The pairs of ``problem`` that the rule decides (the module docstring); the wording and the wrong results
    are drawn from a generator seeded by the problem's text, so the same problem makes the same pairs."""
    rng = random.Random(problem.prompt)
    parts = _parts(problem)
    answer = int(problem.answer)
    short = rng.choice(SHORT)
    right = short.format(x=answer, **parts)
    wrong = short.format(x=_wrong(answer, rng), **parts)
    long = LONG.format(x=answer, verb=VERBS[parts["op"]], **parts)
    pairs = [{"chosen": right, "rejected": wrong}, {"chosen": right, "rejected": long}]
    cut = _cut_off(long, parts, answer)
    if cut is not None:
        other_right = rng.choice(SHORT).format(x=answer, **parts)
        pairs += [{"chosen": long, "rejected": cut}, {"chosen": other_right, "rejected": cut}]
    return pairs
