"""LitPPO: the policy, an optional critic and a frozen reference, trained by one RL iteration per step.

``training_step`` reads as the algorithm: pull the rollout batch generated with the current
weights, compute old / reference log-probs and values without gradients, compute advantages, then
update the actor over ``ppo_n_minibatches`` minibatches and the critic over its own, and log one
set of metrics. Every loss is normalised by the global token count of its minibatch, so results do
not depend on micro-batching or world size.
"""

from __future__ import annotations

import functools
import math
import time
from dataclasses import asdict, dataclass, field

import lightning as L
import torch
import torch.distributed as dist
from lightning.pytorch.strategies import ModelParallelStrategy
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from torch.distributed.fsdp import FSDPModule

from lit_ppo.algos import compute_advantages, policy_loss, value_loss
from lit_ppo.algos.checks import check_names
from lit_ppo.callbacks.export import ExportModel
from lit_ppo.callbacks.graceful_stop import GracefulStop
from lit_ppo.callbacks.weight_sync import WeightSync
from lit_ppo.config import DTYPES, ModelConfig, OptimizerConfig, PPOActorConfig, PPOCriticConfig
from lit_ppo.errors import RunStopped
from lit_ppo.models import (build_critic, build_reference, load_causal_lm, model_from_weights, token_logprobs,
                            use_chat_template)
from lit_ppo.models.lora import adapters_disabled, add_lora, lora_config, merged_weights, trainable_parameters
from lit_ppo.models.sampling import allowed_mask
from lit_ppo.rollout.batch import RolloutBatch
from lit_ppo.rollout.engine import SamplingParams
from lit_ppo.rollout.evaluation import SUMS, eval_metrics
from lit_ppo.rollout.producer import decoupled_loss_problem
from lit_ppo.rollout.workflows import task_name
from lit_ppo.training.checkpoint_io import install_checkpoint_io
from lit_ppo.training.fsdp import full_tensor, shard_models
from lit_ppo.training.record import RECORD_KEY, run_record
from lit_ppo.utils.stop_requests import stop_requested

SUMMED = ("rollout/accepted", "rollout/rejected", "rollout/invalid_rewards", "rollout/dropped_stale",
          "perf/tokens_per_s")
"""Iteration metrics that add up over ranks (counts, throughput); the others are weighted means."""
ROW_MEANS = ("rollout/reward_mean", "rollout/response_length", "rollout/truncated_fraction")
TOKEN_MEANS = ("actor/advantage_abs_mean", "actor/kl_reward", "critic/explained_variance", "mismatch/logp_abs_diff",
               "rollout/staleness_mean")
"""Iteration metrics that are means over a rank's rows / its loss tokens."""
FUSED_ADAMW_DEVICES = ("cpu", "cuda", "xpu", "mps")
"""Devices with torch's fused AdamW kernel."""
MISMATCH_STATS = ("behave_imp_weight", "behave_approx_kl", "filtered_fraction")
"""Policy-loss statistics of the behaviour policy vs the proximal policy, logged under mismatch/."""


def _config(cls, value):
    """``value`` as a ``cls`` instance: a mapping of its fields is converted, None stays None."""
    return cls(**value) if isinstance(value, dict) else value


def _lr_lambda(cfg: OptimizerConfig, total_steps: int):
    """Multiplier of the peak lr after ``step`` RL iterations: linear warmup, then the schedule."""

    def multiplier(step: int) -> float:
        if step < cfg.warmup_steps:
            return (step + 1) / (cfg.warmup_steps + 1)
        if cfg.lr_schedule == "constant" or total_steps <= cfg.warmup_steps:
            return 1.0
        progress = min(1.0, (step - cfg.warmup_steps) / (total_steps - cfg.warmup_steps))
        decay = 1.0 - progress if cfg.lr_schedule == "linear" else 0.5 * (1.0 + math.cos(math.pi * progress))
        return cfg.min_lr_ratio + (1.0 - cfg.min_lr_ratio) * decay

    return multiplier


def balanced_partition(weights: list[int], parts: int) -> list[list[int]]:
    """Split item indices into ``parts`` lists of near-equal total weight (longest first to the
    lightest part); each list keeps the original order. Parts may be empty when items are few."""
    bins: list[list[int]] = [[] for _ in range(parts)]
    loads = [0] * parts
    for i in sorted(range(len(weights)), key=lambda i: -weights[i]):
        lightest = min(range(parts), key=loads.__getitem__)
        bins[lightest].append(i)
        loads[lightest] += weights[i]
    return [sorted(b) for b in bins]


def micro_batches(rows: list[int], lengths: list[int], max_tokens: int) -> list[list[int]]:
    """Consecutive groups of rows whose padded size (rows x longest row) stays within ``max_tokens``;
    a single row longer than the budget forms its own micro-batch."""
    out: list[list[int]] = []
    current: list[int] = []
    longest = 0
    for r in rows:
        if current and (len(current) + 1) * max(longest, lengths[r]) > max_tokens:
            out.append(current)
            current, longest = [], 0
        current.append(r)
        longest = max(longest, lengths[r])
    if current:
        out.append(current)
    return out


@dataclass
class _MetricSum:
    """Token-weighted running sums of per-micro-batch statistics."""

    sums: dict[str, float] = field(default_factory=dict)
    weights: dict[str, float] = field(default_factory=dict)

    def add(self, stats: dict[str, torch.Tensor], weight: float, prefix: str) -> None:
        for name, value in stats.items():
            key = f"{prefix}/{name}"
            self.sums[key] = self.sums.get(key, 0.0) + float(value) * weight
            self.weights[key] = self.weights.get(key, 0.0) + weight

    def merge(self, other: "_MetricSum") -> None:
        """Add ``other``'s sums and weights to these."""
        for key, value in other.sums.items():
            self.sums[key] = self.sums.get(key, 0.0) + value
            self.weights[key] = self.weights.get(key, 0.0) + other.weights[key]

    def means(self) -> dict[str, float]:
        return {k: self.sums[k] / max(self.weights[k], 1e-12) for k in self.sums}


FLOAT32_LOGP_GAP = 1e-3
"""rollout.max_logp_gap=auto's limit (mean nats per token) in float32; under lower precision a gap above
it warns (docs/rollout.md#the-log-prob-gap has the measurements)."""
LOWER_PRECISION_LOGP_GAP = 0.1
"""rollout.max_logp_gap=auto's limit where engine or trainer computes in lower precision: above bf16's
rounding, far below a broken weight push (docs/rollout.md#the-log-prob-gap)."""


@dataclass
class _LogpGapCheck:
    """rollout.max_logp_gap of a fit and the context its error names."""

    limit: float
    engine: str
    lower_precision: list[str]
    """The settings that compute in less than float32 (empty for float32 end to end)."""
    decoupled: bool = False
    """actor.use_decoupled_loss: the loss already corrects for behaviour / trainer differences."""
    rejection: bool = False
    """actor.rejection_sampling is set: tokens whose ratio is off are already masked or clamped."""
    warned: bool = False
    """Whether ``warning`` has returned its one warning of the run."""
    setting: str = ""
    """rollout.max_logp_gap as the error shows it ('auto: 0.1 under lower precision'); empty: ``limit``."""

    @classmethod
    def of(cls, module: "LitPPO", datamodule) -> "_LogpGapCheck | None":
        limit = getattr(datamodule, "max_logp_gap", None)
        if limit is None:
            return None
        engine_kwargs = getattr(datamodule, "engine_kwargs", None) or {}
        engine_dtype = engine_kwargs.get("dtype")
        precision = str(module.trainer.precision)
        lower = [f"model.dtype={module.model_cfg.dtype}"] if module.model_cfg.dtype != "float32" else []
        if engine_dtype not in (None, "float32", "auto"):
            lower.append(f"rollout.engine_kwargs.dtype={engine_dtype}")
        if engine_kwargs.get("autocast") is not None:
            lower.append(f"rollout.engine_kwargs.autocast={engine_kwargs['autocast']}")
        if precision not in ("32", "32-true", "64", "64-true"):
            lower.append(f"trainer.precision={precision}")
        cfg = module.actor_cfg
        setting = ""
        if limit == "auto":
            limit = LOWER_PRECISION_LOGP_GAP if lower else FLOAT32_LOGP_GAP
            setting = f"auto: {limit:g} {'under lower precision' if lower else 'in float32'}"
        return cls(float(limit), getattr(datamodule, "engine_name", "?"), lower, cfg.use_decoupled_loss,
                   cfg.rejection_sampling is not None, setting=setting)

    def message(self, gap: float, version: int) -> str:
        head = (f"rollout={self.engine}: behaviour log-probs differ from the trainer's by {gap:.4g} nats/token "
                f"(> rollout.max_logp_gap={self.setting or format(self.limit, 'g')}) at policy version {version}")
        if not self.lower_precision:
            return (f"{head}: the engine is not sampling from the trainer's weights; stopped before training on "
                    f"them (check that the engine receives every parameter, or set rollout.max_logp_gap=null to "
                    f"train anyway)")
        # Rounding, not a stale engine: the behaviour policy really differs from the trainer's, which
        # the decoupled loss corrects (behaviour importance weight) and rejection sampling bounds.
        suggested = max(0.1, float(f"{2 * gap:.1g}"))
        raise_it = f"raise rollout.max_logp_gap, e.g. {suggested:g}, or set it to null"
        if not self.decoupled:
            fix = (f"use the decoupled loss with rejection sampling, which weights each token by pi_prox/pi_behave "
                   f"and masks those whose ratio is off: rejection=icepop or rejection=kpop on any algo "
                   f"(actor.use_decoupled_loss=true and actor.rejection_sampling), or algo=icepop / algo=kpop; "
                   f"and {raise_it}")
        elif not self.rejection:
            fix = (f"actor.use_decoupled_loss corrects for it; add rejection sampling, rejection=icepop or "
                   f"rejection=kpop (actor.rejection_sampling), to mask tokens whose pi_prox/pi_behave ratio is off, "
                   f"and {raise_it}")
        else:
            fix = f"actor.use_decoupled_loss and actor.rejection_sampling correct for it: {raise_it}"
        return (f"{head}: {', '.join(self.lower_precision)} computes in lower precision, which gives gaps of "
                f"1e-3 to 4e-2; stopped before training on them ({fix})")

    def warning(self, gap: float, version: int) -> str | None:
        """Once per run: the warning for a gap within the limit but above float32 agreement
        (``FLOAT32_LOGP_GAP``) under lower precision without the decoupled loss, which alone corrects
        for a behaviour policy other than the trainer's. None otherwise."""
        if self.warned or not self.lower_precision or self.decoupled or gap <= FLOAT32_LOGP_GAP:
            return None
        self.warned = True
        return (f"rollout={self.engine}: behaviour log-probs differ from the trainer's by {gap:.4g} nats/token at "
                f"policy version {version} ({', '.join(self.lower_precision)}), which this loss does not correct (it "
                f"treats the engine's samples as the trainer's own): use the decoupled loss with rejection sampling "
                f"(rejection=icepop or rejection=kpop on any algo, or algo=icepop / algo=kpop)")


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
        self.policy, self.tokenizer = load_causal_lm(self.model_cfg.source, self.model_cfg.cache_dir,
                                                     DTYPES[self.model_cfg.dtype])
        use_chat_template(self.tokenizer, self.model_cfg.chat_template)
        self.policy.train()  # from_pretrained returns eval mode; Lightning keeps submodule modes
        if self.model_cfg.gradient_checkpointing:
            self.policy.gradient_checkpointing_enable()
        self.critic = build_critic(self.policy) if critic is not None else None
        if self.model_cfg.lora_rank > 0:  # after the critic's copy, which gets adapters of its own
            lora_cfg = lora_config(self.model_cfg)
            add_lora(self.policy, lora_cfg)
            if self.critic is not None:
                add_lora(self.critic.body, lora_cfg)
        # kl_ctl > 0 always gets a reference (AReaL silently used log pi_ref = 0 without one); under
        # LoRA it is the policy with its adapters disabled (_reference_logprobs), not a copy.
        with_ref = self.actor_cfg.kl_ctl > 0 and not self.model_cfg.lora_rank
        self.ref = build_reference(self.policy) if with_ref else None
        self.version = 0
        """Policy version: the number of completed updates; the engine samples with this version."""
        self.sampling: SamplingParams | None = None
        self._allowed: torch.Tensor | None = None
        self.max_staleness = 0
        """rollout.max_head_offpolicyness of the fit: how many versions a trained token may lag."""
        self._logp_gap_check: _LogpGapCheck | None = None
        """rollout.max_logp_gap and what its error names; set at fit start (None: not checked)."""
        self.last_batch: RolloutBatch | None = None
        """The batch of the latest iteration (for sample logging)."""
        self._skipped_in_a_row = 0
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
        optimizers, schedulers = [], []
        for params, cfg in configs:
            # The fused kernel updates every parameter in one pass (on CPU 5x the per-tensor loop).
            fused = all(p.device.type in FUSED_ADAMW_DEVICES and p.is_floating_point() for p in params)
            opt = torch.optim.AdamW(params, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps,
                                    weight_decay=cfg.weight_decay, fused=fused or None)
            optimizers.append(opt)
            schedulers.append(torch.optim.lr_scheduler.LambdaLR(opt, _lr_lambda(cfg, total)))
        return optimizers, schedulers

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
        if datamodule is None or not hasattr(datamodule, "sampling_params"):
            raise RuntimeError("LitPPO trains on a RolloutDataModule (trainer.fit(model, datamodule=...))")
        self.sampling = datamodule.sampling_params(self.tokenizer)
        if self.sampling.temperature != self.actor_cfg.temperature:
            raise ValueError(f"actor.temperature={self.actor_cfg.temperature} must equal the sampling temperature "
                             f"data.gconfig.temperature={self.sampling.temperature}")
        self._allowed = allowed_mask(self.sampling.allowed_token_ids, self.policy.get_output_embeddings().weight.shape[0],
                                     self.device)
        self._logp_gap_check = _LogpGapCheck.of(self, datamodule)
        half_weights = (f"model.dtype={self.model_cfg.dtype}" if self.model_cfg.dtype != "float32" else
                        f"trainer.precision={self.trainer.precision}"
                        if str(self.trainer.precision) in ("bf16-true", "16-true") else None)
        if half_weights:
            rank_zero_warn(f"{half_weights}: the policy's weights and AdamW state are not float32 (no float32 "
                           f"master copy), so updates smaller than the weights' rounding step are lost; for "
                           f"lower-precision compute keep model.dtype=float32 and set trainer.precision=bf16-mixed")
        self.max_staleness = getattr(datamodule, "max_head_offpolicyness", 0)
        problem = decoupled_loss_problem(self.max_staleness, self.actor_cfg.use_decoupled_loss)
        if problem:
            raise ValueError(problem)
        if datamodule.eval_problem_count() == 0:  # Lightning would warn about an empty loader each time
            self.trainer.limit_val_batches = 0
            rank_zero_info(f"no evaluation: task {task_name(datamodule.task)!r} has no test problems "
                           f"(eval.max_problems={datamodule.eval.max_problems})")

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        checkpoint["policy_version"] = self.version
        # What resuming must match; TrackedConfig (a callback, called first) may have put the run's place there.
        task = getattr(self.trainer.datamodule, "task", None)
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
        return model_from_weights(self.policy.config, self.engine_weights(), DTYPES[self.model_cfg.dtype],
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

    @torch.no_grad()
    def _no_grad_pass(self, fn, batch: RolloutBatch, max_tokens: int) -> list[torch.Tensor]:
        """Apply ``fn(sub_batch)`` micro-batch by micro-batch; stitch its ``[b, t]`` / ``[b]`` outputs
        back into ``[B, T]`` / ``[B]`` tensors (sub-batches are trimmed to their longest row). The
        models run in eval mode (no dropout): old log-probs and values are what the engine computes."""
        modes = [(m, m.training) for m in (self.policy, self.critic) if m is not None]
        for model, _ in modes:
            model.eval()
        try:
            return self._stitched_passes(fn, batch, max_tokens)
        finally:
            for model, training in modes:
                model.train(training)

    def _stitched_passes(self, fn, batch: RolloutBatch, max_tokens: int) -> list[torch.Tensor]:
        B, T = batch.input_ids.shape
        lengths = batch.attention_mask.sum(1).tolist()
        outputs: list[torch.Tensor] = []
        rows_per_pass = micro_batches(list(range(B)), lengths, max_tokens)
        if self.sharded:  # every rank must take part in every sharded forward: pad with discarded passes
            rows_per_pass += [[] for _ in range(self._world_max(len(rows_per_pass)) - len(rows_per_pass))]
        for rows in rows_per_pass:
            if not rows:
                fn(batch.select([0]))
                continue
            result = fn(batch.select(rows))
            result = result if isinstance(result, tuple) else (result,)
            if not outputs:
                outputs = [r.new_zeros((B, T) if r.dim() == 2 else (B,)) for r in result]
            idx = torch.as_tensor(rows, device=self.device)
            for out, r in zip(outputs, result):
                if r.dim() == 2:
                    out[idx, :r.shape[1]] = r
                else:
                    out[idx] = r
        return outputs

    # ------------------------------------------------------------------ the RL iteration
    def training_step(self, dataloader_iter):
        batch: RolloutBatch = next(dataloader_iter)[0]  # generated now, with the weights of self.version
        start = time.perf_counter()
        metrics = dict(batch.metrics)
        self.last_batch = batch
        fewest, most = -self._world_max(-batch.num_rows), self._world_max(batch.num_rows)
        if fewest == 0:  # dynamic batch size: every group of some rank was filtered out
            if most > 0:
                # A rank without samples cannot take part in the others' update: all ranks skip it.
                rank_zero_warn(f"iteration skipped at policy version {self.version}: the dynamic filter accepted "
                               f"no group on some rank (data.dynamic_bs under DDP updates when every rank has one)")
            self._log_iteration(metrics, start, n_tokens=0)
            return
        batch = self.last_batch = batch.to(self.device)
        self._check_staleness(batch)
        cfg = self.actor_cfg
        mask = batch.loss_mask
        if self.max_staleness > 0:  # the trainer's version minus each trained token's
            staleness = (self.version - batch.versions[mask.bool()]).float()
            metrics["rollout/staleness_mean"] = float(staleness.mean()) if staleness.numel() else 0.0
            metrics["rollout/staleness_max"] = float(self._world_max(int(staleness.max()) if staleness.numel() else 0))

        # With dropout (model.lora_dropout) the update's own forward is noisy: the old log-probs and the
        # engine check come from a pass without it.
        needs_prox = cfg.recompute_logprob or cfg.use_decoupled_loss or self.model_cfg.lora_dropout > 0
        if needs_prox:
            (prox_logp,) = self._no_grad_pass(lambda b: self._logprobs(self.policy, b)[0], batch, cfg.mb_max_tokens)
            metrics["mismatch/logp_abs_diff"] = float(((prox_logp - batch.behave_logp).abs() * mask).sum()
                                                      / mask.sum().clamp(min=1))
            self._check_logp_gap(prox_logp, batch)  # before any update: never train on a stale engine's samples
        else:
            prox_logp = batch.behave_logp  # on-policy: the behaviour log-probs are the old log-probs
        ref_logp = None
        if cfg.kl_ctl > 0:
            (ref_logp,) = self._no_grad_pass(self._reference_logprobs, batch, cfg.mb_max_tokens)
        values = final_values = None
        if self.critic is not None:
            values, final_values = self._no_grad_pass(
                lambda b: self.critic.values(b.input_ids, b.attention_mask), batch, self.critic_cfg.mb_max_tokens)

        adv = compute_advantages(
            batch.rewards, mask, cfg, group_sizes=batch.group_sizes,
            old_logp=batch.behave_logp if cfg.use_decoupled_loss else prox_logp, ref_logp=ref_logp,
            values=values, final_values=final_values, truncated=batch.truncated, turn_ids=batch.turn_ids)

        sums = _MetricSum()
        skips = self._update_actor(batch, prox_logp, adv.advantages, sums, measure_mismatch=not needs_prox)
        if self.critic is not None:
            skips += self._update_critic(batch, values, adv.returns, sums)
        self._check_skipped_steps(skips)
        # The schedule and the version count RL iterations, skipped updates included, like trainer.max_steps.
        for scheduler in self._schedulers():
            scheduler.step()
        self.version += 1

        n_tokens = int(mask.sum())
        metrics.update(sums.means())
        metrics.update({
            "rollout/reward_mean": float(batch.rewards.mean()),
            "rollout/response_length": float(batch.response_lengths.float().mean()),
            "rollout/truncated_fraction": float(batch.truncated.float().mean()),
            "actor/advantage_abs_mean": float((adv.advantages.abs() * mask).sum() / mask.sum().clamp(min=1)),
            "actor/kl_reward": float(adv.kl_rewards.sum() / mask.sum().clamp(min=1)),
            "actor/lr": self._optimizers()[0].param_groups[0]["lr"],
        })
        if values is not None:
            returns = adv.returns[mask]
            metrics["critic/explained_variance"] = float(1 - (returns - values[mask]).var() / returns.var().clamp(min=1e-8))
        # Each rank's means weigh by what they average over (its rows or tokens) in the world mean.
        weights = {k: float(batch.num_rows) for k in ROW_MEANS}
        weights.update({k: float(n_tokens) for k in TOKEN_MEANS})
        weights.update(sums.weights)  # the update's statistics: the tokens of the micro-batches they came from
        self._log_iteration(metrics, start, n_tokens, weights)

    def on_train_batch_end(self, outputs, batch, batch_idx: int) -> None:
        # Lightning ends at trainer.max_steps without evaluating; a stop request at the last
        # iteration makes it run the validation loop once more first (the final eval/* metrics).
        if 0 < self.trainer.max_steps <= self.trainer.global_step:
            self.trainer.should_stop = True

    def _check_staleness(self, batch: RolloutBatch) -> None:
        """RunStopped unless every trained token was sampled by one of the last ``max_staleness`` + 1
        policy versions (the hand-over drops older groups; this guards the bound itself)."""
        versions = batch.versions[batch.loss_mask]
        oldest = self.version - self.max_staleness
        if versions.numel() and bool(((versions < oldest) | (versions > self.version)).any()):
            bound = ("synchronous training must be on-policy" if self.max_staleness == 0 else
                     f"rollout.max_head_offpolicyness={self.max_staleness} allows versions {oldest} to {self.version}")
            raise RunStopped(f"rollout batch was generated by policy versions {versions.unique().tolist()}, "
                             f"the policy is at version {self.version}: {bound}")

    def _check_logp_gap(self, logp: torch.Tensor, batch: RolloutBatch) -> None:
        """RunStopped if the tokens of ``batch`` sampled by the current policy version have
        behaviour log-probs that differ from the trainer's ``logp`` by more than rollout.max_logp_gap
        (token mean over all ranks: every rank takes the same decision). Older tokens (asynchronous
        rollouts) are left out: their behaviour policy is legitimately another one."""
        check = self._logp_gap_check
        if check is None:
            return
        current = batch.loss_mask.bool() & (batch.versions == self.version)
        diff = (logp.detach().float() - batch.behave_logp.float()).abs()
        totals = torch.stack([torch.where(current, diff, torch.zeros_like(diff)).sum().double(),
                              current.sum().double()])
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(totals)
        gap_sum, n_tokens = totals.tolist()
        if n_tokens > 0 and gap_sum / n_tokens > check.limit:
            raise RunStopped(check.message(gap_sum / n_tokens, self.version))
        warning = check.warning(gap_sum / n_tokens, self.version) if n_tokens > 0 else None
        if warning:
            rank_zero_warn(warning)

    def _optimizers(self):
        opts = self.optimizers()
        return opts if isinstance(opts, list) else [opts]

    def _schedulers(self):
        schedulers = self.lr_schedulers()
        if schedulers is None:
            return []
        return schedulers if isinstance(schedulers, list) else [schedulers]

    def _world_sum(self, value: float) -> float:
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            t = torch.tensor(float(value), device=self.device, dtype=torch.float64)
            dist.all_reduce(t)
            return float(t)
        return float(value)

    def _world_max(self, value: int) -> int:
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            t = torch.tensor(int(value), device=self.device)
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            return int(t)
        return int(value)

    def _step(self, optimizer_index: int, params, clip: float | None, last: bool,
              loss_finite: bool) -> tuple[float, bool]:
        """Clip and apply the gradients; returns their norm before clipping and whether the update was
        applied. Lightning counts every step of its optimizer wrapper as a global step; ``last`` marks
        the one step per RL iteration that goes through it, so that trainer.max_steps counts
        iterations. The others step the wrapped torch optimizer directly.

        The update is skipped when the loss was not finite (``loss_finite``, already agreed over ranks)
        or the gradient norm is not (identical on every rank: it is taken after the gradient
        all-reduce). A skipped step drops the gradients and still calls ``step``: AdamW leaves
        parameters without a gradient untouched, their state (step count, moments) included, and the
        wrapper still counts the iteration."""
        norm = torch.nn.utils.clip_grad_norm_(params, clip if clip is not None else float("inf"))
        grad_norm = float(full_tensor(norm))  # sharded: the norm over all shards
        optimizer = self._optimizers()[optimizer_index]
        applied = loss_finite and math.isfinite(grad_norm)
        if not applied:
            optimizer.zero_grad(set_to_none=True)
        if last:
            optimizer.step()
        else:
            optimizer.optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return grad_norm, applied

    def _check_skipped_steps(self, skips: int) -> None:
        """Count consecutive iterations with a skipped step; RunStopped once they reach
        ``actor.max_skipped_steps``."""
        self._skipped_in_a_row = self._skipped_in_a_row + 1 if skips else 0
        limit = self.actor_cfg.max_skipped_steps
        if self._skipped_in_a_row >= limit:
            raise RunStopped(f"{self._skipped_in_a_row} consecutive iterations skipped optimizer steps for a "
                             f"non-finite loss or gradient (actor.max_skipped_steps={limit}), the last at "
                             f"policy version {self.version}: check the rewards, the learning rate and the loss")

    def _update_actor(self, batch: RolloutBatch, old_logp: torch.Tensor, advantages: torch.Tensor,
                      sums: _MetricSum, measure_mismatch: bool) -> int:
        """Update the policy; returns the number of skipped optimizer steps. ``measure_mismatch``: log
        |behaviour - trainer log-prob| from the first minibatch's forward passes, which still see the
        weights the batch was sampled with (no extra forward pass)."""
        cfg = self.actor_cfg

        def micro_loss(sub: RolloutBatch, idx: torch.Tensor, n_tokens: float, n_seqs: float, minibatch: int):
            width = sub.input_ids.shape[1]
            logp, entropy = self._logprobs(self.policy, sub, with_entropy=True)
            loss, stats = policy_loss(logp, old_logp[idx, :width], advantages[idx, :width], sub.loss_mask, cfg,
                                      behave_logp=sub.behave_logp, num_tokens=n_tokens, num_seqs=n_seqs,
                                      entropy=entropy)
            mismatch = {k: v for k, v in stats.items() if k in MISMATCH_STATS}
            if measure_mismatch and minibatch == 0:
                gap = (logp.detach() - sub.behave_logp).abs() * sub.loss_mask
                mismatch["logp_abs_diff"] = gap.sum() / sub.loss_mask.sum().clamp(min=1)
                # Every micro-batch of the first minibatch, before its backward pass and so before the
                # first optimizer step; all ranks run the same number of them (equalised micro-batches).
                self._check_logp_gap(logp, sub)
            return loss, {"actor": {k: v for k, v in stats.items() if k not in MISMATCH_STATS}, "mismatch": mismatch}

        return self._optimize(batch, cfg.ppo_n_minibatches, cfg.mb_max_tokens, micro_loss, 0, self.policy,
                              cfg.optimizer.gradient_clipping, sums, "actor")

    def _update_critic(self, batch: RolloutBatch, old_values: torch.Tensor, returns: torch.Tensor,
                       sums: _MetricSum) -> int:
        """Update the critic; returns the number of skipped optimizer steps."""
        cfg = self.critic_cfg

        def micro_loss(sub: RolloutBatch, idx: torch.Tensor, n_tokens: float, n_seqs: float, minibatch: int):
            width = sub.input_ids.shape[1]
            values, _ = self.critic.values(sub.input_ids, sub.attention_mask)
            loss, stats = value_loss(values, old_values[idx, :width], returns[idx, :width], sub.loss_mask,
                                     eps_clip=cfg.eps_clip, num_tokens=n_tokens)
            return loss, {"critic": stats}

        return self._optimize(batch, cfg.ppo_n_minibatches, cfg.mb_max_tokens, micro_loss, 1, self.critic,
                              cfg.optimizer.gradient_clipping, sums, "critic")

    def _optimize(self, batch: RolloutBatch, n_minibatches: int, max_tokens: int, micro_loss, optimizer_index: int,
                  model: torch.nn.Module, clip: float | None, sums: _MetricSum, prefix: str) -> int:
        """One pass over token-balanced minibatches, one optimizer step each; every micro-batch loss is
        normalised by its minibatch's global token (and sequence) count, so gradients add up to the
        minibatch loss whatever the micro-batching or world size. Returns the number of skipped steps
        (non-finite loss or gradient, see ``_step``); their statistics are left out of ``sums``, which
        gets ``<prefix>/skipped_steps`` instead."""
        world = self.trainer.world_size
        lengths = batch.attention_mask.sum(1).tolist()
        tokens = batch.loss_mask.sum(1)
        # Every rank takes the same number of steps, also one holding fewer rows than minibatches
        # (its surplus minibatches are empty and join each step's collectives at weight 0).
        minibatches = balanced_partition(tokens.tolist(), self._world_max(min(n_minibatches, batch.num_rows)))
        skips = 0
        for i, rows in enumerate(minibatches):
            n_tokens = self._world_sum(int(tokens[rows].sum()))
            n_seqs = self._world_sum(int((tokens[rows] > 0).sum()))
            step_sums = _MetricSum()  # kept only if the step is applied: metrics describe updates made
            loss_sum = torch.zeros((), device=self.device)
            for mb_rows in self._equalised_micro_batches(rows, lengths, max_tokens):
                picked = mb_rows or rows[:1] or [0]  # an empty (padding) micro-batch reruns one row at weight 0
                loss, stats = micro_loss(batch.select(picked), torch.as_tensor(picked, device=self.device),
                                         n_tokens, n_seqs, i)
                if not mb_rows:
                    loss = loss * 0.0  # joins the gradient collective, contributes nothing
                # DDP/FSDP average gradients over ranks; the loss is already a global mean.
                self.manual_backward(loss * world)
                loss_sum = loss_sum + loss.detach()
                if mb_rows:
                    weight = float(batch.loss_mask[picked].sum())
                    for group, values in stats.items():
                        # A micro-batch's loss is its share of the minibatch loss: added up below, not averaged.
                        step_sums.add({k: v for k, v in values.items() if (group, k) != (prefix, "loss")}, weight,
                                      group)
            # The minibatch loss over all ranks. Non-finite on one rank only (gradients need not be), it is
            # non-finite in the sum too: every rank skips the step.
            minibatch_loss = self._world_sum(float(loss_sum))
            loss_finite = math.isfinite(minibatch_loss)
            # Only the actor's last step of the iteration goes through Lightning (one global step).
            last = optimizer_index == 0 and i == len(minibatches) - 1
            grad_norm, applied = self._step(optimizer_index, model.parameters(), clip, last, loss_finite)
            if applied:
                sums.merge(step_sums)
                sums.add({"grad_norm": grad_norm, "loss": minibatch_loss}, 1.0, prefix)
            else:
                skips += 1
                rank_zero_warn(f"{prefix} optimizer step skipped at policy version {self.version} (minibatch "
                               f"{i + 1} of {len(minibatches)}): loss {minibatch_loss}, gradient norm "
                               f"{grad_norm}; the weights and optimizer state are unchanged")
        sums.add({"skipped_steps": float(skips)}, 1.0, prefix)
        return skips

    def _equalised_micro_batches(self, rows: list[int], lengths: list[int], max_tokens: int) -> list[list[int]]:
        """Micro-batches of ``rows``, padded with empty ones up to the largest count over ranks."""
        mbs = micro_batches(rows, lengths, max_tokens)
        return mbs + [[] for _ in range(self._world_max(len(mbs)) - len(mbs))]

    # ------------------------------------------------------------------ evaluation (lit_ppo.rollout.evaluation)
    def on_validation_epoch_start(self) -> None:
        self._eval_sums = torch.zeros(len(SUMS), dtype=torch.float64)

    def validation_step(self, batch: list[int], batch_idx: int) -> None:
        """Score test problems ``batch`` (indices into the task's test split) through the engine."""
        if stop_requested():  # stopping: the checkpoint matters now, not the scores
            return
        self._eval_sums += self.trainer.datamodule.evaluate(batch)

    def on_validation_epoch_end(self) -> None:
        """Add the sums over ranks and log the means (every rank calls this exactly once)."""
        datamodule = self.trainer.datamodule
        sums = self.trainer.strategy.reduce(self._eval_sums.to(self.device), reduce_op="sum").cpu()
        metrics = eval_metrics(sums, datamodule.eval.k)
        # Float64 tensors: Lightning would store Python floats in float32. An evaluation that a stop cut
        # short scored only part of the split: no score.
        if metrics and not stop_requested():
            self.log_dict({k: torch.tensor(v, dtype=torch.float64) for k, v in metrics.items()}, on_step=False,
                          on_epoch=True, sync_dist=False, batch_size=1)
        datamodule.engine.sleep()

    on_test_epoch_start = on_validation_epoch_start
    test_step = validation_step
    on_test_epoch_end = on_validation_epoch_end

    # ------------------------------------------------------------------ metrics
    def _log_iteration(self, metrics: dict[str, float], start: float, n_tokens: int,
                       weights: dict[str, float] | None = None) -> None:
        """One all-reduce for every metric of the iteration, then log them: ``SUMMED`` metrics add up
        over ranks, the others are means over ranks weighted by ``weights`` (1 where not given), so
        that a rank with more samples counts for more, as in one process holding every rank's."""
        train_s = time.perf_counter() - start
        metrics["time/train_s"] = train_s
        # The iteration's wall time: generation, or with asynchronous rollouts the wait for the batch.
        waited = metrics.get("time/wait_for_batch_s", metrics.get("time/generate_s", 0.0))
        metrics["perf/tokens_per_s"] = n_tokens / max(train_s + waited, 1e-9)
        names = sorted(metrics)
        w = [1.0 if k in SUMMED else float((weights or {}).get(k, 1.0)) for k in names]
        packed = torch.tensor([float(metrics[k]) * wk for k, wk in zip(names, w)] + w, dtype=torch.float64,
                              device=self.device)
        totals = self.trainer.strategy.reduce(packed, reduce_op="sum").tolist()
        logged = {k: totals[i] if k in SUMMED else totals[i] / max(totals[len(names) + i], 1e-12)
                  for i, k in enumerate(names)}
        # batch_size only silences Lightning's epoch-averaging bookkeeping; nothing is averaged here.
        self.log_dict(logged, on_step=True, on_epoch=False, sync_dist=False, batch_size=1)
