"""Inputs a user porting a job tries, each answered with one line: a plain dict given to ``lit_ppo.fit``, a
sampling setting the trainer's log-probs cannot follow (``repetition_penalty``), and a process rank left in
the environment by another launch for a one-process run."""

from __future__ import annotations

import pytest

import lit_ppo
from lit_ppo.errors import ConfigError
from tests.faults.test_bad_input import error_of
from tests.integration.conftest import run_cli


def test_fit_of_a_plain_dict_is_one_clear_error():
    with pytest.raises(TypeError) as raised:
        lit_ppo.fit({"model": {}, "data": {}, "trainer": {}})
    assert str(raised.value) == ("lit_ppo.fit takes the RunConfig that lit_ppo.compose(...) returns, not a dict: "
                                 "lit_ppo.fit(lit_ppo.compose('key=value', values={...}))")


@pytest.mark.parametrize("key,what", [
    ("gconfig.repetition_penalty", "repetition_penalty (a repetition penalty reweights each token by the tokens its "
                                   "sequence holds already)"),
    ("min_p", "min_p (min-p sampling cuts each token's support relative to its most likely token)"),
])
def test_sampling_settings_the_log_probs_cannot_follow(capsys, no_model_loading, key, what):
    expected = (f"{key} is not a key: lit_ppo does not sample with {what}: the trainer's log-probs do not follow it, "
                f"so the importance ratio would be biased; gconfig.temperature, top_k and top_p are followed exactly")
    assert error_of(capsys, f"{key}=1.1") == f"error: {expected}"
    with pytest.raises(ConfigError, match=r"^" + key.replace(".", r"\.") + " is not a key: lit_ppo does not sample"):
        lit_ppo.compose(values={key: 1.1})


def test_a_stale_rank_in_the_environment_of_a_one_process_run(tmp_path, capsys, monkeypatch, no_model_loading):
    result = run_cli(["fit", "logger=none"], tmp_path, env={"RANK": "1"})
    assert result.returncode == 2, result.stderr[-3000:]
    assert result.stderr.strip().splitlines() == [
        "error: RANK=1 in the environment, left by another launch, would make this one-process run "
        "(trainer.devices=1, trainer.num_nodes=1) a rank other than 0, which Lightning keeps from logging and "
        "lit_ppo from writing its run: unset RANK"]
    assert not (tmp_path / "runs").exists()
    monkeypatch.setenv("LOCAL_RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "4")
    assert error_of(capsys, "logger=none") == (
        "error: LOCAL_RANK=2, WORLD_SIZE=4 in the environment, left by another launch, would make this one-process "
        "run (trainer.devices=1, trainer.num_nodes=1) a rank other than 0, which Lightning keeps from logging and "
        "lit_ppo from writing its run: unset LOCAL_RANK WORLD_SIZE")


@pytest.mark.parametrize("key,answer", [
    ("actor_rollout_ref.actor.kl_loss_coef", "verl's actor_rollout_ref.actor.kl_loss_coef is actor.kl_loss_coef "
                                             "(the KL term in the loss; verl's kl_loss_type low_var_kl is "
                                             "actor.kl_loss_estimator=k3, the default, without verl's clamp "
                                             "at 10)"),
    ("actor_rollout_ref.actor.use_kl_loss", "verl's actor_rollout_ref.actor.use_kl_loss is actor.kl_loss_coef (> 0 "
                                            "turns the KL term of the loss on; it has no switch of its own)"),
    ("algorithm.kl_ctrl.kl_coef", "verl's algorithm.kl_ctrl.kl_coef is actor.kl_ctl (the KL penalty in the reward; "
                                  "verl's kl_penalty kl is actor.kl_estimator=k1, the default, clamped here to "
                                  "[-10, 10])"),
    ("algorithm.use_kl_in_reward", "verl's algorithm.use_kl_in_reward is actor.kl_ctl (> 0 puts the KL penalty in "
                                   "the reward; it has no switch of its own)"),
    ("actor_rollout_ref.model.path", "verl's actor_rollout_ref.model.path is model=DIR (a local model directory or a "
                                     "hub id in the local cache)"),
    ("output_dir", "TRL's output_dir is trainer.default_root_dir (runs by default; each run writes a directory of "
                   "its own under it, in a folder of its experiment)"),
    ("trainer.total_epochs", "verl's trainer.total_epochs is trainer.max_steps (lit_ppo counts RL iterations, each "
                             "data.batch_size prompts, not passes over the data)"),
    ("data.max_prompt_length", "verl's data.max_prompt_length has no lit_ppo key (lit_ppo samples every prompt "
                               "whole, neither cut nor dropped for its length; gconfig.max_new_tokens bounds the "
                               "completion)"),
    # verl's dotted name typed without its section
    ("max_prompt_length", "verl's data.max_prompt_length has no lit_ppo key (lit_ppo samples every prompt whole, "
                          "neither cut nor dropped for its length; gconfig.max_new_tokens bounds the completion)"),
    ("total_epochs", "verl's trainer.total_epochs is trainer.max_steps (lit_ppo counts RL iterations, each "
                     "data.batch_size prompts, not passes over the data)"),
    ("actor_rollout_ref.actor.optim.lr", "verl's actor_rollout_ref.actor.optim.lr is actor.optimizer.lr"),
    ("actor_rollout_ref.rollout.n", "verl's actor_rollout_ref.rollout.n is gconfig.n_samples"),
    ("data.max_response_length", "verl's data.max_response_length is gconfig.max_new_tokens"),
    ("data.train_batch_size", "verl's data.train_batch_size is data.batch_size"),
    ("actor_rollout_ref.actor.ppo_mini_batch_size", "verl's actor_rollout_ref.actor.ppo_mini_batch_size is "
                                                    "actor.ppo_n_minibatches (a count of minibatches, not a size: "
                                                    "data.train_batch_size / ppo_mini_batch_size)"),
    ("actor_rollout_ref.actor.clip_ratio", "verl's actor_rollout_ref.actor.clip_ratio is actor.eps_clip"),
    ("actor_rollout_ref.actor.clip_ratio_high", "verl's actor_rollout_ref.actor.clip_ratio_high is "
                                                "actor.eps_clip_higher"),
    ("algorithm.adv_estimator", "verl's algorithm.adv_estimator is algo=grpo (or ppo, rloo, ...: a preset)"),
    ("trainer.total_training_steps", "verl's trainer.total_training_steps is trainer.max_steps"),
    ("beta", "TRL's beta is actor.kl_loss_coef (TRL's KL term is in the loss, k3; actor.kl_ctl puts it in the "
             "reward)"),
])
def test_verls_names_and_trls_are_answered_with_the_key_of_the_same_meaning(capsys, no_model_loading, key, answer):
    # The command line's check, as typed, and lit_ppo.compose: the same line, never a "did you mean" of
    # another meaning (trainer.total_epochs is not trainer.max_epochs, max_prompt_length not eval.max_problems).
    assert error_of(capsys, f"{key}=1") == f"error: {key} is not a key: {answer}"
    with pytest.raises(ConfigError) as raised:
        lit_ppo.compose(values={key: 1})
    assert str(raised.value) == f"{key} is not a key: {answer}"


def test_every_foreign_name_of_a_command_is_answered_in_one_line(capsys, no_model_loading):
    assert error_of(capsys, "algo=grpo", "learning_rate=1e-6", "gconfig.n_samples=4",
                    "actor_rollout_ref.actor.kl_loss_coef=0.001", "+algorithm.kl_ctrl.kl_coef=0.01") == (
        "error: learning_rate, actor_rollout_ref.actor.kl_loss_coef and algorithm.kl_ctrl.kl_coef are not keys: "
        "TRL's learning_rate is actor.optimizer.lr; verl's actor_rollout_ref.actor.kl_loss_coef is actor.kl_loss_coef "
        "(the KL term in the loss; verl's kl_loss_type low_var_kl is actor.kl_loss_estimator=k3, the default, "
        "without verl's clamp at 10); "
        "verl's algorithm.kl_ctrl.kl_coef is actor.kl_ctl (the KL penalty in the reward; verl's kl_penalty kl is "
        "actor.kl_estimator=k1, the default, clamped here to [-10, 10])")
    assert error_of(capsys, "num_generations=8", "trainer.total_epochs=3") == (
        "error: num_generations and trainer.total_epochs are not keys: TRL's num_generations is gconfig.n_samples; "
        "verl's trainer.total_epochs is trainer.max_steps (lit_ppo counts RL iterations, each data.batch_size "
        "prompts, not passes over the data)")
    with pytest.raises(ConfigError, match=r"^beta and data\.train_batch_size are not keys: TRL's beta is "):
        lit_ppo.compose("beta=0.04", values={"data.train_batch_size": 8})
