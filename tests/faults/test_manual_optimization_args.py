"""Lightning's Trainer arguments that only its automatic optimization applies (gradient clipping and
accumulation) are refused before any model loads, exit code 2, naming lit_ppo's own setting; the values that
ask nothing of them pass."""

from __future__ import annotations

import pytest

from lit_ppo.launch.check import check_trainer_values
from tests.faults.test_bad_input import error_of

PREFIX = "cannot be honoured: lit_ppo steps its optimizers itself (Lightning's manual optimization), so it "


@pytest.mark.parametrize("override,expected", [
    ("trainer.gradient_clip_val=1.0", "trainer.gradient_clip_val=1.0 " + PREFIX + "clips with "
     "actor.optimizer.gradient_clipping (and critic.optimizer.gradient_clipping): set those"),
    ("trainer.accumulate_grad_batches=4", "trainer.accumulate_grad_batches=4 " + PREFIX + "splits each iteration's "
     "batch into actor.ppo_n_minibatches optimizer steps, each accumulated over micro-batches of at most "
     "actor.mb_max_tokens tokens: set those"),
    ("trainer.gradient_clip_algorithm=value", "trainer.gradient_clip_algorithm='value' " + PREFIX + "clips the "
     "global norm to actor.optimizer.gradient_clipping (and critic.optimizer.gradient_clipping): set those"),
])
def test_automatic_optimization_arguments_are_refused(capsys, no_model_loading, override, expected):
    assert error_of(capsys, override, "logger=none") == f"error: {expected}"
    # The values that ask nothing of automatic optimization pass.
    check_trainer_values({"gradient_clip_val": None, "accumulate_grad_batches": 1, "gradient_clip_algorithm": None})
    check_trainer_values({"gradient_clip_val": 0.0})
