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
