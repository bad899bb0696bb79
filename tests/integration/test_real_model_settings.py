"""A model that is not the tiny one trains with a real model's settings (TRL's and verl's learning rate,
no entropy bonus) unless the user gives them, and a ``note:`` line says so once the config has passed its
checks."""

from __future__ import annotations

import pytest
import yaml

import lit_ppo
from lit_ppo.launch.compose import compose, real_model_note
from tests.faults.test_bad_input import error_of
from tests.integration.test_own_model import _tiny_dir


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return _tiny_dir(tmp_path_factory.mktemp("real-model"))


def _note(model_dir, *settings: str) -> str:
    return (f"note: model.source={model_dir.absolute()} is not the tiny model, so it trains with a real model's "
            f"settings (TRL's and verl's): {', '.join(settings)}; give these keys to choose others")


def test_a_model_directory_gets_a_real_model_learning_rate(model_dir, cli_here):
    tree = compose([f"model={model_dir}", "logger=none"])
    assert tree["model"]["actor"]["optimizer"]["lr"] == 1e-6
    assert tree["model"]["actor"]["entropy_coef"] == 0.0
    result = cli_here("fit", f"model={model_dir}", "logger=none", "--print_config")
    assert result.returncode == 0, result.stderr
    printed = yaml.safe_load(result.stdout)["model"]["actor"]
    assert (printed["optimizer"]["lr"], printed["entropy_coef"]) == (1e-6, 0.0)
    assert result.stderr.strip().splitlines() == [_note(model_dir, "actor.entropy_coef=0.0 (the tiny model's: 0.01)",
                                                        "actor.optimizer.lr=1e-06 (the tiny model's: 1.0e-3)")]
    shown = cli_here("fit", f"model={model_dir}", "--help").stdout
    assert "  actor.optimizer.lr=1.0e-06  (float)" in shown and "  actor.entropy_coef=0.0  (float)" in shown
    assert "trains with a real model's learning rate" in " ".join(shown.split())  # wrapped to the terminal's width


def test_given_settings_are_kept_and_not_noted(model_dir, capsys):
    tree = compose([f"model.source={model_dir}", "actor.optimizer.lr=3e-6", "actor.entropy_coef=0.001", "logger=none"])
    assert (tree["model"]["actor"]["optimizer"]["lr"], tree["model"]["actor"]["entropy_coef"]) == (3e-6, 0.001)
    assert real_model_note(tree) is None
    # Bad input is one line: the note waits for the config to pass its checks.
    assert error_of(capsys, f"model={model_dir}", "data.batch_size=0") == (
        "error: data.batch_size=0 is invalid: must be a positive integer")


def test_the_python_api_and_the_critic_follow_the_model(model_dir):
    tiny = lit_ppo.compose("algo=ppo", "logger=none")
    assert (tiny["actor.optimizer.lr"], tiny["actor.entropy_coef"], tiny["critic.optimizer.lr"]) == (1e-3, 0.01, 1e-3)
    assert real_model_note(tiny.tree) is None
    config = lit_ppo.compose("algo=ppo", "logger=none", values={"model.source": str(model_dir)})
    settings = (config["actor.optimizer.lr"], config["actor.entropy_coef"], config["critic.optimizer.lr"])
    assert settings == (1e-6, 0.0, 1e-5)
    config["actor.optimizer.lr"] = 2e-6  # set after composing: the user's choice, not noted
    assert real_model_note(config.tree) == _note(model_dir, "actor.entropy_coef=0.0 (the tiny model's: 0.01)",
                                                 "critic.optimizer.lr=1e-05 (the tiny model's: 1.0e-3)")


def test_a_directory_lit_ppo_wrote_keeps_its_base_models_settings(model_dir, tmp_path):
    """An export or an sft's ``model/`` records the model it descends from: one made from the tiny model trains
    with the tiny model's settings, one made from SmolLM2 with a real model's (``lit_ppo.config.model``)."""
    import json
    import shutil

    from lit_ppo.config.model import MODEL_RECORD

    made = {}
    for base in ("tiny", "smollm2"):
        made[base] = tmp_path / f"from-{base}"
        shutil.copytree(model_dir, made[base])
        (made[base] / MODEL_RECORD).write_text(json.dumps({"base_model": base}))
    tiny = compose([f"model={made['tiny']}", "algo=ppo", "logger=none"])
    assert (tiny["model"]["actor"]["optimizer"]["lr"], tiny["model"]["actor"]["entropy_coef"],
            tiny["model"]["critic"]["optimizer"]["lr"]) == (1e-3, 0.01, 1e-3)
    assert real_model_note(tiny) is None
    real = compose([f"model={made['smollm2']}", "logger=none"])
    assert (real["model"]["actor"]["optimizer"]["lr"], real["model"]["actor"]["entropy_coef"]) == (1e-6, 0.0)
    assert real_model_note(real) == _note(made["smollm2"], "actor.entropy_coef=0.0 (the tiny model's: 0.01)",
                                          "actor.optimizer.lr=1e-06 (the tiny model's: 1.0e-3)")
