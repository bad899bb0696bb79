"""What a TRL user brings: an in-memory ``datasets.Dataset`` or a list of rows given to ``lit_ppo.compose`` as
the data, and TRL's (and verl's) names of settings, each answered with lit_ppo's key."""

from __future__ import annotations

import re
from pathlib import Path

import datasets
import pytest

import lit_ppo
from lit_ppo.config.keys import FOREIGN_KEYS
from lit_ppo.config.trainer import TRAINER_KEYS
from lit_ppo.errors import ConfigError
from lit_ppo.launch.check import check_config
from lit_ppo.launch.compose import _all_keys
from lit_ppo.tasks import build_task
from tests.faults.test_bad_input import error_of

DOCS = Path(__file__).resolve().parents[2] / "docs" / "bring-your-own.md"
ROWS = [{"prompt": f"{a}+{b}=", "answer": str((a + b) % 10), "solution": a + b} for a in range(4) for b in range(3)]


def test_in_memory_datasets_and_lists_of_rows_are_the_data(tmp_path, monkeypatch):
    monkeypatch.setenv("LIT_PPO_CACHE", str(tmp_path / "cache"))
    # data=dataset's 256 new tokens are more than the tiny model's context: the check refuses them
    config = lit_ppo.compose("data=dataset", "logger=none", "gconfig.max_new_tokens=64", values={
        "data.task_kwargs.train_path": datasets.Dataset.from_list(ROWS), "data.task_kwargs.test_path": ROWS[:5]})
    kwargs = config["data.task_kwargs"]
    for name, rows in (("train_path", ROWS), ("test_path", ROWS[:5])):
        assert Path(kwargs[name]).parent == tmp_path / "cache" / "datasets"
        assert datasets.load_from_disk(kwargs[name]).to_list() == rows
    check_config(config.tree)
    task = build_task("dataset", **kwargs)
    assert [p.prompt for p in task.problems("train")] == [row["prompt"] for row in ROWS]
    assert [p.answer for p in task.problems("test")] == [row["answer"] for row in ROWS[:5]]
    # The same data is the same config (a resume composes it again), saved once.
    again = lit_ppo.compose("data=dataset", "logger=none", values={"data.task_kwargs": {"train_path": list(ROWS)}})
    assert again["data.task_kwargs.train_path"] == kwargs["train_path"]
    assert len(list((tmp_path / "cache" / "datasets").iterdir())) == 2
    with pytest.raises(ConfigError, match=r"^data.task_kwargs.train_path is a list: data given as a list must be rows"):
        lit_ppo.compose("data=dataset", values={"data.task_kwargs.train_path": ["a.jsonl"]})


@pytest.mark.parametrize("name", list(FOREIGN_KEYS))
def test_another_trainers_names_are_answered_with_lit_ppos(capsys, no_model_loading, name):
    trainer, setting, differs = FOREIGN_KEYS[name]
    expected = (f"{name} is not a key: {trainer}'s {name} has no lit_ppo key{differs}" if setting is None else
                f"{name} is not a key: {trainer}'s {name} is {setting}{differs}")
    assert error_of(capsys, f"{name}=1") == f"error: {expected}"
    with pytest.raises(ConfigError) as raised:
        lit_ppo.compose(values={name: 1})
    assert str(raised.value) == expected


def test_the_docs_table_holds_every_name_and_each_lit_ppo_setting_is_real(tmp_path):
    table = re.findall(r"^\| (TRL|verl) `([^`]+)` \| (?:`([^`]+)`|none) \| (.*) \|$", DOCS.read_text(), re.M)
    assert [(trainer, name, setting or None, f" ({differs})" if differs else "")
            for trainer, name, setting, differs in table] == [
        (trainer, name, setting, differs) for name, (trainer, setting, differs) in FOREIGN_KEYS.items()]
    table = [row for row in table if row[2]]  # a name that lit_ppo has no key for: none to compose
    known = set(_all_keys()) | {f"trainer.{k}" for k in TRAINER_KEYS}
    task_kwargs = set(lit_ppo.compose("data=dataset", values={"data.task_kwargs.train_path": "t.jsonl"})[
        "data.task_kwargs"])
    for _, _, setting, _ in table:
        key, eq, value = setting.partition("=")
        if key.startswith("data.task_kwargs."):
            assert key.removeprefix("data.task_kwargs.") in task_kwargs, setting
        elif eq and value != "DIR":  # a preset or a value: it composes
            lit_ppo.compose(setting)
        elif key.startswith("logger.init_args."):  # the logger's own arguments
            assert lit_ppo.compose(f"{key}=probe")[key] == "probe"
        else:
            assert key in known or key == "model", setting
