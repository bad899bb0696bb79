"""LitPPO's evaluation before training (eval.before_training), on a stand-in for the trainer: whether it runs
Lightning's validation loop before the first iteration. That it scores the untrained policy at iteration 0 and
leaves the training as it was is checked on the demo run (tests/integration/test_evaluation.py,
tests/integration/test_sync_path_unchanged.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from lit_ppo.config import EvalConfig, ModelConfig
from lit_ppo.training.module import LitPPO


class ValidationLoop:
    """Records each run, and whether the trainer was validating then."""

    def __init__(self, trainer):
        self.trainer = trainer
        self.runs: list[bool] = []

    def run(self):
        self.runs.append(self.trainer.validating)


@pytest.fixture(scope="module")
def module(tmp_path_factory):
    return LitPPO(ModelConfig(cache_dir=str(tmp_path_factory.mktemp("cache"))), {"kl_ctl": 0.0}, algo="test")


def train_start(module, *, global_step: int = 0, before_training: bool = True, validation: bool = True) -> list[bool]:
    """The validation loop's runs when a fit at ``global_step`` starts its training loop."""
    trainer = SimpleNamespace(global_step=global_step, enable_validation=validation, validating=False, training=False,
                              datamodule=SimpleNamespace(eval=EvalConfig(before_training=before_training)))
    loop = ValidationLoop(trainer)
    trainer.fit_loop = SimpleNamespace(epoch_loop=SimpleNamespace(val_loop=loop))
    module._trainer = trainer
    try:
        module.on_train_start()
    finally:
        module._trainer = None
    assert trainer.training == bool(loop.runs)  # back to training after it
    return loop.runs


def test_a_fresh_fit_scores_the_untrained_policy_once_before_its_first_iteration(module):
    assert train_start(module) == [True]  # as Lightning runs every evaluation: validating


def test_no_evaluation_before_training_when_resumed_switched_off_or_without_validation(module):
    assert train_start(module, global_step=20) == []  # resumed: its iteration 0 was scored by the run it continues
    assert train_start(module, before_training=False) == []
    assert train_start(module, validation=False) == []  # no test split, eval.max_problems=0, limit_val_batches=0


def test_eval_before_training_is_on_by_default_and_a_boolean():
    assert EvalConfig().before_training is True
    with pytest.raises(ValueError, match=r"^eval\.before_training='yes' is invalid: must be true or false"):
        EvalConfig(before_training="yes")
