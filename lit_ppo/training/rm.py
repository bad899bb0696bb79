"""LitRM: a reward model trained on the preference pairs of ``lit_ppo.training.rm_data`` with the Bradley-Terry
loss of TRL's RewardTrainer (``lit_ppo.algos.preference``):

    L = mean_pairs( -log sigmoid(r_chosen - r_rejected - margin) ) + c * mean_pairs( (r_chosen + r_rejected)^2 )

``r`` the scalar head's output at a side's last token (``lit_ppo.models.reward_model``), ``c``
``rm.center_rewards_coefficient`` (no term when None). The reward model is the sequence classifier of the model
section's causal LM (its body, a fresh head), trained whole or through LoRA adapters (``model.lora_rank``, the
head trained beside them). Its checkpoints hold its weights under ``reward_model.`` with the same ``model``
hyperparameters as LitPPO's and a record of what made them (the job ``rm``, the model, the data and its files'
digests), which a resume checks. The final model directory (``model/``) is an ``AutoModelForSequenceClassification``
directory that ``reward_fns`` and plain transformers load, recording the mean and spread of its rewards over the
training pairs (``lit_ppo.config.model.REWARD_STATISTICS``), which ``reward_fns`` normalises with by default."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, replace

import lightning as L
import torch

from lit_ppo.algos.preference import bradley_terry_loss, pair_metrics
from lit_ppo.callbacks.progress import IterationProgress
from lit_ppo.config import ModelConfig
from lit_ppo.config.model import REWARD_STATISTICS, recorded_reward_statistics
from lit_ppo.config.rm import RM_ALGO
from lit_ppo.config.sft import SFTActorConfig
from lit_ppo.models import load_policy
from lit_ppo.models.lora import add_lora, lora_config
from lit_ppo.models.reward_model import merged_reward_model, reward_model_from, rewards
from lit_ppo.training.sft import ExampleJobModule, ExampleJobSummary
from lit_ppo.utils.fs import shown_path

HEAD = "score"
"""The name of the scalar head of transformers' sequence classifiers."""
METRICS = ("loss", "accuracy", "margin", "reward_mean", "reward_std")
"""What each step and each evaluation logs, as ``rm/<name>`` and ``rm/val_<name>``: the loss, the share of pairs
whose chosen side scores higher, the mean of ``r_chosen - r_rejected``, and the mean and spread of the rewards of
both sides."""


def summed_metrics(sums: dict[str, torch.Tensor]) -> dict[str, float]:
    """``METRICS`` but the loss, from ``pair_metrics`` sums (added over batches and ranks)."""
    pairs = float(sums["pairs"])
    mean = float(sums["reward"]) / (2 * pairs)
    variance = max(float(sums["reward_sq"]) / (2 * pairs) - mean * mean, 0.0)
    return {"accuracy": float(sums["correct"]) / pairs, "margin": float(sums["margin"]) / pairs,
            "reward_mean": mean, "reward_std": variance ** 0.5}


def reward_model_lora(model_cfg: ModelConfig):
    """peft's ``LoraConfig`` of the ``model.lora_*`` settings for a reward model: adapters on its body only; its
    new scalar head (``score``) trains whole beside them, as TRL trains a sequence classifier's head
    (``modules_to_save``)."""
    return replace(lora_config(model_cfg), exclude_modules=[HEAD])


@torch.no_grad()
def reward_statistics(model, batches: Iterable[dict[str, torch.Tensor]]) -> dict[str, float]:
    """The mean and spread (``std``) of ``model``'s rewards of both sides of every pair of ``batches``
    (``collate_pairs``), and their number (``pairs``): what a reward model directory records
    (``REWARD_STATISTICS``), at the end of an rm run and in the export of its checkpoint."""
    was_training = model.training
    model.eval()
    sums: dict[str, torch.Tensor] = {}
    for batch in batches:
        scored = rewards(model, batch["input_ids"], batch["attention_mask"])
        pairs = len(batch["margin"])
        for name, value in pair_metrics(scored[:pairs], scored[pairs:]).items():
            sums[name] = sums.get(name, 0) + value
    model.train(was_training)
    found = summed_metrics(sums)
    return {"mean": found["reward_mean"], "std": found["reward_std"], "pairs": int(sums["pairs"])}


class LitRM(ExampleJobModule):
    """A reward model over ``model``'s causal LM, trained on preference pairs.

    Args:
        model: the language model whose body the reward model takes (``model.*``, as fit's).
        actor: what trains it (``actor.optimizer.*``, as fit's): AdamW and its schedule, over the run's
            optimizer steps.
        algo: the job's name, recorded as the run's ``algo`` tag and in its directory's name.
    """

    RECORD_ALGO = RM_ALGO

    def __init__(self, model: ModelConfig, actor: SFTActorConfig, algo: str = RM_ALGO):
        super().__init__()
        self.model_cfg = model
        self.optimizer_cfg = actor.optimizer
        self.save_hyperparameters({"model": asdict(model), "actor": asdict(actor), "algo": algo}, logger=False)
        policy, self.tokenizer = load_policy(model)
        self.reward_model = reward_model_from(policy, self.tokenizer)
        del policy
        if model.gradient_checkpointing:
            self.reward_model.gradient_checkpointing_enable()
        if model.lora_rank > 0:
            add_lora(self.reward_model, reward_model_lora(model))
            getattr(self.reward_model, HEAD).requires_grad_(True)  # new: it trains whole beside the adapters
        self._val_sums: dict[str, torch.Tensor] = {}

    def trained_model(self) -> torch.nn.Module:
        return self.reward_model

    def scores(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """``(r_chosen, r_rejected)`` of a batch of pairs (``collate_pairs``), ``[B]`` each."""
        scored = rewards(self.reward_model, batch["input_ids"], batch["attention_mask"])
        return scored[:len(batch["margin"])], scored[len(batch["margin"]):]

    def loss(self, chosen: torch.Tensor, rejected: torch.Tensor, margin: torch.Tensor) -> torch.Tensor:
        """The Bradley-Terry loss of the pairs, with the run's reward centering."""
        return bradley_terry_loss(chosen, rejected, margin, self.trainer.datamodule.cfg.center_rewards_coefficient)

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        chosen, rejected = self.scores(batch)
        loss = self.loss(chosen, rejected, batch["margin"])
        # The mean over the step's pairs across ranks (DDP averages the gradients of equal shares).
        pairs = self.trainer.strategy.reduce(torch.tensor(float(len(chosen)), device=chosen.device), reduce_op="sum")
        n = len(chosen)
        self.log("rm/loss", loss.detach(), prog_bar=True, batch_size=n)
        for name, value in summed_metrics(pair_metrics(chosen, rejected)).items():
            self.log(f"rm/{name}", value, batch_size=n)
        # The optimizer steps done after this one: the loggers' step, and what the checkpoints rank by (newest).
        self.log("step", float(self.trainer.global_step + 1))
        self.log("rm/lr", self.trainer.optimizers[0].param_groups[0]["lr"])
        return loss * n / pairs * self.trainer.world_size

    def on_validation_epoch_start(self) -> None:
        self._val_sums = {}

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        chosen, rejected = self.scores(batch)
        sums = pair_metrics(chosen, rejected)
        sums["loss"] = self.loss(chosen, rejected, batch["margin"]).detach() * len(chosen)
        for name, value in sums.items():
            self._val_sums[name] = self._val_sums.get(name, 0) + value

    def on_validation_epoch_end(self) -> None:
        if not self._val_sums:
            return
        # The whole test split's values: the sums of every batch of every rank.
        sums = {name: self.trainer.strategy.reduce(value, reduce_op="sum") for name, value in self._val_sums.items()}
        self.log("step", float(self.trainer.global_step))  # the loggers' step: the optimizer steps it evaluates
        self.log("rm/val_loss", float(sums["loss"]) / float(sums["pairs"]))
        for name, value in summed_metrics(sums).items():
            self.log(f"rm/val_{name}", value)

    def full_policy(self):
        """The reward model as one plain transformers sequence classifier (the adapters merged): what the export
        writes."""
        return merged_reward_model(self.reward_model)

    def exported_record(self) -> dict:
        """What the model directory records besides its base model (``ExportModel``): the reward statistics over
        the training pairs (``reward_statistics``)."""
        datamodule = self.trainer.datamodule
        batches = datamodule.loader(datamodule.examples["train"], batch_size=datamodule.cfg.batch_size)
        moved = ({name: value.to(self.device) for name, value in batch.items()} for batch in batches)
        return {REWARD_STATISTICS: reward_statistics(self.reward_model, moved)}


class RMProgress(IterationProgress):
    """Fit's progress (``IterationProgress``) in the run's optimizer steps, with the training loss, pair accuracy
    and learning rate: on a terminal the rich bar; elsewhere a plain line on stdout per tenth of the run (and the
    last), ``rm step 40/400 loss 0.41 accuracy 0.875 lr 2e-05 eta 0:01:10``. Each evaluation of the test split is a
    line, ``rm epoch 1 val_accuracy 0.9500 val_margin 2.31 val_loss 0.1523 val_reward_mean 0.12 val_reward_std
    1.8``. Rank 0 only."""

    description = "rm step"
    shown = {"loss": "rm/loss", "accuracy": "rm/accuracy", "lr": "rm/lr"}
    narrow_order = ("loss", "accuracy", "lr")

    @staticmethod
    def plain_line_due(trainer: L.Trainer, step: int, total: int | float) -> bool:
        return step % max(1, int(total) // 10) == 0 or step == total

    def evaluation_line(self, trainer: L.Trainer) -> str | None:
        metrics = trainer.callback_metrics
        if "rm/val_accuracy" not in metrics:
            return None
        epoch = round(trainer.global_step * trainer.accumulate_grad_batches / trainer.val_check_interval)
        return (f"rm epoch {epoch} val_accuracy {float(metrics['rm/val_accuracy']):.4f} val_margin "
                f"{float(metrics['rm/val_margin']):.4g} val_loss {float(metrics['rm/val_loss']):.4f} val_reward_mean "
                f"{float(metrics['rm/val_reward_mean']):.4g} val_reward_std {float(metrics['rm/val_reward_std']):.4g}")


class RMSummary(ExampleJobSummary):
    """The block that ends an rm run (``ExampleJobSummary``): the last evaluation's pair accuracy, margin and loss
    on the test split, the reward statistics the model records, and the command that uses its model as a reward
    in ``fit``."""

    JOB = "rm"

    def evaluation_rows(self, step: int, values: dict[str, float]) -> list[tuple[str, str]]:
        return [("val_accuracy", f"{values['accuracy']:.4g} (step {step}; val_margin {values['margin']:.4g}, "
                                 f"val_loss {values['loss']:.4g})")]

    def model_rows(self, model_dir) -> list[tuple[str, str]]:
        rows = []
        statistics = recorded_reward_statistics(model_dir)
        if statistics:
            rows.append(("rewards", f"mean {statistics['mean']:.4g}, std {statistics['std']:.4g} over the training "
                                    f"pairs (reward_fns' default normalisation)"))
        rows.append(("fit against it", f"python -m lit_ppo fit data=dataset data.task_kwargs.train_path=<prompts> "
                                       f"'data.task_kwargs.reward_fns=[{shown_path(model_dir)}]'"))
        return rows
