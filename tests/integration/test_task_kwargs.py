"""A Task class gets the task settings it takes: the data preset's own (``seed`` of the arithmetic preset)
are dropped for a class that does not take them, while a setting the user gives it is still refused, naming
what the class takes. From the command line and from Python."""

from __future__ import annotations

import pytest
import yaml

import lit_ppo
from lit_ppo.errors import ConfigError
from lit_ppo.launch.check import check_config
from lit_ppo.tasks import Problem
from lit_ppo.tasks.base import vocabulary_ids

TASK_MODULE = '''
from lit_ppo.tasks import Problem
from lit_ppo.tasks.base import vocabulary_ids


class NoArguments:
    name = "no-arguments"

    def problems(self, split):
        return [Problem(prompt=f"{i}=", answer=str(i)) for i in range(10)]

    def reward(self, problem, completion):
        return float(completion.strip() == problem.answer)

    def allowed_completion_tokens(self, tokenizer):
        return vocabulary_ids(tokenizer, list("0123456789"), "no-arguments")


class Seeded(NoArguments):
    def __init__(self, seed, size=10):
        self.seed, self.size = seed, size
'''


class Doubling:
    name = "doubling"

    def problems(self, split):
        return [Problem(prompt=f"2*{i}=", answer=str(2 * i % 10)) for i in range(10)]

    def reward(self, problem, completion):
        return float(completion.strip() == problem.answer)

    def allowed_completion_tokens(self, tokenizer):
        return vocabulary_ids(tokenizer, list("0123456789"), "doubling")


@pytest.fixture
def task_module(cli_here):
    (cli_here.cwd / "own_tasks_kwargs.py").write_text(TASK_MODULE)
    return cli_here


def _task_kwargs(result) -> dict:
    assert result.returncode == 0, result.stderr
    return yaml.safe_load(result.stdout)["data"]["task_kwargs"]


def test_a_class_gets_only_the_preset_settings_it_takes(task_module):
    assert _task_kwargs(task_module("fit", "data.task=own_tasks_kwargs.NoArguments", "logger=none",
                                    "--print_config")) == {}
    assert _task_kwargs(task_module("fit", "data.task=own_tasks_kwargs.Seeded", "logger=none",
                                    "--print_config")) == {"seed": 0}
    assert _task_kwargs(task_module("fit", "data=dataset", "data.task=own_tasks_kwargs.Seeded",
                                    "data.task_kwargs.size=4", "data.task_kwargs.seed=5", "logger=none",
                                    "gconfig.max_new_tokens=64", "--print_config")) == {"size": 4, "seed": 5}


def _error(result) -> str:
    assert result.returncode == 2, result.stderr
    (line,) = result.stderr.strip().splitlines()
    return line


def test_a_setting_the_user_gives_is_still_refused(task_module, no_model_loading):
    assert _error(task_module("fit", "data.task=own_tasks_kwargs.NoArguments", "data.task_kwargs.seed=3")) == (
        "error: data.task_kwargs.seed is not a key of task 'own_tasks_kwargs.NoArguments'; it takes no arguments")
    assert _error(task_module("fit", "data.task=own_tasks_kwargs.Seeded", "data.task_kwargs={seed: 1, sise: 3}")) == (
        "error: data.task_kwargs.sise is not a key of task 'own_tasks_kwargs.Seeded' (did you mean "
        "data.task_kwargs.size?); allowed: seed, size")


def test_python_task_classes_and_instances(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for task in (Doubling, Doubling()):
        config = lit_ppo.compose("logger=none", values={"data.task": task})
        assert config["data.task_kwargs"] == {}
        check_config(config.tree)
    config = lit_ppo.compose("logger=none", "data.task_kwargs.seed=2", values={"data.task": Doubling})
    with pytest.raises(ConfigError, match=r"data.task_kwargs.seed is not a key of task .*Doubling'; it takes no "
                                          r"arguments$"):
        check_config(config.tree)
