"""The task registry (``lit_ppo.tasks``): its names, ``build_task`` and its errors."""

from __future__ import annotations

import pytest

from lit_ppo.tasks import TASKS, ArithmeticTask, ReasoningGymTask, build_task
from tests.unit.tasks.helpers import GSM8K_SAMPLE


def test_registry_names():
    assert TASKS.names() == ["agent", "arithmetic", "calculator", "dataset", "gsm8k", "gsm_symbolic", "reasoning_gym",
                             "word_problems"]


def test_build_task():
    assert build_task("arithmetic", seed=5, num_train=30).problems("train") == \
        ArithmeticTask(seed=5, num_train=30).problems("train")
    task = build_task("gsm_symbolic", size=4, test_size=1, seed=3)
    assert isinstance(task, ReasoningGymTask) and task.name == "gsm_symbolic"
    task = build_task("reasoning_gym", dataset="basic_arithmetic", size=3, test_size=1)
    assert task.name == "basic_arithmetic"
    assert build_task("gsm8k", train_path=str(GSM8K_SAMPLE)).problems("train")[0].answer == "22"


def test_build_task_errors():
    with pytest.raises(ValueError, match="data.task='math' is invalid: unknown task 'math'; registered: agent, "
                                         "arithmetic, calculator, dataset, gsm8k, gsm_symbolic, reasoning_gym, "
                                         "word_problems, or a dotted path"):
        build_task("math")
    with pytest.raises(ValueError, match="data.task_kwargs.no_such_option is not a key of task 'arithmetic'"):
        build_task("arithmetic", no_such_option=1)
