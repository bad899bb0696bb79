"""A multi-turn task with a tool: integer arithmetic word problems and a calculator the policy may call.

A prompt is ``"What is 12*7+3?"`` and the answer is ``"87"``. On each assistant turn the policy
either answers or calls the calculator by writing ``calc(12*7)`` somewhere in its reply (the first
call is run; the rest of the text is ignored). The environment evaluates the expression with
``safe_eval``, a small recursive-descent parser over integers, ``+ - * /`` and parentheses (never
Python's ``eval``), and answers as a user turn: ``result: 84``, or ``error: ...`` for a malformed
call. A reply without a tool call is a final answer: right ends the episode with reward 1.0; wrong
either ends it (``feedback_on_wrong=False``) or gets the user reply ``wrong, try again`` so the
policy can retry in its next turn. The workflow caps the number of assistant turns (``max_turns``)
and discounts the reward of later turns.

Every message the environment sends is spelled with the tiny character-level tokenizer's
characters, so it never produces ``<|unk|>``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from fractions import Fraction
from typing import ClassVar, Sequence

from lit_ppo.tasks.base import Problem, split_problems, vocabulary_ids

MAX_EXPRESSION_CHARS = 100
"""Longest expression the calculator accepts: with integers and + - * / only, this bounds every
result to a few hundred digits, so no input can exhaust time or memory."""
MAX_DEPTH = 20
"""Deepest nesting of parentheses and unary signs the parser follows (bounds its recursion)."""
TOOL_PREFIX = "calc("
"""What opens a tool call: ``calc(`` + expression + the matching ``)``."""
WRONG_FEEDBACK = "wrong, try again"
"""User reply to a wrong final answer when the task lets the policy retry."""
COMPLETION_CHARACTERS = tuple("0123456789+-*/() cal")
"""Characters a reply needs (answers, signs, and ``calc(...)`` calls), for the optional restriction."""


class CalculatorError(ValueError):
    """The expression is not one the calculator accepts, or it divides by zero."""


def safe_eval(expression: str) -> Fraction:
    """Exact value of an integer arithmetic expression: ``+ - * /``, unary signs, parentheses, spaces.

    Grammar (standard precedence, left associative; ``/`` is exact division)::

        expr   := term (('+' | '-') term)*
        term   := unary (('*' | '/') unary)*
        unary  := ('+' | '-') unary | atom
        atom   := digits | '(' expr ')'

    Anything else (names, attributes, calls, ``**``, decimals, other characters), more than
    ``MAX_EXPRESSION_CHARS`` characters, more than ``MAX_DEPTH`` nested levels, or a division by
    zero raises ``CalculatorError`` with a message spelled in the tiny tokenizer's characters.
    """
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise CalculatorError(f"expression longer than {MAX_EXPRESSION_CHARS} characters")
    if not expression.strip(" "):
        raise CalculatorError("empty expression")
    parser = _Parser(expression)
    value = parser.expr(0)
    parser.skip_spaces()
    if parser.pos < len(expression):
        raise CalculatorError(f"unexpected character at position {parser.pos}")
    return value


class _Parser:
    """Recursive descent over ``text``; ``pos`` is the next unread character."""

    def __init__(self, text: str):
        self.text = text
        self.pos = 0

    def skip_spaces(self) -> None:
        while self.pos < len(self.text) and self.text[self.pos] == " ":
            self.pos += 1

    def peek(self) -> str:
        self.skip_spaces()
        return self.text[self.pos] if self.pos < len(self.text) else ""

    def expr(self, depth: int) -> Fraction:
        value = self.term(depth)
        while self.peek() in ("+", "-"):
            op = self.text[self.pos]
            self.pos += 1
            rhs = self.term(depth)
            value = value + rhs if op == "+" else value - rhs
        return value

    def term(self, depth: int) -> Fraction:
        value = self.unary(depth)
        while self.peek() in ("*", "/"):
            op = self.text[self.pos]
            self.pos += 1
            if self.peek() == "*":  # '**' is not an operator here; say so rather than "unexpected"
                raise CalculatorError(f"powers are not supported (position {self.pos})")
            rhs = self.unary(depth)
            if op == "*":
                value = value * rhs
            elif rhs == 0:
                raise CalculatorError("division by zero")
            else:
                value = value / rhs
        return value

    def unary(self, depth: int) -> Fraction:
        if depth >= MAX_DEPTH:
            raise CalculatorError(f"nesting deeper than {MAX_DEPTH} levels")
        ch = self.peek()
        if ch in ("+", "-"):
            self.pos += 1
            value = self.unary(depth + 1)
            return -value if ch == "-" else value
        return self.atom(depth)

    def atom(self, depth: int) -> Fraction:
        ch = self.peek()
        if ch == "(":
            self.pos += 1
            value = self.expr(depth + 1)
            if self.peek() != ")":
                raise CalculatorError(f"missing closing parenthesis at position {self.pos}")
            self.pos += 1
            return value
        start = self.pos
        while self.pos < len(self.text) and self.text[self.pos] in "0123456789":
            self.pos += 1
        if self.pos == start:
            if not ch:
                raise CalculatorError("expression ends early")
            raise CalculatorError(f"expected a number at position {start}")
        return Fraction(int(self.text[start:self.pos]))


def format_number(value: Fraction) -> str:
    """``84`` for integers, ``-7/2`` for other rationals (exact, spelled with tokenizer characters)."""
    return str(value.numerator) if value.denominator == 1 else f"{value.numerator}/{value.denominator}"


def find_tool_call(text: str) -> str | None:
    """The argument of the first ``calc(...)`` in ``text`` (up to the matching ``)``), or None if
    there is no ``calc(``. An unclosed call raises ``CalculatorError``."""
    start = text.find(TOOL_PREFIX)
    if start < 0:
        return None
    depth, pos = 1, start + len(TOOL_PREFIX)
    while pos < len(text):
        if text[pos] == "(":
            depth += 1
        elif text[pos] == ")":
            depth -= 1
            if depth == 0:
                return text[start + len(TOOL_PREFIX):pos]
        pos += 1
    raise CalculatorError("calc call without its closing parenthesis")


def normalize_answer(text: str) -> str:
    """The text without any whitespace (answers compare whitespace-insensitively)."""
    return "".join(text.split())


class CalculatorEnvironment:
    """One episode of the calculator task (implements ``lit_ppo.tasks.base.Environment``).

    ``step`` returns ``(feedback, reward)``: feedback is the next user message (tool result, tool
    error, or a retry request) or None when the episode is over; reward is the episode's reward if it
    stopped now: 1.0 for a right answer, else ``tool_credit`` once some tool call returned a result,
    else 0.0.
    """

    def __init__(self, problem: Problem, tool_credit: float, feedback_on_wrong: bool):
        self.problem = problem
        self.tool_credit = tool_credit
        self.feedback_on_wrong = feedback_on_wrong
        self.tool_results = 0
        """Tool calls so far that returned a result."""

    def start(self) -> str:
        return self.problem.prompt

    def _fallback_reward(self) -> float:
        return float(self.tool_credit) if self.tool_results else 0.0

    def step(self, completion: str) -> tuple[str | None, float]:
        try:
            expression = find_tool_call(completion)
            if expression is None:  # a final answer
                if normalize_answer(completion) == self.problem.answer:
                    return None, 1.0
                return (WRONG_FEEDBACK if self.feedback_on_wrong else None), self._fallback_reward()
            result = format_number(safe_eval(expression))
        except CalculatorError as e:
            return f"error: {e}", self._fallback_reward()
        self.tool_results += 1
        return f"result: {result}", self._fallback_reward()


@dataclass
class CalculatorTask:
    """``What is <expr>?`` -> the integer value; multi-turn with a ``calc(...)`` tool (see the module docstring)."""

    name: ClassVar[str] = "calculator"

    seed: int = 0
    """Seed of the problem generator; the same config always yields the same problems."""
    num_train: int = 10_000
    """Problems in the 'train' split (sampled with replacement: repeats are expected)."""
    num_test: int = 200
    """Problems in the 'test' split (drawn from an RNG stream independent of 'train')."""
    max_operand: int = 12
    """Operands are drawn uniformly from 0..max_operand (inclusive)."""
    max_operands: int = 3
    """Each expression has 2..max_operands operands (uniformly), joined by operators."""
    operators: Sequence[str] = ("+", "-", "*")
    """Operators to draw from, uniformly per position; a subset of '+', '-', '*' (no division, so
    every answer is an integer)."""
    tool_credit: float = 0.1
    """Reward of an episode that did not answer right but made a tool call that returned a result
    (a well-formed ``calc(...)``): a gradient towards using the tool before answers are right."""
    feedback_on_wrong: bool = True
    """A wrong final answer gets the user reply 'wrong, try again' and the episode goes on (up to the
    workflow's max_turns); False ends the episode at the first final answer."""

    _splits: dict[str, tuple[Problem, ...]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.operators = tuple(self.operators)  # Hydra/YAML hand over lists
        for name in ("num_train", "num_test", "max_operand"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"{name}={value!r} is invalid: must be an integer >= 0")
        if not isinstance(self.max_operands, int) or isinstance(self.max_operands, bool) or self.max_operands < 2:
            raise ValueError(f"max_operands={self.max_operands!r} is invalid: must be an integer >= 2")
        if self.max_operands * (len(str(self.max_operand)) + 1) - 1 > MAX_EXPRESSION_CHARS:
            raise ValueError(f"max_operand={self.max_operand} and max_operands={self.max_operands} are invalid: "
                             f"expressions could exceed the calculator's {MAX_EXPRESSION_CHARS} characters")
        if not self.operators or any(op not in ("+", "-", "*") for op in self.operators):
            raise ValueError(f"operators={self.operators!r} is invalid: must be a non-empty subset of '+', '-', '*'")
        if isinstance(self.tool_credit, bool) or not isinstance(self.tool_credit, (int, float)) \
                or not 0.0 <= self.tool_credit < 1.0:
            raise ValueError(f"tool_credit={self.tool_credit!r} is invalid: must be in [0, 1)")
        if not isinstance(self.feedback_on_wrong, bool):
            raise ValueError(f"feedback_on_wrong={self.feedback_on_wrong!r} is invalid: must be true or false")
        self._splits = {"train": self._generate("train", self.num_train),
                        "test": self._generate("test", self.num_test)}

    def _generate(self, split: str, n: int) -> tuple[Problem, ...]:
        rng = random.Random(f"calculator/{split}/{self.seed}")
        problems = []
        for _ in range(n):
            count = rng.randint(2, self.max_operands)
            expression = str(rng.randint(0, self.max_operand))
            for _ in range(count - 1):
                expression += rng.choice(self.operators) + str(rng.randint(0, self.max_operand))
            problems.append(Problem(prompt=f"What is {expression}?", answer=format_number(safe_eval(expression))))
        return tuple(problems)

    def problems(self, split: str) -> Sequence[Problem]:
        """The problems of 'train' or 'test', in a fixed order."""
        return split_problems(self._splits, split)

    def environment(self, problem: Problem) -> CalculatorEnvironment:
        """A fresh environment for one episode of ``problem`` (this is what makes the task multi-turn)."""
        return CalculatorEnvironment(problem, self.tool_credit, self.feedback_on_wrong)

    def reward(self, problem: Problem, completion: str) -> float:
        """Reward of a single reply as a one-turn episode: 1.0 for the right answer, ``tool_credit``
        for a tool call that returns a result, else 0.0."""
        env = self.environment(problem)
        env.start()
        return env.step(completion)[1]

    def allowed_completion_tokens(self, tokenizer) -> list[int]:
        """Ids of the characters of ``COMPLETION_CHARACTERS`` (digits, ``+-*/()``, space, and the letters
        of ``calc``) and the tokenizer's EOS: all that answers and tool calls need. Used only with
        ``gconfig.restrict_to_task_tokens`` (which also spells ``calc`` letter by letter on tokenizers
        with multi-character tokens)."""
        return vocabulary_ids(tokenizer, COMPLETION_CHARACTERS,
                              "the calculator task with gconfig.restrict_to_task_tokens")
