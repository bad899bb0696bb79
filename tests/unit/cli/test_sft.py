"""``python -m lit_ppo sft --help``: the values the command would train with, composed as the run composes them
(the model's learning rate included), not only the defaults of the sft keys."""

from __future__ import annotations

import re
from dataclasses import fields

from lit_ppo.__main__ import main
from lit_ppo.config import OptimizerConfig


def _help(capsys, *args: str) -> str:
    assert main(["sft", *args, "--help"]) == 0
    return capsys.readouterr().out


def _values(text: str) -> dict[str, str]:
    return dict(re.findall(r"^  ((?:model|data|actor\.optimizer|sft)\.\w+)=(\S+)", text, re.M))


def test_help_shows_the_model_task_and_optimizer_it_trains_with(capsys):
    values = _values(_help(capsys))
    # The tiny model's preset learning rate (1e-3), the other optimizer keys at OptimizerConfig's defaults.
    assert values["model.source"] == "tiny" and values["data.task"] == "arithmetic"
    assert values["actor.optimizer.lr"] == "0.001"
    for field in fields(OptimizerConfig):
        if field.name != "lr":
            assert values[f"actor.optimizer.{field.name}"] == repr(field.default), field.name
    assert values["sft.epochs"] == "1" and values["sft.batch_size"] == "8"


def test_help_shows_the_values_of_the_overrides_given(capsys):
    values = _values(_help(capsys, "model=smollm2", "actor.optimizer.warmup_steps=5", "sft.epochs=3", "data=gsm8k"))
    # The smollm2 preset's learning rate (2e-6), as fit composes it for SmolLM2.
    assert values["model.source"] == "smollm2" and values["data.task"] == "gsm8k"
    assert (values["actor.optimizer.lr"], values["actor.optimizer.warmup_steps"]) == ("2e-06", "5")
    assert values["sft.epochs"] == "3"


def test_help_of_a_task_with_a_required_value_shows_it(capsys):
    values = _values(_help(capsys, "data=dataset"))
    assert values["data.task"] == "dataset" and values["actor.optimizer.lr"] == "0.001"


def test_help_for_overrides_that_do_not_compose_is_one_line(capsys):
    assert main(["sft", "algo=nope", "--help"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("error: algo=nope is invalid"), line
