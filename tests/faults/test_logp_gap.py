"""rollout.max_logp_gap: an engine that samples from weights the trainer does not have stops the run,
with one line naming the engine, before any optimizer step on its batch."""

from __future__ import annotations

import warnings

import pytest
import torch

from lit_ppo.config import (
    GenerationConfig,
    ModelConfig,
    NormConfig,
    PPOActorConfig,
    RejectionSamplingConfig,
    RolloutConfig,
)
from lit_ppo.launch.compose import compose
from lit_ppo.rollout.engines.hf import HFEngine
from lit_ppo.training.datamodule import RolloutDataModule
from lit_ppo.training.guards import LogpGapCheck
from lit_ppo.training.module import LitPPO

from ..integration.conftest import FAST, REPO, run_cli
from ..integration.test_training import fit

GROUP = NormConfig(mean_level="group", std_level="group")


OWN_COPY = {"dtype": "float32"}
"""An HF engine with a weight copy of its own (a dtype given): one that samples from the trainer's own
weights, the synchronous default, cannot go stale."""


@pytest.fixture
def stale_engine(monkeypatch):
    """HFEngine whose weight push claims the new version but keeps the old weights; returns the
    weights each push was given (those of the trainer after that update). Use with ``OWN_COPY``."""
    pushed: list[dict[str, torch.Tensor]] = []

    def update_weights(self, weights, version):
        pushed.append({name: tensor.detach().clone() for name, tensor in weights})
        self.version = version

    monkeypatch.setattr(HFEngine, "update_weights", update_weights)
    return pushed


def make(tmp_path, recompute: bool, actor_kwargs: dict | None = None, **data_kwargs):
    # The entropy bonus makes every update move the weights, even when all advantages are zero.
    actor = PPOActorConfig(kl_ctl=0.0, ppo_n_minibatches=2, reward_norm=GROUP, recompute_logprob=recompute,
                           entropy_coef=0.01, optimizer={"lr": 1e-2}, **(actor_kwargs or {}))
    module = LitPPO(ModelConfig(cache_dir=str(tmp_path / "cache")), actor, algo="test")
    data = RolloutDataModule(batch_size=4, gconfig=GenerationConfig(n_samples=4, max_new_tokens=4,
                                                                    restrict_to_task_tokens=True), **data_kwargs)
    return module, data


@pytest.mark.parametrize("recompute", [True, False], ids=["recompute_pass", "first_minibatch"])
def test_a_stale_engine_stops_the_run_before_training_on_its_batch(tmp_path, stale_engine, recompute):
    module, data = make(tmp_path, recompute, engine_kwargs=OWN_COPY)
    with pytest.raises(RuntimeError) as error:
        fit(module, data, tmp_path, max_steps=3)
    message = str(error.value)
    assert "\n" not in message
    assert message.startswith("rollout=hf: behaviour log-probs differ from the trainer's by ")
    assert "(> rollout.max_logp_gap=auto: 0.001 in float32) at policy version 1: the engine is not sampling" in message
    # Iteration 0 trained and pushed; iteration 1 stopped before its first optimizer step.
    assert module.version == 1 and len(stale_engine) == 1
    for name, p in module.policy.named_parameters():
        assert torch.equal(p.detach(), stale_engine[0][name]), name


def test_null_disables_the_check(tmp_path, stale_engine):
    module, data = make(tmp_path, recompute=True, max_logp_gap=None, engine_kwargs=OWN_COPY)
    _, rec = fit(module, data, tmp_path, max_steps=2)
    assert module.version == 2 and rec.metrics[-1]["mismatch/logp_abs_diff"] > 1e-3


def test_the_hint_names_lower_precision():
    fp32 = LogpGapCheck(1e-3, "vllm", []).message(0.0123, 4)
    assert fp32.startswith("rollout=vllm: behaviour log-probs differ from the trainer's by 0.0123 nats/token "
                           "(> rollout.max_logp_gap=0.001) at policy version 4")
    assert "rollout.max_logp_gap=null" in fp32
    bf16 = LogpGapCheck(1e-3, "vllm", ["rollout.engine_kwargs.dtype=bfloat16"]).message(0.02, 1)
    assert "rollout.engine_kwargs.dtype=bfloat16 computes in lower precision" in bf16 and "\n" not in bf16
    assert "not sampling from the trainer's weights" not in bf16  # rounding, not a stale engine


def test_under_lower_precision_the_error_recommends_the_decoupled_loss_and_rejection_sampling():
    lower = ["trainer.precision=bf16-mixed"]
    on_policy = LogpGapCheck(1e-3, "hf", lower).message(0.03, 0)
    assert on_policy.startswith("rollout=hf: behaviour log-probs differ from the trainer's by 0.03 nats/token "
                                "(> rollout.max_logp_gap=0.001) at policy version 0: trainer.precision=bf16-mixed "
                                "computes in lower precision")
    for fix in ("use the decoupled loss with rejection sampling", "rejection=icepop or rejection=kpop",
                "actor.use_decoupled_loss=true and actor.rejection_sampling", "algo=icepop / algo=kpop",
                "raise rollout.max_logp_gap, e.g. 0.1, or set it to null"):
        assert fix in on_policy, fix
    decoupled = LogpGapCheck(1e-3, "hf", lower, decoupled=True).message(0.03, 0)
    assert "actor.use_decoupled_loss corrects for it; add rejection sampling, rejection=icepop" in decoupled
    both = LogpGapCheck(0.1, "hf", lower, decoupled=True, rejection=True).message(0.3, 0)
    assert both.endswith("(actor.use_decoupled_loss and actor.rejection_sampling correct for it: raise "
                         "rollout.max_logp_gap, e.g. 0.6, or set it to null)")
    assert all("\n" not in m for m in (on_policy, decoupled, both))


def test_under_lower_precision_a_gap_within_a_raised_limit_warns_once():
    check = LogpGapCheck(0.1, "hf", ["rollout.engine_kwargs.dtype=bfloat16"])
    assert check.warning(5e-4, 0) is None  # float32-level agreement
    warning = check.warning(0.006, 1)
    assert warning.startswith("rollout=hf: behaviour log-probs differ from the trainer's by 0.006 nats/token at "
                              "policy version 1 (rollout.engine_kwargs.dtype=bfloat16)")
    assert "use the decoupled loss with rejection sampling (rejection=icepop or rejection=kpop" in warning
    assert check.warning(0.006, 2) is None  # once per run
    assert LogpGapCheck(0.1, "hf", ["x"], decoupled=True).warning(0.006, 1) is None
    assert LogpGapCheck(0.1, "hf", []).warning(0.006, 1) is None  # float32: the limit is the only rule


BF16_ENGINE = {"dtype": "bfloat16"}


def test_a_bfloat16_engine_stops_the_run_at_a_float32_limit_with_the_recommendation(tmp_path):
    module, data = make(tmp_path, recompute=False, engine_kwargs=BF16_ENGINE, max_logp_gap=1e-3)
    with pytest.raises(RuntimeError) as error:
        fit(module, data, tmp_path, max_steps=2)
    message = str(error.value)
    assert message.startswith("rollout=hf: behaviour log-probs differ from the trainer's by ")
    assert ("(> rollout.max_logp_gap=0.001) at policy version 0: rollout.engine_kwargs.dtype=bfloat16 computes "
            "in lower precision") in message and "rejection=icepop" in message
    assert module.version == 0  # stopped before the first update


def test_auto_is_the_float32_limit_in_float32_and_the_lower_precision_one_otherwise():
    def check(precision="32-true", dtype="float32", **engine_kwargs):
        return LogpGapCheck.of(RolloutConfig(engine_kwargs=engine_kwargs), dtype, precision, PPOActorConfig())

    assert (check().limit, check().setting) == (1e-3, "auto: 0.001 in float32")
    for lower in (check("bf16-mixed"), check(dtype="bfloat16"), check(autocast="bfloat16"),
                  check(**BF16_ENGINE)):
        assert (lower.limit, lower.setting) == (0.1, "auto: 0.1 under lower precision"), lower
    assert ("(> rollout.max_logp_gap=auto: 0.1 under lower precision) at policy version 3: "
            "trainer.precision=bf16-mixed") in check("bf16-mixed").message(0.5, 3)


@pytest.mark.parametrize("decoupled", [False, True], ids=["grpo", "with_rejection_icepop"])
def test_a_bfloat16_engine_trains_at_the_default_limit_and_warns_without_the_decoupled_loss(tmp_path, decoupled):
    icepop = dict(use_decoupled_loss=True, rejection_sampling=RejectionSamplingConfig(  # what rejection=icepop sets
        level="token", action="mask", metric="ratio", lower=0.5, upper=5.0))
    module, data = make(tmp_path, recompute=False, actor_kwargs=icepop if decoupled else None,
                        engine_kwargs=BF16_ENGINE)  # max_logp_gap=auto: 0.1 under lower precision
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _, rec = fit(module, data, tmp_path, max_steps=2)
    assert module.version == 2
    gaps = [m["mismatch/logp_abs_diff"] for m in rec.metrics]
    assert all(1e-3 < g < 0.05 for g in gaps), gaps  # bf16 rounding: measured ~6e-3
    ours = [w for w in caught if "behaviour log-probs differ" in str(w.message)]
    assert len(ours) == (0 if decoupled else 1), [str(w.message) for w in ours]


def test_the_option_reaches_the_data_module_and_is_validated():
    assert compose(["rollout.max_logp_gap=0.05"])["data"]["max_logp_gap"] == 0.05
    assert compose(["rollout=vllm", "rollout.max_logp_gap=null"])["data"]["max_logp_gap"] is None
    assert compose([])["data"]["max_logp_gap"] == "auto"
    assert compose(["rollout=vllm"])["data"]["max_logp_gap"] == "auto"
    for bad in (0, -1e-3, "big", True):
        with pytest.raises(ValueError,
                           match=rf"^rollout.max_logp_gap={bad!r} is invalid: must be a (positive )?number"):
            RolloutDataModule(max_logp_gap=bad)


@pytest.mark.slow
def test_all_ranks_stop_together_when_one_engine_is_stale(tmp_path):
    # Only rank 1's engine misses the push: the gap is a mean over both ranks, so rank 0 stops too
    # (instead of waiting forever in the next collective).
    callbacks = "[{class_path: tests.faults.stale_engine.StaleEngine, init_args: {rank: 1}}]"
    args = ["fit", "algo=grpo", *FAST, "trainer=ddp", "actor.optimizer.lr=1e-2", "actor.entropy_coef=0.01",
            "trainer.max_steps=3", f"trainer.callbacks={callbacks}", "rollout.engine_kwargs.dtype=float32"]
    result = run_cli(args, tmp_path, timeout=300, env={"PYTHONPATH": str(REPO)})
    assert result.returncode != 0
    lines = [line for line in result.stderr.splitlines() if "rollout=hf: behaviour log-probs differ" in line]
    assert len(lines) == 2, result.stderr[-3000:]  # one per rank, with the same all-reduced gap
    assert lines[0].split("rollout=hf")[1] == lines[1].split("rollout=hf")[1]
    assert "at policy version 1: the engine is not sampling" in lines[0]
