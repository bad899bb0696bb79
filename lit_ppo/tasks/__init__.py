"""Layer 3, tasks: prompt sources with verifiable rewards, and the contracts a task implements (``base``)."""

from __future__ import annotations

import inspect
from collections.abc import Sequence

from lit_ppo.tasks.agent import AgentFunctionTask
from lit_ppo.tasks.arithmetic import ArithmeticTask
from lit_ppo.tasks.base import Problem, Task
from lit_ppo.tasks.calculator import CalculatorTask
from lit_ppo.tasks.dataset import DatasetTask
from lit_ppo.tasks.gsm8k import GSM8KTask
from lit_ppo.tasks.reasoning_gym import ReasoningGymTask
from lit_ppo.tasks.word_problems import WordProblemsTask
from lit_ppo.utils.imports import describe, import_object, is_object_reference
from lit_ppo.utils.registry import Registry
from lit_ppo.utils.text import did_you_mean

TASKS: Registry = Registry("task")
"""Task name -> constructor taking the task's config as keyword arguments."""

TASKS.register("arithmetic")(ArithmeticTask)
TASKS.register("reasoning_gym")(ReasoningGymTask)
TASKS.register("gsm8k")(GSM8KTask)
TASKS.register("calculator")(CalculatorTask)
TASKS.register("dataset")(DatasetTask)
TASKS.register("word_problems")(WordProblemsTask)


@TASKS.register("gsm_symbolic")
def gsm_symbolic(**kwargs) -> ReasoningGymTask:
    """reasoning-gym's GSM8K-like symbolic word problems (offline, with an exact checker)."""
    return ReasoningGymTask(dataset="gsm_symbolic", **kwargs)


@TASKS.register("agent")
def agent(agent=None, problems: str = "arithmetic", problems_kwargs: dict | None = None) -> AgentFunctionTask:
    """The problems of the task ``problems`` (a registered name or a dotted path module.Class, configured by
    ``problems_kwargs``) played by ``agent``, ``def solve(client, problem)`` (``lit_ppo.tasks.agent``)."""
    try:
        source = build_task(problems, **(problems_kwargs or {}))
    except ValueError as e:
        raise ValueError(f"data.task_kwargs.problems={problems!r}: {e}") from None
    return AgentFunctionTask(agent, source)


def _parameters(ctor) -> list[str] | None:
    """The keyword arguments ``ctor`` takes; None when it takes any (``**kwargs``) or cannot tell."""
    try:
        params = inspect.signature(ctor).parameters
    except (TypeError, ValueError):
        return None
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return None
    return [n for n, p in params.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]


def task_parameters(name) -> list[str] | None:
    """The ``data.task_kwargs`` the task ``name`` (registered, a dotted path module.Class or a reference to a
    Task class) takes; None when it takes any, or when ``name`` names no class (``build_task`` says why)."""
    try:
        ctor = TASKS.get(name) if _registered(name) else import_object(name, "data.task", "Class")
    except ValueError:
        return None
    return _parameters(ctor) if callable(ctor) else None


def _registered(name) -> bool:
    return not is_object_reference(name) and (name in TASKS or not isinstance(name, str) or "." not in name)


def _check_kwargs(ctor, kwargs: dict, name: str) -> None:
    """ValueError naming the first key of ``kwargs`` that ``ctor`` does not take (unless it takes **kwargs)."""
    allowed = _parameters(ctor)
    if allowed is None:
        return
    for key in kwargs:
        if key not in allowed:
            hint = did_you_mean(key, allowed, prefix="data.task_kwargs.")
            takes = f"allowed: {', '.join(allowed)}" if allowed else "it takes no arguments"
            raise ValueError(f"data.task_kwargs.{key} is not a key of task {name!r}{hint}; {takes}")


DEFAULT_TASK = "arithmetic"
"""The task of a run that names none (``data.task``)."""


def build_task(name: str, **kwargs) -> Task:
    """The task registered as ``name``, or the class at dotted path ``name`` (importable from the
    working directory) implementing the Task protocol, configured by ``kwargs``, or the Task class or
    instance a reference to a Python object names (``lit_ppo.utils.imports.object_reference``); ValueError
    naming data.task for an unknown name, a path that cannot be imported or a class that is not a Task."""
    if _registered(name):
        try:
            ctor = TASKS.get(name)
        except ValueError as e:
            raise ValueError(f"data.task={name!r} is invalid: {e}, or a dotted path module.Class") from None
        _check_kwargs(ctor, kwargs, name)
        return check_problems(ctor(**kwargs), name)
    target = import_object(name, "data.task", "Class")
    instance = is_object_reference(name) and not isinstance(target, type)
    if not (isinstance(target, type) or instance):
        raise ValueError(f"data.task={name!r} is not a class: give a dotted path module.Class of a Task")
    missing = [m for m in ("problems", "reward", "allowed_completion_tokens") if not callable(getattr(target, m, None))]
    if missing:
        raise ValueError(f"data.task={name!r} does not implement the Task protocol: it lacks {', '.join(missing)} "
                         f"(see lit_ppo.tasks.base.Task)")
    if instance:
        if kwargs:
            raise ValueError(f"data.task={name!r} is a Task instance, constructed already: data.task_kwargs "
                             f"({', '.join(kwargs)}) cannot be given to it")
        task = target
    else:
        _check_kwargs(target, kwargs, name)
        try:
            task = target(**kwargs)
        except (Exception, SystemExit) as e:  # the user's code: whatever it raises is a bad setting of data.task
            given = ", ".join(f"{k}={v!r}" for k, v in kwargs.items())
            raise ValueError(f"data.task={name!r} cannot be constructed: {target.__name__}({given}) raised "
                             f"{describe(e)}") from None
    if not isinstance(getattr(task, "name", None), str):
        raise ValueError(f"data.task={name!r} does not implement the Task protocol: it has no string 'name'")
    return check_problems(task, name)


def check_problems(task: Task, name: str) -> Task:
    """``task``, once its splits are what the trainer needs: ``problems('train')`` a non-empty sequence
    and ``problems('test')`` a sequence, both of ``Problem`` rows with string prompts; ValueError naming
    data.task and what is wrong otherwise."""
    for split in ("train", "test"):
        call = f"problems({split!r})"
        try:
            problems = task.problems(split)
        except (Exception, SystemExit) as e:
            raise ValueError(f"data.task={name!r}: {call} raised {describe(e)}") from None
        if isinstance(problems, (str, bytes)) or not isinstance(problems, Sequence):
            raise ValueError(f"data.task={name!r}: {call} returned {type(problems).__name__}, not a sequence "
                             f"(list or tuple) of lit_ppo.tasks.base.Problem")
        if split == "train" and len(problems) == 0:
            raise ValueError(f"data.task={name!r} has no train problems: {call} returned an empty "
                             f"{type(problems).__name__}")
        for i, problem in enumerate(problems):
            if not isinstance(problem, Problem):
                raise ValueError(f"data.task={name!r}: {call}[{i}] is {type(problem).__name__}, not a "
                                 f"lit_ppo.tasks.base.Problem")
            if not isinstance(problem.prompt, str):
                raise ValueError(f"data.task={name!r}: {call}[{i}].prompt is {type(problem.prompt).__name__}, "
                                 f"not a string")
    return task


__all__ = ["TASKS", "AgentFunctionTask", "ArithmeticTask", "CalculatorTask", "DatasetTask", "GSM8KTask", "Problem",
           "ReasoningGymTask", "DEFAULT_TASK", "Task", "agent", "build_task", "check_problems", "gsm_symbolic",
           "task_parameters"]
