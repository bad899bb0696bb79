"""A non-finite loss or gradient skips the optimizer step; too many in a row stop the run."""

from __future__ import annotations

import copy
import math

import lightning as L
import pytest
import torch

from lit_ppo.algos.surrogates import POLICY_LOSSES, ppo_clip_surrogate
from lit_ppo.config import EvalConfig, GenerationConfig, ModelConfig, NormConfig, PPOActorConfig, PPOCriticConfig
from lit_ppo.training.datamodule import RolloutDataModule
from lit_ppo.training.module import LitPPO

GROUP = NormConfig(mean_level="group", std_level="group")


@pytest.fixture(scope="module")
def model_cache(tmp_path_factory) -> str:
    """One tiny-model cache for the module's runs (the model is built once)."""
    return str(tmp_path_factory.mktemp("model_cache"))


class Faults:
    """Which fault to inject in the iteration that trains policy version k: ``plan[k]``."""

    def __init__(self):
        self.plan: dict[int, str] = {}
        self.module: LitPPO | None = None

    def now(self) -> str | None:
        return self.plan.get(self.module.version)


@pytest.fixture
def faults():
    """Registers the policy loss 'faulty': PPO clip, except in the planned iterations:
    'nan' (NaN loss and gradients) or 'nan_loss' (NaN loss, finite gradients)."""
    state = Faults()

    def faulty(ratio, advantages, cfg):
        loss, stats = ppo_clip_surrogate(ratio, advantages, cfg)
        if state.now() == "nan":
            loss = loss * math.nan
        elif state.now() == "nan_loss":
            loss = loss + ratio.detach() * math.nan  # the value is NaN, the gradient is PPO's
        return loss, stats

    POLICY_LOSSES.register("faulty")(faulty)
    yield state
    POLICY_LOSSES.unregister("faulty")


def inf_gradient_hook(state: Faults, fault: str):
    """A gradient hook that makes the parameter's gradient +inf in the iterations planned as ``fault``."""
    return lambda grad: torch.full_like(grad, math.inf) if state.now() == fault else grad


class Snapshots(L.Callback):
    """Per iteration: weights and optimizer states before and after, and the logged metrics."""

    def __init__(self):
        self.before: list[dict] = []
        self.after: list[dict] = []
        self.metrics: list[dict[str, float]] = []

    @staticmethod
    def take(trainer, pl_module) -> dict:
        return {"policy": copy.deepcopy(pl_module.policy.state_dict()),
                "critic": copy.deepcopy(pl_module.critic.state_dict()) if pl_module.critic is not None else None,
                "optimizers": [copy.deepcopy(o.state_dict()) for o in trainer.optimizers]}

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.before.append(self.take(trainer, pl_module))

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.after.append(self.take(trainer, pl_module))
        self.metrics.append({k: float(v) for k, v in trainer.callback_metrics.items()})


def make(model_cache: str, faults: Faults, critic: PPOCriticConfig | None = None, **actor_kwargs):
    actor = PPOActorConfig(**{"kl_ctl": 0.0, "ppo_n_minibatches": 1, "reward_norm": GROUP, "optimizer": {"lr": 1e-2},
                              **actor_kwargs})
    module = LitPPO(ModelConfig(cache_dir=model_cache), actor, critic, algo="test")
    faults.module = module
    # No evaluation before training: these fits look at the updates (it would cost 2-5 s a fit).
    data = RolloutDataModule(batch_size=4, gconfig=GenerationConfig(n_samples=4, max_new_tokens=4,
                                                                    restrict_to_task_tokens=True),
                             eval=EvalConfig(before_training=False))
    return module, data


def fit(tmp_path, module, data, max_steps: int):
    snaps = Snapshots()
    trainer = L.Trainer(accelerator="cpu", devices=1, max_steps=max_steps, logger=False, enable_progress_bar=False,
                        enable_model_summary=False, enable_checkpointing=False, default_root_dir=tmp_path,
                        callbacks=[snaps])
    trainer.fit(module, datamodule=data)
    return trainer, snaps


def equal(a, b) -> bool:
    """Exact equality of nested state dicts (tensors bit for bit)."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(equal(x, y) for x, y in zip(a, b))
    return a == b


def adam_steps(snapshot: dict, index: int = 0) -> set[float]:
    return {float(s["step"]) for s in snapshot["optimizers"][index]["state"].values()}


def all_finite(state_dict: dict) -> bool:
    return all(bool(torch.isfinite(v).all()) for v in state_dict.values() if v.is_floating_point())


def test_nan_loss_skips_exactly_that_step_and_the_run_goes_on(tmp_path, faults):
    module, data = make(tmp_path, faults, policy_loss="faulty", max_skipped_steps=2)
    faults.plan = {1: "nan", 3: "nan"}  # never two in a row: the limit of 2 is not reached
    with pytest.warns(UserWarning, match=r"actor optimizer step skipped at policy version 1 \(minibatch 1 of 1\): "
                                         r"loss nan, gradient norm nan"):
        trainer, snaps = fit(tmp_path, module, data, max_steps=4)
    # Skipped iterations still count: max_steps, the global step and the version count iterations.
    assert trainer.global_step == 4 and module.version == 4 and data.engine.version == 4
    assert [m["actor/skipped_steps"] for m in snaps.metrics] == [0.0, 1.0, 0.0, 1.0]
    for k in (1, 3):  # no update at all: weights and AdamW state (step count, moments) bit for bit
        assert equal(snaps.after[k]["policy"], snaps.before[k]["policy"])
        assert equal(snaps.after[k]["optimizers"], snaps.before[k]["optimizers"])
    for k in (0, 2):
        assert not equal(snaps.after[k]["policy"], snaps.before[k]["policy"])
    assert [adam_steps(s) for s in snaps.after] == [{1.0}, {1.0}, {2.0}, {2.0}]
    # The metrics describe the updates made: the skipped step's NaN loss is not averaged in.
    assert all(math.isfinite(m["actor/loss"]) and math.isfinite(m["actor/grad_norm"]) for m in snaps.metrics)
    assert all_finite(module.policy.state_dict())
    # The engine samples with the (unchanged) weights after a skipped step.
    for name, p in module.policy.named_parameters():
        assert torch.equal(dict(data.engine.model.named_parameters())[name], p.detach())


def test_nan_loss_with_finite_gradients_is_skipped_too(tmp_path, faults):
    module, data = make(tmp_path, faults, policy_loss="faulty")
    faults.plan = {0: "nan_loss"}
    with pytest.warns(UserWarning, match="actor optimizer step skipped"):
        trainer, snaps = fit(tmp_path, module, data, max_steps=2)
    assert [m["actor/skipped_steps"] for m in snaps.metrics] == [1.0, 0.0]
    assert equal(snaps.after[0]["policy"], snaps.before[0]["policy"])
    assert snaps.after[0]["optimizers"][0]["state"] == {}  # AdamW never stepped
    assert trainer.global_step == 2 and adam_steps(snaps.after[1]) == {1.0}


def test_inf_gradient_skips_the_step_of_its_minibatch_only(tmp_path, faults):
    module, data = make(tmp_path, faults, ppo_n_minibatches=2)
    faults.plan = {0: "inf"}
    module.policy.get_output_embeddings().weight.register_hook(inf_gradient_hook(faults, "inf"))
    with pytest.warns(UserWarning, match=r"gradient norm inf"):
        trainer, snaps = fit(tmp_path, module, data, max_steps=2)
    assert [m["actor/skipped_steps"] for m in snaps.metrics] == [2.0, 0.0]
    assert equal(snaps.after[0]["policy"], snaps.before[0]["policy"])
    assert equal(snaps.after[0]["optimizers"], snaps.before[0]["optimizers"])
    assert adam_steps(snaps.after[1]) == {2.0}  # iteration 2's two minibatches
    assert math.isfinite(snaps.metrics[1]["actor/grad_norm"]) and trainer.global_step == 2


@pytest.mark.slow
def test_critic_step_is_skipped_alone(tmp_path, faults):
    critic = PPOCriticConfig(ppo_n_minibatches=1, optimizer={"lr": 1e-2})
    module, data = make(tmp_path, faults, critic=critic)
    faults.plan = {0: "inf"}
    module.critic.head.weight.register_hook(inf_gradient_hook(faults, "inf"))
    with pytest.warns(UserWarning, match="critic optimizer step skipped at policy version 0"):
        trainer, snaps = fit(tmp_path, module, data, max_steps=2)
    assert [m["critic/skipped_steps"] for m in snaps.metrics] == [1.0, 0.0]
    assert [m["actor/skipped_steps"] for m in snaps.metrics] == [0.0, 0.0]
    assert equal(snaps.after[0]["critic"], snaps.before[0]["critic"])
    assert equal(snaps.after[0]["optimizers"][1], snaps.before[0]["optimizers"][1])
    assert not equal(snaps.after[0]["policy"], snaps.before[0]["policy"])  # the actor did train
    assert not equal(snaps.after[1]["critic"], snaps.before[1]["critic"])
    assert trainer.global_step == 2 and module.version == 2


def test_consecutive_skipped_iterations_stop_the_run_in_one_line(tmp_path, faults):
    module, data = make(tmp_path, faults, policy_loss="faulty", max_skipped_steps=2)
    initial = copy.deepcopy(module.policy.state_dict())
    faults.plan = {k: "nan" for k in range(10)}
    trainer = L.Trainer(accelerator="cpu", devices=1, max_steps=5, logger=False, enable_progress_bar=False,
                        enable_model_summary=False, enable_checkpointing=False, default_root_dir=tmp_path)
    with pytest.warns(UserWarning, match="skipped"), pytest.raises(RuntimeError) as error:
        trainer.fit(module, datamodule=data)
    assert str(error.value) == ("2 consecutive iterations skipped optimizer steps for a non-finite loss or gradient "
                                "(actor.max_skipped_steps=2), the last at policy version 1: check the rewards, the "
                                "learning rate and the loss")
    assert trainer.global_step == 2
    assert equal(module.policy.state_dict(), initial)


def test_max_skipped_steps_is_validated():
    assert PPOActorConfig().max_skipped_steps == 3
    for bad, allowed in ((0, "a positive integer"), (-1, "a positive integer"), (1.5, "an integer"),
                         (True, "an integer"), (None, "an integer")):
        with pytest.raises(ValueError, match=rf"^max_skipped_steps={bad!r} is invalid: must be {allowed}$"):
            PPOActorConfig(max_skipped_steps=bad)
