"""rollout.max_logp_gap: an engine that samples from weights the trainer does not have stops the run,
with one line naming the engine, before any optimizer step on its batch."""

from __future__ import annotations

import pytest
import torch

from lit_ppo.cli import compose
from lit_ppo.config import GenerationConfig, NormConfig, PPOActorConfig
from lit_ppo.data import RolloutDataModule
from lit_ppo.module import LitPPO, ModelConfig, _LogpGapCheck
from lit_ppo.rollout.hf_engine import HFEngine

from ..integration.conftest import FAST, REPO, run_cli
from ..integration.test_training import fit

GROUP = NormConfig(mean_level="group", std_level="group")


@pytest.fixture
def stale_engine(monkeypatch):
    """HFEngine whose weight push claims the new version but keeps the old weights; returns the
    weights each push was given (those of the trainer after that update)."""
    pushed: list[dict[str, torch.Tensor]] = []

    def update_weights(self, weights, version):
        pushed.append({name: tensor.detach().clone() for name, tensor in weights})
        self.version = version

    monkeypatch.setattr(HFEngine, "update_weights", update_weights)
    return pushed


def make(tmp_path, recompute: bool, **data_kwargs):
    # The entropy bonus makes every update move the weights, even when all advantages are zero.
    actor = PPOActorConfig(kl_ctl=0.0, ppo_n_minibatches=2, reward_norm=GROUP, recompute_logprob=recompute,
                           entropy_coef=0.01, optimizer={"lr": 1e-2})
    module = LitPPO(ModelConfig(cache_dir=str(tmp_path / "cache")), actor, algo="test")
    data = RolloutDataModule(batch_size=4, gconfig=GenerationConfig(n_samples=4, max_new_tokens=4,
                                                                    restrict_to_task_tokens=True), **data_kwargs)
    return module, data


@pytest.mark.parametrize("recompute", [True, False], ids=["recompute_pass", "first_minibatch"])
def test_a_stale_engine_stops_the_run_before_training_on_its_batch(tmp_path, stale_engine, recompute):
    module, data = make(tmp_path, recompute)
    with pytest.raises(RuntimeError) as error:
        fit(module, data, tmp_path, max_steps=3)
    message = str(error.value)
    assert "\n" not in message
    assert message.startswith("rollout=hf: behaviour log-probs differ from the trainer's by ")
    assert "(> rollout.max_logp_gap=0.001) at policy version 1: the engine is not sampling" in message
    # Iteration 0 trained and pushed; iteration 1 stopped before its first optimizer step.
    assert module.version == 1 and len(stale_engine) == 1
    for name, p in module.policy.named_parameters():
        assert torch.equal(p.detach(), stale_engine[0][name]), name


def test_null_disables_the_check(tmp_path, stale_engine):
    module, data = make(tmp_path, recompute=True, max_logp_gap=None)
    _, rec = fit(module, data, tmp_path, max_steps=2)
    assert module.version == 2 and rec.metrics[-1]["mismatch/logp_abs_diff"] > 1e-3


def test_the_hint_names_lower_precision():
    fp32 = _LogpGapCheck(1e-3, "vllm", []).message(0.0123, 4)
    assert fp32.startswith("rollout=vllm: behaviour log-probs differ from the trainer's by 0.0123 nats/token "
                           "(> rollout.max_logp_gap=0.001) at policy version 4")
    assert "rollout.max_logp_gap=null" in fp32
    bf16 = _LogpGapCheck(1e-3, "vllm", ["rollout.engine_kwargs.dtype=bfloat16"]).message(0.02, 1)
    assert "rollout.engine_kwargs.dtype=bfloat16 computes in lower precision" in bf16 and "\n" not in bf16


def test_the_option_reaches_the_data_module_and_is_validated():
    assert compose(["rollout.max_logp_gap=0.05"])["data"]["max_logp_gap"] == 0.05
    assert compose(["rollout=vllm", "rollout.max_logp_gap=null"])["data"]["max_logp_gap"] is None
    assert compose([])["data"]["max_logp_gap"] == 0.001
    for bad in (0, -1e-3, "big", True):
        with pytest.raises(ValueError, match=rf"^rollout.max_logp_gap={bad!r} is invalid: must be a positive number"):
            RolloutDataModule(max_logp_gap=bad)


@pytest.mark.slow
def test_all_ranks_stop_together_when_one_engine_is_stale(tmp_path):
    # Only rank 1's engine misses the push: the gap is a mean over both ranks, so rank 0 stops too
    # (instead of waiting forever in the next collective).
    callbacks = "[{class_path: tests.faults.stale_engine.StaleEngine, init_args: {rank: 1}}]"
    args = ["fit", "algo=grpo", *FAST, "trainer=ddp", "actor.optimizer.lr=1e-2", "actor.entropy_coef=0.01",
            "trainer.max_steps=3", f"trainer.callbacks={callbacks}"]
    result = run_cli(args, tmp_path, timeout=300, env={"PYTHONPATH": str(REPO)})
    assert result.returncode != 0
    lines = [line for line in result.stderr.splitlines() if "rollout=hf: behaviour log-probs differ" in line]
    assert len(lines) == 2, result.stderr[-3000:]  # one per rank, with the same all-reduced gap
    assert lines[0].split("rollout=hf")[1] == lines[1].split("rollout=hf")[1]
    assert "at policy version 1: the engine is not sampling" in lines[0]
