"""Unit tests for ``lit_ppo.tasks.base``: the contracts of multi-turn and agent tasks are structural."""

from __future__ import annotations

from lit_ppo.tasks import AgentFunctionTask, ArithmeticTask, CalculatorTask
from lit_ppo.tasks.base import AgentTask, Environment, MultiTurnTask, Problem, is_agent, is_multi_turn, task_name
from tests.unit.rollout.episodes.test_multi_turn import ScriptedTask


def solve(client, problem):
    return 1.0


def test_the_task_contracts_are_structural():
    task = CalculatorTask(num_train=0, num_test=0)
    assert isinstance(task, MultiTurnTask) and is_multi_turn(task)
    assert isinstance(task.environment(Problem("What is 1+1?", "2")), Environment)
    assert isinstance(ScriptedTask({}), MultiTurnTask)
    arithmetic = ArithmeticTask(num_train=0, num_test=0)
    assert not isinstance(arithmetic, MultiTurnTask) and not is_multi_turn(arithmetic)
    agent = AgentFunctionTask(solve, arithmetic)
    assert isinstance(agent, AgentTask) and is_agent(agent) and not is_agent(task)


def test_a_task_without_a_name_is_named_by_its_class():
    assert task_name(ArithmeticTask(num_train=0, num_test=0)) == "arithmetic"
    assert task_name(ScriptedTask({})) == "scripted"
    assert task_name(object()) == "object"
