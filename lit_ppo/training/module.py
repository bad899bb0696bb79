"""LitPPO: the policy, an optional critic and a frozen reference, trained by one RL iteration per step.

``training_step`` reads as the algorithm: pull the rollout batch generated with the current
weights, compute old / reference log-probs and values without gradients, compute advantages, then
update the actor over ``ppo_n_minibatches`` minibatches and the critic over its own, and log one
set of metrics. Every loss is normalised by the global token count of its minibatch, so results do
not depend on micro-batching or world size.

The module is the Lightning shell around the iteration; the parts have rooms of their own:
``update`` (the passes over micro-batches and the optimizer steps), ``guards`` (what stops a fit rather
than train on something wrong), ``metrics`` (what is logged and how ranks combine it) and ``optim``
(AdamW and its schedule). What it reads of the rollouts' data module is ``lit_ppo.rollout.source.RolloutSource``.
"""

from __future__ import annotations

import functools
import time
from dataclasses import asdict

import lightning as L
import torch
from lightning.pytorch.strategies import ModelParallelStrategy
from lightning.pytorch.utilities import rank_zero_info
from torch.distributed.fsdp import FSDPModule

from lit_ppo.algos import approximate_prox_logp, compute_advantages, policy_loss, value_loss
from lit_ppo.algos.checks import check_names
from lit_ppo.callbacks.export import ExportModel
from lit_ppo.callbacks.graceful_stop import GracefulStop
from lit_ppo.callbacks.weight_sync import WeightSync
from lit_ppo.config import ModelConfig, PPOActorConfig, PPOCriticConfig, RolloutConfig
from lit_ppo.errors import RunStopped
from lit_ppo.models import (
    build_critic,
    build_reference,
    load_policy,
    load_teacher,
    model_from_weights,
    token_logprobs,
    torch_dtype,
)
from lit_ppo.models.lora import adapters_disabled, add_lora, lora_config, merged_weights, trainable_parameters
from lit_ppo.models.sampling import allowed_mask
from lit_ppo.rollout.batch import RolloutBatch
from lit_ppo.rollout.engines.protocol import SamplingParams
from lit_ppo.rollout.evaluation import SUMS, eval_metrics, sum_names
from lit_ppo.rollout.source import RolloutSource
from lit_ppo.tasks.base import task_name
from lit_ppo.training.checkpoint_io import install_checkpoint_io
from lit_ppo.training.fsdp import full_tensor, shard_models
from lit_ppo.training.guards import LogpGapCheck, SkippedSteps, check_fit_start, check_staleness, every_rank_has_rows
from lit_ppo.training.metrics import MISMATCH_STATS, log_iteration, logp_gap, staleness, update_metrics
from lit_ppo.training.optim import adamw_with_schedule
from lit_ppo.training.record import RECORD_KEY, run_record
from lit_ppo.training.update import MetricSum, optimize, stitched_passes
from lit_ppo.utils.stop_requests import stop_requested


def _config(cls, value):
    """``value`` as a ``cls`` instance: a mapping of its fields is converted, None stays None."""
    return cls(**value) if isinstance(value, dict) else value


class LitPPO(L.LightningModule):
    """The PPO family as one LightningModule (manual optimization, one RL iteration per step).

    Args:
        model: the language model to train (policy; the critic and reference start as copies of it).
        actor: algorithm and optimisation settings of the policy.
        critic: settings of the critic; None trains without one (V = 0, GRPO-style).
        algo: preset name, recorded as the run's ``algo`` tag.

    Each config may also be given as a mapping of its fields. The configs are saved as plain
    mappings in the checkpoint's hyperparameters, so ``LitPPO.load_from_checkpoint(path)`` rebuilds
    the module (the base model loads from its source, then the checkpoint's weights replace it).
    """

    def __init__(self, model: ModelConfig | dict | None = None, actor: PPOActorConfig | dict | None = None,
                 critic: PPOCriticConfig | dict | None = None, algo: str = "custom"):
        super().__init__()
        self.automatic_optimization = False
        self.model_cfg = _config(ModelConfig, model) or ModelConfig()
        self.actor_cfg = _config(PPOActorConfig, actor) or PPOActorConfig()
        check_names(self.actor_cfg)
        self.critic_cfg = critic = _config(PPOCriticConfig, critic)
        self.algo = algo
        self.save_hyperparameters({"model": asdict(self.model_cfg), "actor": asdict(self.actor_cfg),
                                   "critic": None if critic is None else asdict(critic), "algo": algo}, logger=False)
        self.policy, self.tokenizer = load_policy(self.model_cfg)
        self.critic = build_critic(self.policy) if critic is not None else None
        if self.model_cfg.lora_rank > 0:  # after the critic's copy, which gets adapters of its own
            lora_cfg = lora_config(self.model_cfg)
            add_lora(self.policy, lora_cfg)
            if self.critic is not None:
                add_lora(self.critic.body, lora_cfg)
        # kl_ctl > 0 always gets a reference (AReaL silently used log pi_ref = 0 without one); under
        # LoRA it is the policy with its adapters disabled (_reference_logprobs), not a copy.
        # A teacher (model.teacher) takes the reference's place: the KL reward then distils it (algo=opd).
        with_ref = (self.actor_cfg.kl_ctl > 0 or self.actor_cfg.kl_loss_coef > 0) and not self.model_cfg.lora_rank
        if self.model_cfg.teacher is not None:
            self.ref = load_teacher(self.model_cfg.teacher, self.tokenizer, torch_dtype(self.model_cfg.dtype),
                                    self.model_cfg.cache_dir)
        else:
            self.ref = build_reference(self.policy) if with_ref else None
        self.version = 0
        """Policy version: the number of completed updates; the engine samples with this version."""
        self.sampling: SamplingParams | None = None
        self._allowed: torch.Tensor | None = None
        self.rollout = RolloutConfig()
        """The data module's rollout settings (``RolloutDataModule.rollout``), taken at fit start."""
        self._logp_gap_check: LogpGapCheck | None = None
        """rollout.max_logp_gap and what its error names; set at fit start (None: not checked)."""
        self.last_batch: RolloutBatch | None = None
        """The batch of the latest iteration (for sample logging)."""
        self._skipped = SkippedSteps(self.actor_cfg.max_skipped_steps)
        """Consecutive iterations with at least one skipped (non-finite) optimizer step."""
        self._eval_sums = torch.zeros(len(SUMS), dtype=torch.float64)
        """``lit_ppo.rollout.evaluation.SUMS`` of the evaluation in progress (this rank's problems)."""

    # ------------------------------------------------------------------ setup
    def configure_optimizers(self):
        total = self.trainer.max_steps if self.trainer and self.trainer.max_steps > 0 else 0
        # Under LoRA only the adapters (and the critic's value head) require grad and get optimizer state.
        configs = [(trainable_parameters(self.policy), self.actor_cfg.optimizer)]
        if self.critic is not None:
            configs.append((trainable_parameters(self.critic), self.critic_cfg.optimizer))
        optimizers, schedulers = zip(*(adamw_with_schedule(params, cfg, total) for params, cfg in configs))
        return list(optimizers), list(schedulers)

    def configure_callbacks(self):
        callbacks = [WeightSync(), GracefulStop()]
        if not any(isinstance(c, ExportModel) for c in self.trainer.callbacks):  # the trainer's own one wins
            callbacks.append(ExportModel())
        return callbacks

    def setup(self, stage: str) -> None:
        # Atomic, finite-only checkpoints under every trainer config (presets, --config, a user's Trainer).
        install_checkpoint_io(self.trainer.strategy)

    def on_fit_start(self) -> None:
        datamodule = self.trainer.datamodule
        if not isinstance(datamodule, RolloutSource):
            raise RuntimeError("LitPPO trains on a RolloutDataModule (trainer.fit(model, datamodule=...))")
        self.rollout = datamodule.rollout
        self.sampling = datamodule.sampling_params(self.tokenizer)
        precision = str(self.trainer.precision)
        check_fit_start(self.actor_cfg, self.model_cfg, self.sampling, self.rollout, precision)
        vocab = self.policy.get_output_embeddings().weight.shape[0]
        self._allowed = allowed_mask(self.sampling.allowed_token_ids, vocab, self.device)
        self._logp_gap_check = LogpGapCheck.of(self.rollout, self.model_cfg.dtype, precision, self.actor_cfg)
        if datamodule.eval_problem_count() == 0:  # Lightning would warn about an empty loader each time
            self.trainer.limit_val_batches = 0
            rank_zero_info(f"no evaluation: task {task_name(datamodule.task)!r} has no test problems "
                           f"(eval.max_problems={datamodule.eval.max_problems})")

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        checkpoint["policy_version"] = self.version
        # What resuming must match; TrackedConfig (a callback, called first) may have put the run's place there.
        datamodule = self.trainer.datamodule
        task = datamodule.task if isinstance(datamodule, RolloutSource) else None
        checkpoint.setdefault(RECORD_KEY, {}).update(run_record(self.algo, self.model_cfg, task))

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        self.version = checkpoint["policy_version"]

    def configure_model(self) -> None:
        # Called by the strategy before optimizers exist (and by load_from_checkpoint, without a
        # trainer); only FSDP2 changes the models.
        if self._trainer is not None and isinstance(self._trainer.strategy, ModelParallelStrategy):
            shard_models(self, self.device_mesh["data_parallel"])

    @property
    def sharded(self) -> bool:
        """Whether the models are sharded over ranks (FSDP2): then every forward pass is a collective."""
        return isinstance(self.policy, FSDPModule)

    def engine_weights(self):
        """The policy's named parameters as engines and exports load them: full tensors, one at a
        time (the weight push streams them, never holding a second copy of the model). Sharded, each
        is gathered from all ranks as it is reached: every rank must iterate it to the end."""
        weights = ((name, full_tensor(p.detach())) for name, p in self.policy.named_parameters())
        # Under LoRA: the merged weights, under the base model's names (engines load them unchanged).
        return merged_weights(self.policy, weights) if self.model_cfg.lora_rank else weights

    def full_policy(self):
        """The policy as one plain transformers model, which engines copy and exports write: the
        policy itself, or, sharded or under LoRA, a model of its config built from ``engine_weights``
        (the adapters merged; sharded, a collective: every rank calls it)."""
        if not self.sharded and not self.model_cfg.lora_rank:
            return self.policy
        return model_from_weights(self.policy.config, self.engine_weights(), torch_dtype(self.model_cfg.dtype),
                                  getattr(self.policy, "generation_config", None))

    # ------------------------------------------------------------------ forward passes
    def _reference_logprobs(self, batch: RolloutBatch) -> torch.Tensor:
        """Log-probs of the reference policy: the frozen copy, or under LoRA the policy with its
        adapters disabled (the base model)."""
        if self.ref is not None:
            return self._logprobs(self.ref, batch)[0]
        with adapters_disabled(self.policy):
            return self._logprobs(self.policy, batch)[0]

    def _logprobs(self, model, batch: RolloutBatch, with_entropy: bool = False):
        # A sharded model carries the pass as its own FSDP forward method (lit_ppo.training.fsdp.shard_models).
        logprobs = getattr(model, "token_logprobs", None) or functools.partial(token_logprobs, model)
        return logprobs(batch.input_ids, batch.attention_mask, temperature=self.sampling.temperature,
                        top_k=self.sampling.top_k, top_p=self.sampling.top_p, allowed=self._allowed,
                        loss_mask=batch.loss_mask, chunk_size=self.model_cfg.logprob_chunk_size,
                        with_entropy=with_entropy)

    def _no_grad_pass(self, fn, batch: RolloutBatch, max_tokens: int) -> list[torch.Tensor]:
        """``fn`` over ``batch`` in micro-batches, without gradients or dropout (``update.stitched_passes``)."""
        models = [m for m in (self.policy, self.critic) if m is not None]
        return stitched_passes(fn, batch, max_tokens, models=models, every_rank_joins=self.sharded)

    # ------------------------------------------------------------------ the RL iteration
    def training_step(self, dataloader_iter):
        # ---- the batch: this rank's rows, on-policy or within the staleness bound (or no iteration at all).
        batch: RolloutBatch = next(dataloader_iter)[0]  # generated now, with the weights of self.version
        start = time.perf_counter()
        metrics = dict(batch.metrics)
        self.last_batch = batch
        if not every_rank_has_rows(batch.num_rows, self.version, self.device):
            log_iteration(self, metrics, start, n_tokens=0)
            return
        batch = self.last_batch = batch.to(self.device)
        check_staleness(batch, self.version, self.rollout.max_head_offpolicyness)
        if self.rollout.max_head_offpolicyness > 0:
            metrics.update(staleness(batch, self.version))
        cfg = self.actor_cfg

        # ---- the algorithm, 1: old and reference log-probs and values, without gradients.
        # With dropout (model.lora_dropout) the update's own forward is noisy: the old log-probs and the
        # engine check come from a pass without it.
        # With an approximated pi_prox (actor.prox_logp_method) the update's own forward pass stands in for it.
        needs_prox = not cfg.approximates_prox and (cfg.recompute_logprob or cfg.use_decoupled_loss
                                                    or self.model_cfg.lora_dropout > 0)
        if needs_prox:
            (prox_logp,) = self._no_grad_pass(lambda b: self._logprobs(self.policy, b)[0], batch, cfg.mb_max_tokens)
            metrics["mismatch/logp_abs_diff"] = logp_gap(prox_logp, batch)
            self._check_logp_gap(prox_logp, batch)  # before any update: never train on a stale engine's samples
        else:
            prox_logp = batch.behave_logp  # on-policy: the behaviour log-probs are the old log-probs
        ref_logp = None
        if cfg.kl_ctl > 0 or cfg.kl_loss_coef > 0:
            (ref_logp,) = self._no_grad_pass(self._reference_logprobs, batch, cfg.mb_max_tokens)
        values = final_values = None
        if self.critic is not None:
            values, final_values = self._no_grad_pass(
                lambda b: self.critic.values(b.input_ids, b.attention_mask), batch, self.critic_cfg.mb_max_tokens)

        # ---- the algorithm, 2: rewards, KL reward, GAE and normalisation into advantages.
        terms, weights = self._reward_terms(batch)
        adv = compute_advantages(
            batch.rewards, batch.loss_mask, cfg, group_sizes=batch.group_sizes,
            old_logp=batch.behave_logp if cfg.use_decoupled_loss else prox_logp, ref_logp=ref_logp,
            values=values, final_values=final_values, truncated=batch.truncated, turn_ids=batch.turn_ids,
            reward_terms=terms, reward_weights=weights)

        # ---- the algorithm, 3: the actor's update, then the critic's.
        sums = MetricSum()
        skips = self._update_actor(batch, prox_logp, adv.advantages, sums, measure_mismatch=not needs_prox,
                                   ref_logp=ref_logp)
        if self.critic is not None:
            skips += self._update_critic(batch, values, adv.returns, sums)

        # ---- bookkeeping: skipped steps, schedules, the version, metrics.
        self._skipped.record(skips, self.version)
        # The schedule and the version count RL iterations, skipped updates included, like trainer.max_steps.
        schedulers = self.lr_schedulers()
        for scheduler in schedulers if isinstance(schedulers, list) else [schedulers]:
            scheduler.step()
        self.version += 1
        update, weights = update_metrics(batch, adv, values, sums, lr=self._optimizers()[0].param_groups[0]["lr"])
        metrics.update(update)
        log_iteration(self, metrics, start, int(batch.loss_mask.sum()), weights)

    def on_train_batch_end(self, outputs, batch, batch_idx: int) -> None:
        # Lightning ends at trainer.max_steps without evaluating; a stop request at the last
        # iteration makes it run the validation loop once more first (the final eval/* metrics).
        if 0 < self.trainer.max_steps <= self.trainer.global_step:
            self.trainer.should_stop = True

    def _check_logp_gap(self, logp: torch.Tensor, batch: RolloutBatch) -> None:
        """rollout.max_logp_gap on the trainer's log-probs ``logp`` of ``batch`` (``LogpGapCheck.check``)."""
        if self._logp_gap_check is not None:
            self._logp_gap_check.check(logp, batch, self.version)

    def _optimizers(self) -> list:
        """Lightning's wrappers of the actor's optimizer and, with a critic, the critic's."""
        opts = self.optimizers()
        return opts if isinstance(opts, list) else [opts]

    def _reward_terms(self, batch: RolloutBatch) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """Each reward function's values ``[B, K]`` and its weight ``[K]`` (the task's ``term_weights``), which
        ``actor.multi_objective_aggregation=normalize_then_sum`` normalises one by one; (None, None) otherwise."""
        if self.actor_cfg.multi_objective_aggregation != "normalize_then_sum" or not batch.reward_terms:
            return None, None
        task = self.trainer.datamodule.task
        weights = getattr(task, "term_weights", None)
        if weights is None:
            raise RunStopped(f"actor.multi_objective_aggregation=normalize_then_sum needs the weight of each reward "
                             f"function: task {task_name(task)!r} has no term_weights (one per reward_names)")
        weight = dict(zip(task.reward_names, weights))
        names = list(batch.reward_terms)
        return (torch.stack([batch.reward_terms[name] for name in names], 1),
                torch.tensor([weight[name] for name in names], dtype=torch.float64))

    def _update_actor(self, batch: RolloutBatch, old_logp: torch.Tensor, advantages: torch.Tensor,
                      sums: MetricSum, measure_mismatch: bool, ref_logp: torch.Tensor | None = None) -> int:
        """Update the policy; returns the number of skipped optimizer steps. ``measure_mismatch``: log
        |behaviour - trainer log-prob| from the first minibatch's forward passes, which still see the
        weights the batch was sampled with (no extra forward pass); ``ref_logp``: the reference's
        log-probs, for the KL term of the loss (actor.kl_loss_coef)."""
        cfg = self.actor_cfg

        def micro_loss(sub: RolloutBatch, idx: torch.Tensor, n_tokens: float, n_seqs: float, minibatch: int):
            width = sub.input_ids.shape[1]
            logp, entropy = self._logprobs(self.policy, sub, with_entropy=True)
            prox = old_logp[idx, :width]
            if cfg.approximates_prox:
                prox = approximate_prox_logp(sub.behave_logp, logp, sub.versions, self.version, cfg.prox_logp_method)
            loss, stats = policy_loss(logp, prox, advantages[idx, :width], sub.loss_mask, cfg,
                                      behave_logp=sub.behave_logp, num_tokens=n_tokens, num_seqs=n_seqs,
                                      entropy=entropy, ref_logp=None if ref_logp is None else ref_logp[idx, :width])
            weighted = {k: (v, stats.tokens.get(k)) for k, v in stats.items()}
            mismatch = {k: v for k, v in weighted.items() if k in MISMATCH_STATS}
            if measure_mismatch and minibatch == 0:
                generated = sub.loss_mask.sum()
                gap = (logp.detach() - sub.behave_logp).abs() * sub.loss_mask
                mismatch["logp_abs_diff"] = (gap.sum() / generated.clamp(min=1), generated)
                # Every micro-batch of the first minibatch, before its backward pass and so before the
                # first optimizer step; all ranks run the same number of them (equalised micro-batches).
                self._check_logp_gap(logp, sub)
            return loss, {"actor": {k: v for k, v in weighted.items() if k not in MISMATCH_STATS}, "mismatch": mismatch}

        # The actor's last step is the iteration's one step through Lightning: trainer.max_steps counts iterations.
        return optimize(batch, micro_loss, cfg, prefix="actor", model=self.policy, optimizer=self._optimizers()[0],
                        counts_as_global_step=True, backward=self.manual_backward,
                        world_size=self.trainer.world_size, version=self.version, sums=sums)

    def _update_critic(self, batch: RolloutBatch, old_values: torch.Tensor, returns: torch.Tensor,
                       sums: MetricSum) -> int:
        """Update the critic; returns the number of skipped optimizer steps."""
        cfg = self.critic_cfg

        def micro_loss(sub: RolloutBatch, idx: torch.Tensor, n_tokens: float, n_seqs: float, minibatch: int):
            width = sub.input_ids.shape[1]
            values, _ = self.critic.values(sub.input_ids, sub.attention_mask)
            loss, stats = value_loss(values, old_values[idx, :width], returns[idx, :width], sub.loss_mask,
                                     eps_clip=cfg.eps_clip, num_tokens=n_tokens)
            # The loss is the micro-batch's share of the minibatch's; the statistics are means over its tokens.
            generated = sub.loss_mask.sum()
            return loss, {"critic": {k: (v, None if k == "loss" else generated) for k, v in stats.items()}}

        return optimize(batch, micro_loss, cfg, prefix="critic", model=self.critic, optimizer=self._optimizers()[1],
                        counts_as_global_step=False, backward=self.manual_backward,
                        world_size=self.trainer.world_size, version=self.version, sums=sums)

    # ------------------------------------------------------------------ evaluation (lit_ppo.rollout.evaluation)
    def on_train_start(self) -> None:
        """eval.before_training: the untrained policy's scores, at iteration 0, by Lightning's validation loop as
        every later evaluation (its callbacks print and record them). A resumed fit is past its untrained point."""
        datamodule: RolloutSource = self.trainer.datamodule
        if datamodule.eval.before_training and self.trainer.global_step == 0 and self.trainer.enable_validation:
            self.trainer.validating = True
            self.trainer.fit_loop.epoch_loop.val_loop.run()
            self.trainer.training = True

    def on_validation_epoch_start(self) -> None:
        datamodule: RolloutSource = self.trainer.datamodule
        self._eval_sums = torch.zeros(len(sum_names(datamodule.task)), dtype=torch.float64)

    def validation_step(self, batch: list[int], batch_idx: int) -> None:
        """Score test problems ``batch`` (indices into the task's test split) through the engine."""
        if stop_requested():  # stopping: the checkpoint matters now, not the scores
            return
        datamodule: RolloutSource = self.trainer.datamodule
        self._eval_sums += datamodule.evaluate(batch)

    def on_validation_epoch_end(self) -> None:
        """Add the sums over ranks and log the means (every rank calls this exactly once)."""
        datamodule: RolloutSource = self.trainer.datamodule
        sums = self.trainer.strategy.reduce(self._eval_sums.to(self.device), reduce_op="sum").cpu()
        metrics = eval_metrics(sums, datamodule.eval.k, sum_names(datamodule.task))
        # Float64 tensors: Lightning would store Python floats in float32. An evaluation that a stop cut
        # short scored only part of the split: no score.
        if metrics and not stop_requested():
            logged = {k: torch.tensor(v, dtype=torch.float64) for k, v in metrics.items()}
            if self.trainer.state.fn == "fit":  # the iteration scored, as printed (validate/test have no iteration)
                logged["step"] = torch.tensor(float(self.trainer.global_step))
            self.log_dict(logged, on_step=False, on_epoch=True, sync_dist=False, batch_size=1)
        datamodule.engine.sleep()

    on_test_epoch_start = on_validation_epoch_start
    test_step = validation_step
    on_test_epoch_end = on_validation_epoch_end
