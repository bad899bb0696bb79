"""data=agent's task (lit_ppo.tasks.agent): the agent by dotted path or as the function, the problems of
another task, and one line for each mistake."""

from __future__ import annotations

import pytest

from lit_ppo.tasks import build_task
from lit_ppo.tasks.agent import AgentFunctionTask
from lit_ppo.tasks.arithmetic import ArithmeticTask
from lit_ppo.tasks.base import Problem


def solve(client, problem):
    return 1.0


async def solve_async(client, problem):
    return 1.0


def test_the_agent_plays_the_problems_of_the_task_it_names():
    task = build_task("agent", agent=f"{__name__}.solve", problems="arithmetic", problems_kwargs={"seed": 3})
    assert isinstance(task, AgentFunctionTask) and task.agent is solve and task.name == "agent-solve"
    assert task.problems("train") == ArithmeticTask(seed=3).problems("train")
    assert task.problems("test") == ArithmeticTask(seed=3).problems("test")
    assert build_task("agent", agent=solve_async).agent is solve_async  # the function itself (the Python API)


def test_its_allowed_tokens_are_the_problems_task_s():
    from lit_ppo.models import build_tiny_tokenizer

    tokenizer = build_tiny_tokenizer()
    task = build_task("agent", agent=solve)
    assert task.allowed_completion_tokens(tokenizer) == ArithmeticTask().allowed_completion_tokens(tokenizer)
    with pytest.raises(NotImplementedError, match="an agent task's reward is what its agent returns"):
        task.reward(Problem("1+1=", "2"), "2")


def takes_one(client):
    return 1.0


@pytest.mark.parametrize("kwargs, expected", [
    ({}, "data.task_kwargs.agent is required: the dotted path module.function of the agent, def solve(client, "
         "problem) returning the episode's reward"),
    ({"agent": "solve"}, "data.task_kwargs.agent='solve' is invalid: must be a dotted path module.function"),
    ({"agent": f"{__name__}.missing"}, f"data.task_kwargs.agent='{__name__}.missing' cannot be imported (module "
                                       f"'{__name__}' has no 'missing')"),
    ({"agent": f"{__name__}.takes_one"}, f"data.task_kwargs.agent='{__name__}.takes_one' must take two arguments "
                                         f"(client, problem); it takes (client)"),
    ({"agent": 3}, "data.task_kwargs.agent=3 is not a function: give def solve(client, problem)"),
    ({"agent": solve, "problems": "nope"}, "data.task_kwargs.problems='nope': data.task='nope' is invalid: unknown "
                                           "task 'nope'"),
    ({"agent": solve, "problems_kwargs": {"sed": 1}}, "data.task_kwargs.problems='arithmetic': "
                                                      "data.task_kwargs.sed is not a key of task 'arithmetic'"),
    ({"agent": solve, "tools": []}, "data.task_kwargs.tools is not a key of task 'agent'"),
])
def test_each_mistake_is_one_line_naming_the_key(kwargs, expected):
    with pytest.raises(ValueError) as error:
        build_task("agent", **kwargs)
    assert str(error.value).startswith(expected) and "\n" not in str(error.value)
