"""Tasks: prompt sources with verifiable rewards."""

from __future__ import annotations

from lit_ppo.algos.registry import Registry
from lit_ppo.tasks.arithmetic import ArithmeticTask
from lit_ppo.tasks.base import Problem, Task
from lit_ppo.tasks.calculator import CalculatorTask
from lit_ppo.tasks.gsm8k import GSM8KTask
from lit_ppo.tasks.reasoning_gym import ReasoningGymTask

TASKS: Registry = Registry("task")
"""Task name -> constructor taking the task's config as keyword arguments."""

TASKS.register("arithmetic")(ArithmeticTask)
TASKS.register("reasoning_gym")(ReasoningGymTask)
TASKS.register("gsm8k")(GSM8KTask)
TASKS.register("calculator")(CalculatorTask)


@TASKS.register("gsm_symbolic")
def gsm_symbolic(**kwargs) -> ReasoningGymTask:
    """reasoning-gym's GSM8K-like symbolic word problems (offline, with an exact checker)."""
    return ReasoningGymTask(dataset="gsm_symbolic", **kwargs)


def build_task(name: str, **kwargs) -> Task:
    """The task registered as ``name``, configured by ``kwargs``; ValueError listing the
    registered names for an unknown one."""
    return TASKS.get(name)(**kwargs)


__all__ = ["TASKS", "ArithmeticTask", "CalculatorTask", "GSM8KTask", "Problem", "ReasoningGymTask", "Task",
           "build_task", "gsm_symbolic"]
