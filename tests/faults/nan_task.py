"""A task with broken rewards, for the fault tests (in process and through the CLI)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

from lit_ppo.tasks import TASKS, ArithmeticTask

NAME = "nan_arithmetic"


@dataclass
class NanRewardTask(ArithmeticTask):
    """The arithmetic task, except that every ``period``-th reward (counting calls from 1) is ``value``."""

    name: ClassVar[str] = NAME

    period: int = 7
    """How often the broken value is returned (1: always)."""
    value: Any = math.nan
    """What the broken reward is."""
    calls: int = field(default=0, init=False)

    def reward(self, problem, completion):
        self.calls += 1
        return self.value if self.calls % self.period == 0 else super().reward(problem, completion)


def register() -> None:
    """Make ``data.task=nan_arithmetic`` available (idempotent)."""
    if NAME not in TASKS:
        TASKS.register(NAME)(NanRewardTask)
