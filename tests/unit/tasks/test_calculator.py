"""Unit tests for ``lit_ppo.tasks.calculator``: the safe parser, the tool-call syntax, the environment's
replies, the reward table, problem generation and config validation.

Expected values are written out by hand or computed by a separate reference in this file, never by the
code under test.
"""

from __future__ import annotations

import builtins
import re
from fractions import Fraction

import pytest

from lit_ppo.models import CHARACTERS, build_tiny_tokenizer
from lit_ppo.tasks import TASKS, ArithmeticTask, CalculatorTask, build_task
from lit_ppo.tasks.base import Problem, is_multi_turn
from lit_ppo.tasks.calculator import CalculatorError, find_tool_call, format_number, safe_eval


@pytest.fixture(scope="module")
def tok():
    return build_tiny_tokenizer()


@pytest.fixture
def no_eval(monkeypatch):
    """Make Python's own evaluators unusable: the calculator must not need them."""
    def forbidden(*args, **kwargs):
        raise AssertionError("the calculator called eval or exec")
    for name in ("eval", "exec"):
        monkeypatch.setattr(builtins, name, forbidden)


# ---------------------------------------------------------------- safe parser: values


@pytest.mark.parametrize("expression, value", [
    ("7", Fraction(7)),
    ("1+2*3", Fraction(7)),           # * binds tighter than +
    ("(1+2)*3", Fraction(9)),
    ("10-4-3", Fraction(3)),          # left associative
    ("100/10/5", Fraction(2)),        # left associative
    ("7/2", Fraction(7, 2)),          # exact division
    ("1/3+1/6", Fraction(1, 2)),
    ("-3*-2", Fraction(6)),           # unary minus on either side
    ("-(2+3)", Fraction(-5)),
    ("+5", Fraction(5)),
    ("--4", Fraction(4)),
    (" 12 * 7 ", Fraction(84)),       # spaces anywhere
    ("2*(3+(4-1))", Fraction(12)),
    ("007", Fraction(7)),
    ("12*7+3", Fraction(87)),
    ("123456789*987654321", Fraction(121932631112635269)),
])
def test_safe_eval_values(no_eval, expression, value):
    got = safe_eval(expression)
    assert isinstance(got, Fraction) and got == value


@pytest.mark.parametrize("expression, message", [
    ("__import__('os')", "expected a number at position 0"),
    ("x", "expected a number at position 0"),
    ("abs(1)", "expected a number at position 0"),
    ("1 .real", "unexpected character at position 2"),
    ("(1).real", "unexpected character at position 3"),
    ("2**3", "powers are not supported"),
    ("2**100000000", "powers are not supported"),
    ("2^3", "unexpected character at position 1"),
    ("1.5", "unexpected character at position 1"),
    ("1e3", "unexpected character at position 1"),
    ("5//2", "expected a number at position 2"),
    ("1 2", "unexpected character at position 2"),
    ("", "empty expression"),
    ("   ", "empty expression"),
    ("1+", "expression ends early"),
    ("(1+2", "missing closing parenthesis"),
    ("1)", "unexpected character at position 1"),
    ("()", "expected a number at position 1"),
    ("1/0", "division by zero"),
    ("1/(3-3)", "division by zero"),
    ("0/0", "division by zero"),
    ("1+" * 60 + "1", "longer than 100 characters"),
    ("(" * 25 + "1" + ")" * 25, "nesting deeper than 20"),
    ("-" * 30 + "1", "nesting deeper than 20"),
    ("1\t+2", "unexpected character at position 1"),
])
def test_safe_eval_rejects(no_eval, expression, message):
    with pytest.raises(CalculatorError, match=re.escape(message)):
        safe_eval(expression)


def test_calculator_error_is_a_value_error():
    assert issubclass(CalculatorError, ValueError)


def test_depth_limit_is_not_hit_by_moderate_nesting():
    assert safe_eval("(" * 19 + "1" + ")" * 19) == 1


def test_format_number():
    assert format_number(Fraction(84)) == "84"
    assert format_number(Fraction(-5)) == "-5"
    assert format_number(Fraction(0)) == "0"
    assert format_number(Fraction(7, 2)) == "7/2"
    assert format_number(Fraction(-14, 4)) == "-7/2"


# ---------------------------------------------------------------- tool-call syntax


@pytest.mark.parametrize("text, expression", [
    ("calc(12*7)", "12*7"),
    ("first calc((1+2)*3) then more", "(1+2)*3"),
    ("calc(1) calc(2)", "1"),                    # only the first call
    ("calc()", ""),
    ("87", None),
    ("calc 1+2", None),
    ("Calc(1)", None),                           # case-sensitive
])
def test_find_tool_call(text, expression):
    assert find_tool_call(text) == expression


def test_unclosed_tool_call_is_an_error():
    with pytest.raises(CalculatorError, match="calc call without its closing parenthesis"):
        find_tool_call("calc((1+2)")


# ---------------------------------------------------------------- environment replies

PROBLEM = Problem(prompt="What is 12*7+3?", answer="87")


def env(**task_kwargs):
    task = CalculatorTask(num_train=0, num_test=0, **task_kwargs)
    environment = task.environment(PROBLEM)
    assert environment.start() == "What is 12*7+3?"
    return environment


@pytest.mark.parametrize("reply, expected", [
    ("calc(12*7)", ("result: 84", 0.1)),
    ("let me see calc(12*7+3)", ("result: 87", 0.1)),
    ("calc(7/2)", ("result: 7/2", 0.1)),
    ("calc(3-10)", ("result: -7", 0.1)),
    ("calc(1/0)", ("error: division by zero", 0.0)),
    ("calc(__import__)", ("error: expected a number at position 0", 0.0)),
    ("calc(2**9)", ("error: powers are not supported (position 2)", 0.0)),
    ("calc(12*7", ("error: calc call without its closing parenthesis", 0.0)),
    ("calc()", ("error: empty expression", 0.0)),
    ("87", (None, 1.0)),
    (" 8 7 ", (None, 1.0)),                       # whitespace-insensitive
    ("88", ("wrong, try again", 0.0)),
    ("", ("wrong, try again", 0.0)),
    ("87.0", ("wrong, try again", 0.0)),
])
def test_environment_replies_to_one_turn(no_eval, reply, expected):
    assert env().step(reply) == expected


def test_environment_remembers_a_working_tool_call():
    environment = env(tool_credit=0.25)
    assert environment.step("calc(1/0)") == ("error: division by zero", 0.0)   # an error earns nothing
    assert environment.step("calc(12*7)") == ("result: 84", 0.25)
    assert environment.step("84") == ("wrong, try again", 0.25)              # wrong after a working call
    assert environment.step("87") == (None, 1.0)                             # right: 1.0, not 1.25


def test_without_feedback_on_wrong_a_wrong_answer_ends_the_episode():
    environment = env(feedback_on_wrong=False)
    assert environment.step("calc(12*7)") == ("result: 84", 0.1)
    assert environment.step("85") == (None, 0.1)
    assert env(feedback_on_wrong=False).step("85") == (None, 0.0)


def test_environment_messages_are_spelled_with_the_tiny_tokenizer(tok):
    environment = env()
    messages = [environment.start()] + [environment.step(r)[0] for r in
                                        ("calc(7/2)", "calc(1/0)", "calc(x)", "calc(2**2)", "calc(1", "1")]
    for message in messages:
        assert all(ch in CHARACTERS for ch in message), message
        assert tok.unk_token_id not in tok.encode(message, add_special_tokens=False)


# ---------------------------------------------------------------- reward table (single reply)


@pytest.mark.parametrize("completion, reward", [
    ("87", 1.0),
    (" 87 ", 1.0),
    ("8 7", 1.0),
    ("88", 0.0),
    ("-87", 0.0),
    ("", 0.0),
    ("calc(12*7)", 0.1),
    ("calc(12*7) 87", 0.1),          # a reply with a tool call is not a final answer
    ("calc(1/0)", 0.0),
    ("calc(12*7", 0.0),
])
def test_reward_table(completion, reward):
    task = CalculatorTask(num_train=0, num_test=0)
    assert task.reward(PROBLEM, completion) == reward


def test_tool_credit_is_configurable():
    assert CalculatorTask(num_train=0, num_test=0, tool_credit=0.0).reward(PROBLEM, "calc(1+1)") == 0.0
    assert CalculatorTask(num_train=0, num_test=0, tool_credit=0.5).reward(PROBLEM, "calc(1+1)") == 0.5


def test_each_episode_gets_a_fresh_environment():
    task = CalculatorTask(num_train=0, num_test=0)
    first = task.environment(PROBLEM)
    first.step("calc(1+1)")
    assert task.environment(PROBLEM).step("1") == ("wrong, try again", 0.0)   # no credit carried over


# ---------------------------------------------------------------- problems


def reference_value(expression: str) -> int:
    """Integer value of 'a op b op c' (+, -, *) with * first: a reference independent of safe_eval."""
    tokens = re.findall(r"\d+|[+\-*]", expression)
    terms, signs, current = [], [1], int(tokens[0])
    for op, number in zip(tokens[1::2], tokens[2::2]):
        if op == "*":
            current *= int(number)
        else:
            terms.append(current)
            signs.append(1 if op == "+" else -1)
            current = int(number)
    terms.append(current)
    return sum(s * t for s, t in zip(signs, terms))


def test_problems_are_well_formed_and_answers_are_right(tok):
    task = CalculatorTask(seed=3, num_train=300, num_test=50, max_operand=12, max_operands=3)
    seen_counts, seen_ops = set(), set()
    for problem in list(task.problems("train")) + list(task.problems("test")):
        match = re.fullmatch(r"What is ((?:\d+[+\-*])+\d+)\?", problem.prompt)
        assert match, problem.prompt
        expression = match.group(1)
        operands = [int(x) for x in re.findall(r"\d+", expression)]
        assert 2 <= len(operands) <= 3 and all(0 <= x <= 12 for x in operands)
        seen_counts.add(len(operands))
        seen_ops.update(re.findall(r"[+\-*]", expression))
        assert problem.answer == str(reference_value(expression))
        assert tok.unk_token_id not in tok.encode(problem.prompt, add_special_tokens=False)
    assert seen_counts == {2, 3} and seen_ops == {"+", "-", "*"}


def test_problems_are_seeded_and_splits_differ():
    a, b = CalculatorTask(seed=1, num_train=50, num_test=50), CalculatorTask(seed=1, num_train=50, num_test=50)
    assert a.problems("train") == b.problems("train") and a.problems("test") == b.problems("test")
    assert len(a.problems("train")) == 50 and len(a.problems("test")) == 50
    assert a.problems("train") != a.problems("test")
    assert CalculatorTask(seed=2, num_train=50, num_test=0).problems("train") != a.problems("train")
    # the test split does not depend on the size of train
    assert CalculatorTask(seed=1, num_train=7, num_test=50).problems("test") == a.problems("test")


def test_operator_subset_is_respected():
    task = CalculatorTask(num_train=100, num_test=0, operators=["*"], max_operands=2)
    for problem in task.problems("train"):
        a, b = re.fullmatch(r"What is (\d+)\*(\d+)\?", problem.prompt).groups()
        assert problem.answer == str(int(a) * int(b))


def test_unknown_split():
    with pytest.raises(ValueError, match="split='valid' is invalid"):
        CalculatorTask(num_train=1, num_test=1).problems("valid")


@pytest.mark.parametrize("kwargs, message", [
    ({"num_train": -1}, "num_train=-1 is invalid"),
    ({"num_test": 1.5}, "num_test=1.5 is invalid"),
    ({"max_operand": True}, "max_operand=True is invalid"),
    ({"max_operands": 1}, "max_operands=1 is invalid: must be an integer >= 2"),
    ({"max_operands": 40, "max_operand": 100}, "could exceed the calculator's 100 characters"),
    ({"operators": ["/"]}, "operators=('/',) is invalid"),
    ({"operators": []}, "operators=() is invalid"),
    ({"tool_credit": 1.0}, "tool_credit=1.0 is invalid: must be in [0, 1)"),
    ({"tool_credit": -0.1}, "tool_credit=-0.1 is invalid"),
    ({"tool_credit": "0.1"}, "tool_credit='0.1' is invalid"),
    ({"feedback_on_wrong": "yes"}, "feedback_on_wrong='yes' is invalid"),
])
def test_config_validation(kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        CalculatorTask(**kwargs)


# ---------------------------------------------------------------- tokens, registry, protocol


def test_allowed_completion_tokens(tok):
    ids = CalculatorTask(num_train=0, num_test=0).allowed_completion_tokens(tok)
    assert len(ids) == len(set(ids)) == 21
    assert ids[-1] == tok.eos_token_id
    assert sorted(tok.convert_ids_to_tokens(ids[:-1])) == sorted("0123456789+-*/() cal")
    # every reply the environment understands can be spelled with them
    for reply in ("calc(12*7)", "-87", "calc((1+2)/3)"):
        assert set(tok.encode(reply, add_special_tokens=False)) <= set(ids)


def test_allowed_completion_tokens_need_single_character_tokens(tok):
    class NoSpace:
        unk_token_id = tok.unk_token_id
        eos_token_id = tok.eos_token_id

        def convert_tokens_to_ids(self, token):
            return tok.unk_token_id if token == " " else tok.convert_tokens_to_ids(token)

    with pytest.raises(ValueError, match="no single token for ' '"):
        CalculatorTask(num_train=0, num_test=0).allowed_completion_tokens(NoSpace())


def test_registered_and_multi_turn():
    assert "calculator" in TASKS.names()
    task = build_task("calculator", seed=4, num_train=20, num_test=5)
    assert isinstance(task, CalculatorTask) and task.name == "calculator"
    assert task.problems("train") == CalculatorTask(seed=4, num_train=20, num_test=5).problems("train")
    assert is_multi_turn(task)
    assert not is_multi_turn(ArithmeticTask(num_train=1, num_test=1))
