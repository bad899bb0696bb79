"""lit_ppo.run.run_dir: a run directory's name from what ran, created by one run only."""

from __future__ import annotations

import time

from lit_ppo.run.run_dir import as_file_name, create_run_dir, new_run_dir, run_name, what_ran


def test_a_setting_is_one_file_name():
    assert as_file_name("my run/1") == "my_run_1"
    assert as_file_name("..") == "none"


def test_what_ran_names_the_task_and_model_by_their_telling_part():
    config = {"model": {"algo": "grpo", "model": {"source": "/models/SmolLM2-135M/"}},
              "data": {"task": "python:__main__.Doubling#2"}}
    assert what_ran(config) == {"algo": "grpo", "task": "Doubling", "model": "SmolLM2-135M"}
    assert what_ran({"model": {"algo": "ppo", "model": {}}, "data": {"task": "my_pkg.tasks.Sums"}})["task"] == "Sums"
    assert what_ran({"model": {"algo": "ppo", "model": {}}, "data": {"task": "arithmetic"}})["model"] == "tiny"


def test_a_new_run_directory_is_named_by_what_ran_and_never_shared(tmp_path):
    config = {"trainer": {"default_root_dir": str(tmp_path), "logger": False},
              "model": {"algo": "grpo", "model": {"source": "tiny"}}, "data": {"task": "arithmetic"}}
    first, second = new_run_dir(config), new_run_dir(config)
    assert first.parent == tmp_path / "lit_ppo" and first.name.startswith("grpo-arithmetic-tiny-")
    assert second != first and second.is_dir()
    name = run_name("x", time.mktime((2026, 12, 1, 10, 15, 0, 0, 0, -1)))
    assert [create_run_dir(tmp_path, "e", name).name for _ in range(2)] == [name, f"{name}-2"]
