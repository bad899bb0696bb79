"""``data=agent``: an agent function plays the problems of another task.

``data.task_kwargs.agent`` names the agent, ``def solve(client, problem)`` or ``async def solve(client,
problem)``, importable from the working directory (``my_agent.solve``) or given as the function itself
(the Python API). It talks to the policy through ``client.chat.completions.create(...)``, an
OpenAI-compatible client whose calls the rollout records on token ids, or over HTTP with the real
``openai`` package at ``client.base_url`` with ``client.api_key`` (``lit_ppo.rollout.episodes.agent``),
and returns the episode's reward. ``problems`` names the task whose problems it plays (a registered
name or a dotted path module.Class, configured by ``problems_kwargs``): their prompts, answers and
columns reach the agent as ``problem``.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, Sequence

from lit_ppo.tasks.base import Problem, Task
from lit_ppo.utils.imports import import_object

AGENT_KEY = "data.task_kwargs.agent"


def agent_function(agent: Any) -> Callable:
    """The agent ``agent`` names (a dotted path, a reference to a Python object, or the function), once it
    takes ``(client, problem)``; ValueError naming data.task_kwargs.agent otherwise."""
    if agent is None:
        raise ValueError(f"{AGENT_KEY} is required: the dotted path module.function of the agent, "
                         f"def solve(client, problem) returning the episode's reward")
    function = import_object(agent, AGENT_KEY, "function") if isinstance(agent, str) else agent
    if not callable(function):
        raise ValueError(f"{AGENT_KEY}={agent!r} is not a function: give def solve(client, problem)")
    try:
        inspect.signature(function).bind(None, None)
    except TypeError:
        raise ValueError(f"{AGENT_KEY}={agent!r} must take two arguments (client, problem); it takes "
                         f"{inspect.signature(function)}") from None
    except ValueError:  # a builtin without a signature: taken as it is
        pass
    return function


class AgentFunctionTask:
    """The problems of the task ``source`` (its train and test splits), played by ``agent``.

    Args:
        agent: the agent: dotted path module.function, ``def solve(client, problem)`` or ``async def``,
            returning the episode's reward (a finite real number), or the function itself.
        source: the task whose problems the agent plays.
    """

    def __init__(self, agent: Any, source: Task):
        self.agent = agent_function(agent)
        """The agent function (``lit_ppo.tasks.base.AgentTask.agent``)."""
        self.source = source
        self.name = f"agent-{getattr(self.agent, '__name__', 'agent')}"

    def problems(self, split: str) -> Sequence[Problem]:
        return self.source.problems(split)

    def reward(self, problem: Problem, completion: str) -> float:
        raise NotImplementedError("an agent task's reward is what its agent returns")

    def allowed_completion_tokens(self, tokenizer) -> list[int] | None:
        """The problems' task's, for ``gconfig.restrict_to_task_tokens=true`` (an agent whose replies are
        answers in that task's alphabet); an agent that writes tool calls or prose needs it false."""
        return self.source.allowed_completion_tokens(tokenizer)

    def __repr__(self) -> str:
        return f"AgentFunctionTask(agent={describe_agent(self.agent)}, source={self.source.name!r})"


def describe_agent(agent: Callable) -> str:
    """The agent's name in messages: ``module.function``."""
    name = getattr(agent, "__qualname__", None) or getattr(agent, "__name__", None)
    module = getattr(agent, "__module__", None)
    return f"{module}.{name}" if name and module else repr(agent)


__all__ = ["AGENT_KEY", "AgentFunctionTask", "agent_function", "describe_agent"]
