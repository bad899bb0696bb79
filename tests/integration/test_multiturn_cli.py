"""Multi-turn training end to end on the calculator task: the real CLI (subprocess) with turn-level GAE
under PPO (critic) and GRPO (dynamic lambda), config errors, and an in-process run whose training
batches hold multi-turn episodes."""

from __future__ import annotations

import lightning as L
import pytest
import torch

from lit_ppo.__main__ import main
from lit_ppo.algos import validate_turn_ids
from lit_ppo.config import GenerationConfig, PPOActorConfig, PPOCriticConfig
from lit_ppo.models import build_tiny_tokenizer
from lit_ppo.rollout.episodes.multi_turn import MultiTurnWorkflow

from .conftest import FAST, run_dir
from .test_training import fit, make

SMALL = ["data=calculator", "gconfig.max_new_tokens=8", "actor.gae_timestep_unit=turn"]
DYNAMIC_LAMBDA = ["actor.gae_lambda=lit_ppo.algos.lambda_fn.relative_position_gae_lambda",
                  "actor.gae_lambda_kwargs.q=0.5"]   # no '+' needed: the CLI adds it for a field of actor


@pytest.mark.slow
@pytest.mark.parametrize("algo, extra", [("ppo", []), ("grpo", DYNAMIC_LAMBDA)])
def test_calculator_trains_two_iterations_from_the_cli(cli, algo, extra):
    result = cli("fit", f"algo={algo}", *FAST, *SMALL, *extra)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "`Trainer.fit` stopped: `max_steps=2` reached." in result.stderr + result.stdout
    config = (run_dir(cli.cwd) / "config.yaml").read_text()
    assert "task: calculator" in config and "max_turns: 3" in config and "gae_timestep_unit: turn" in config
    if algo == "ppo":
        assert "critic: null" not in config
    else:
        assert "gae_lambda: lit_ppo.algos.lambda_fn.relative_position_gae_lambda" in config
        assert "gae_lambda_kwargs:\n      q: 0.5" in config


@pytest.mark.parametrize("args, expected", [
    (["data.max_turns=0"], "data.max_turns=0 is invalid: must be a positive integer"),
    (["data.turn_discount=1.5"], "data.turn_discount=1.5 is invalid: must be a number in (0, 1]"),
    (["data.task_kwargs.tool_credit=2"], "tool_credit=2 is invalid: must be in [0, 1)"),
])
def test_bad_multi_turn_settings_fail_before_any_model_loads(capsys, monkeypatch, args, expected):
    def refuse(*a, **k):
        raise AssertionError("a model was loaded before the config error was reported")

    monkeypatch.setattr("lit_ppo.models.policy.load_causal_lm", refuse)
    code = main(["fit", "data=calculator", *args])
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert len(err.splitlines()) == 1 and expected in err, err


class BatchRecorder(L.Callback):
    """Every batch the training step consumed."""

    def __init__(self):
        self.batches = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.batches.append(pl_module.last_batch)


@pytest.mark.slow
@pytest.mark.parametrize("critic", [PPOCriticConfig(optimizer={"lr": 1e-3}), None])
def test_training_batches_hold_multi_turn_episodes(tmp_path, critic):
    """The real HF engine on the tiny model: the calculator's 'wrong, try again' replies make episodes
    run several turns, and those batches reach the turn-level update."""
    actor = PPOActorConfig(kl_ctl=0.0, ppo_n_minibatches=1, gae_timestep_unit="turn", optimizer={"lr": 1e-3},
                           gae_lambda="lit_ppo.algos.lambda_fn.relative_position_gae_lambda",
                           gae_lambda_kwargs={"q": 0.5})
    module, data = make(tmp_path, actor=actor, critic=critic, task="calculator",
                        task_kwargs={"num_train": 64, "num_test": 4}, max_turns=3, turn_discount=0.5, batch_size=2,
                        gconfig=GenerationConfig(n_samples=4, max_new_tokens=8, restrict_to_task_tokens=True))
    recorder = BatchRecorder()
    _, rec = fit(module, data, tmp_path, max_steps=2, callbacks=[recorder])
    assert isinstance(data.workflow, MultiTurnWorkflow) and data.workflow.max_turns == 3
    assert len(recorder.batches) == 2
    user = build_tiny_tokenizer().convert_tokens_to_ids("<|user|>")
    for batch in recorder.batches:
        validate_turn_ids(batch.turn_ids, batch.loss_mask)
        turns = batch.turn_ids.max(1).values
        assert (turns > 0).any() and int(turns.max()) <= 2, turns
        for b in torch.nonzero(turns > 0).flatten().tolist():
            # a later turn follows a feedback turn, which is context: a <|user|> token after the
            # first generated token, with loss mask 0 and turn id -1
            first = int(batch.loss_mask[b].nonzero()[0])
            feedback = (batch.input_ids[b] == user).nonzero().flatten()
            feedback = feedback[feedback > first]
            assert len(feedback) == int(turns[b])
            assert not batch.loss_mask[b, feedback].any() and (batch.turn_ids[b, feedback] == -1).all()
    for m in rec.metrics:
        assert torch.isfinite(torch.tensor(m["actor/loss"]))
        if critic is not None:
            assert "critic/loss" in m and torch.isfinite(torch.tensor(m["critic/loss"]))
