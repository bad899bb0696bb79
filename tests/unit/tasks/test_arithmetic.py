"""The arithmetic task (``lit_ppo.tasks.arithmetic``): problem generation, the reward table, allowed tokens
and config errors."""

from __future__ import annotations

import re

import pytest

from lit_ppo.tasks import ArithmeticTask
from lit_ppo.tasks.base import Problem
from tests.unit.tasks.helpers import char_tokenizer

PROMPT_RE = re.compile(r"(\d+)([+\-*])(\d+)=")
OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}


@pytest.mark.parametrize("kwargs", [{}, {"operators": ["+", "-", "*"], "max_operand": 12, "modulus": 7}])
def test_arithmetic_answers_are_correct(kwargs):
    task = ArithmeticTask(seed=1, num_train=500, num_test=50, **kwargs)
    for split, n in (("train", 500), ("test", 50)):
        problems = task.problems(split)
        assert len(problems) == n
        for p in problems:
            m = PROMPT_RE.fullmatch(p.prompt)
            assert m, p.prompt
            a, op, b = int(m[1]), m[2], int(m[3])
            assert 0 <= a <= task.max_operand and 0 <= b <= task.max_operand
            assert op in task.operators
            assert p.answer == str(OPS[op](a, b) % task.modulus)


def test_arithmetic_default_is_one_digit_addition():
    task = ArithmeticTask()
    problems = task.problems("train")
    assert len(problems) == 10_000
    assert {PROMPT_RE.fullmatch(p.prompt)[2] for p in problems} == {"+"}
    assert {p.answer for p in problems} == set("0123456789")
    # all 100 operand pairs show up: the sampler covers the whole problem space
    assert len({p.prompt for p in problems}) == 100


def test_arithmetic_deterministic_per_seed():
    a, b = ArithmeticTask(seed=7, num_train=200), ArithmeticTask(seed=7, num_train=200)
    c = ArithmeticTask(seed=8, num_train=200)
    assert a.problems("train") == b.problems("train")
    assert a.problems("test") == b.problems("test")
    assert a.problems("train") != c.problems("train")
    assert a.problems("train")[:50] != a.problems("test")[:50]  # independent streams per split


@pytest.mark.parametrize(
    "completion, expected",
    [("7", 1.0), (" 7\n", 1.0), ("3", 0.1), ("  0 ", 0.1), ("77", 0.0), ("7+", 0.0), ("", 0.0),
     ("seven", 0.0), ("7 7", 0.0), ("-7", 0.0)],
)
def test_arithmetic_reward_table(completion, expected):
    task = ArithmeticTask(num_train=1, num_test=0)
    assert task.reward(Problem("3+4=", "7"), completion) == expected


def test_arithmetic_format_credit_and_width():
    assert ArithmeticTask(num_train=1, format_credit=0.0).reward(Problem("3+4=", "7"), "3") == 0.0
    wide = ArithmeticTask(num_train=1, modulus=100, max_operand=99)
    assert wide.reward(Problem("30+12=", "42"), "42") == 1.0
    assert wide.reward(Problem("30+12=", "42"), "41") == 0.1  # two digits are well-formed here
    assert wide.reward(Problem("30+12=", "42"), "421") == 0.0


def test_arithmetic_allowed_tokens():
    tok = char_tokenizer()
    task = ArithmeticTask(num_train=1)
    ids = task.allowed_completion_tokens(tok)
    assert len(ids) == 11 and len(set(ids)) == 11
    assert ids[-1] == tok.eos_token_id == tok.convert_tokens_to_ids("<|end|>")
    assert [tok.decode([i]) for i in ids[:-1]] == list("0123456789")
    assert tok.convert_tokens_to_ids("+") not in ids


def test_arithmetic_allowed_tokens_names_a_missing_digit():
    with pytest.raises(ValueError, match="'5'"):
        ArithmeticTask(num_train=1).allowed_completion_tokens(char_tokenizer("012346789+="))


@pytest.mark.parametrize(
    "kwargs, field",
    [({"modulus": 1}, "modulus"), ({"operators": ["/"]}, "operators"), ({"operators": []}, "operators"),
     ({"format_credit": 1.0}, "format_credit"), ({"num_train": -1}, "num_train")],
)
def test_arithmetic_config_errors(kwargs, field):
    with pytest.raises(ValueError, match=field):
        ArithmeticTask(**kwargs)


def test_arithmetic_unknown_split():
    with pytest.raises(ValueError, match="split"):
        ArithmeticTask(num_train=1).problems("validation")
