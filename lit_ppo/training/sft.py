"""LitSFT: supervised fine-tuning of the policy that ``fit`` trains, on the examples of
``lit_ppo.training.sft_data``. The loss is the mean negative log-likelihood over the tokens the examples'
masks count (their completions), across the batch:

    L = - sum_{b,t} m_bt log pi_theta(y_bt | y_b<t) / sum_{b,t} m_bt

computed by ``lit_ppo.models.token_logprobs`` (the LM head in chunks: no ``[tokens x vocab]`` logits stay).
Its checkpoints hold the policy's weights under the names LitPPO's do, with the same ``model``
hyperparameters, so ``python -m lit_ppo export`` reads them, and a record of what made them (``sft_record``:
the job, the model, the data and its files' digests), which a resume checks; the final model directory is
what ``fit model=<dir>`` starts from."""

from __future__ import annotations

from dataclasses import asdict

import lightning as L
import torch

from lit_ppo.callbacks.export import ExportModel
from lit_ppo.callbacks.graceful_stop import GracefulStop, last_checkpoint_path
from lit_ppo.callbacks.progress import IterationProgress
from lit_ppo.callbacks.summary import RunSummary, places
from lit_ppo.config import ModelConfig
from lit_ppo.config.sft import SFTActorConfig
from lit_ppo.models import load_policy, token_logprobs
from lit_ppo.models.lora import add_lora, lora_config, merged_model
from lit_ppo.training.checkpoint_io import install_checkpoint_io
from lit_ppo.training.optim import adamw_with_schedule
from lit_ppo.training.record import RECORD_KEY, SFT_ALGO, sft_record
from lit_ppo.utils.fs import shown_path


class ExampleJobModule(L.LightningModule):
    """What the jobs that train one model on examples of their own (sft, rm) do alike: AdamW and its schedule
    over the trainable weights of ``trained_model()``, clipped by ``actor.optimizer.gradient_clipping``;
    fit's graceful stop and final export; atomic, finite-only checkpoints recording the job (``RECORD_ALGO``),
    the model and the data."""

    RECORD_ALGO = SFT_ALGO
    """The ``algo`` of the checkpoints' record: what tells this job's checkpoints from the others'."""

    def trained_model(self) -> torch.nn.Module:
        raise NotImplementedError

    def configure_optimizers(self):
        params = [p for p in self.trained_model().parameters() if p.requires_grad]
        # Over trainer.max_steps (the run's steps), not estimated_stepping_batches: that would build the training
        # batches before a resume has restored the step they start from.
        optimizer, scheduler = adamw_with_schedule(params, self.optimizer_cfg, self.trainer.max_steps)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    def configure_gradient_clipping(self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None) -> None:
        if self.optimizer_cfg.gradient_clipping is not None:
            self.clip_gradients(optimizer, gradient_clip_val=self.optimizer_cfg.gradient_clipping,
                                gradient_clip_algorithm="norm")

    def configure_callbacks(self):
        # A stop signal ends the step, writes last.ckpt and exits 128 + the signal, as fit does.
        exports = [] if any(isinstance(c, ExportModel) for c in self.trainer.callbacks) else [ExportModel()]
        return [GracefulStop(), *exports]

    def setup(self, stage: str) -> None:
        install_checkpoint_io(self.trainer.strategy)  # atomic, finite-only checkpoints, as fit's

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        # What resuming must match, as LitPPO's record: the job, the model and the data (its files' digests).
        data = self.trainer.datamodule
        checkpoint.setdefault(RECORD_KEY, {}).update(
            sft_record(self.model_cfg, data.task, data.task_kwargs, algo=self.RECORD_ALGO))


class LitSFT(ExampleJobModule):
    """The policy of ``model`` trained on completions.

    Args:
        model: the language model (``model.*``, as fit's).
        actor: what trains it (``actor.optimizer.*``, as fit's): AdamW and its schedule, over the run's
            optimizer steps.
        algo: the job's name, recorded as the run's ``algo`` tag and in its directory's name.
    """

    def __init__(self, model: ModelConfig, actor: SFTActorConfig, algo: str = "sft"):
        super().__init__()
        self.model_cfg = model
        self.optimizer_cfg = actor.optimizer
        self.save_hyperparameters({"model": asdict(model), "actor": asdict(actor), "algo": algo}, logger=False)
        self.policy, self.tokenizer = load_policy(model)
        if model.lora_rank > 0:
            add_lora(self.policy, lora_config(model))

    def trained_model(self) -> torch.nn.Module:
        return self.policy

    def full_policy(self):
        """The policy as one plain transformers model (the adapters merged): what the export writes."""
        return merged_model(self.policy)

    def nll(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """``(sum of -log pi over the counted tokens, their number)`` of ``batch``."""
        logp, _ = token_logprobs(self.policy, batch["input_ids"], batch["attention_mask"],
                                 loss_mask=batch["loss_mask"], chunk_size=self.model_cfg.logprob_chunk_size)
        mask = batch["loss_mask"]
        return -(logp * mask).sum(), mask.sum()

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        total, count = self.nll(batch)
        # The token mean over the whole batch, across ranks (DDP averages the gradients of equal shares).
        tokens = self.trainer.strategy.reduce(count.float(), reduce_op="sum")
        loss = total / tokens.clamp(min=1) * self.trainer.world_size
        self.log("sft/loss", total.detach() / count.clamp(min=1), prog_bar=True, batch_size=int(count))
        # The optimizer steps done after this one: the loggers' step, and what the checkpoints rank by (newest).
        self.log("step", float(self.trainer.global_step + 1))
        self.log("sft/lr", self.trainer.optimizers[0].param_groups[0]["lr"])
        return loss

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        total, count = self.nll(batch)
        # Weighted by tokens: the epoch's value is the test split's token-mean NLL.
        self.log("sft/val_loss", total / count.clamp(min=1), batch_size=int(count), sync_dist=True, prog_bar=True)


class SFTProgress(IterationProgress):
    """Fit's progress (``IterationProgress``) in the run's optimizer steps, with the training loss and learning
    rate: on a terminal the rich bar; elsewhere a plain line on stdout per tenth of the run (and the last),
    ``sft step 40/400 loss 1.23 lr 2e-05 eta 0:01:10``. Each evaluation of the test split is a line,
    ``sft epoch 1 val_loss 0.9870``. Rank 0 only."""

    description = "sft step"
    shown = {"loss": "sft/loss", "lr": "sft/lr"}
    narrow_order = ("loss", "lr")

    @staticmethod
    def plain_line_due(trainer: L.Trainer, step: int, total: int | float) -> bool:
        return step % max(1, int(total) // 10) == 0 or step == total

    def evaluation_line(self, trainer: L.Trainer) -> str | None:
        value = trainer.callback_metrics.get("sft/val_loss")
        if value is None:
            return None
        epoch = round(trainer.global_step * trainer.accumulate_grad_batches / trainer.val_check_interval)
        return f"sft epoch {epoch} val_loss {float(value):.4f}"


class ExampleJobSummary(RunSummary):
    """The block that ends a run of a job on examples of its own (sft, rm), as ``RunSummary`` ends a fit (on
    stdout, and ``summary.txt`` in the run directory and each tracked run): the steps and time, the training loss
    (``<JOB>/loss``) of the first and last step of this session, the last evaluation on the test split
    (``<JOB>/val_*``, ``evaluation_rows``), where the outputs are, the command that resumes a run stopped early,
    and the rows of the exported model directory (``model_rows``)."""

    JOB = "sft"
    """The job's command and the prefix of its metrics."""

    def __init__(self):
        super().__init__()
        self._first_loss: tuple[int, float] | None = None
        """``(step, training loss)`` of this session's first step."""
        self._last_loss: tuple[int, float] | None = None
        """``(step, training loss)`` of this session's last step."""
        self._val: tuple[int, dict[str, float]] | None = None
        """``(step, the last evaluation's <JOB>/val_* values by name)``."""

    def on_train_start(self, trainer: L.Trainer, pl_module) -> None:
        super().on_train_start(trainer, pl_module)
        self._first_loss = self._last_loss = self._val = None

    def on_train_batch_end(self, trainer: L.Trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        loss = trainer.callback_metrics.get(f"{self.JOB}/loss")
        if loss is not None:
            self._last_loss = (trainer.global_step, float(loss))
            self._first_loss = self._first_loss or self._last_loss

    def on_validation_end(self, trainer: L.Trainer, pl_module) -> None:
        prefix = f"{self.JOB}/val_"
        values = {key.removeprefix(prefix): float(value) for key, value in trainer.callback_metrics.items()
                  if key.startswith(prefix)}
        if values and not trainer.sanity_checking:
            self._val = (trainer.global_step, values)

    def evaluation_rows(self, step: int, values: dict[str, float]) -> list[tuple[str, str]]:
        """The summary's rows of the last evaluation (at ``step``, ``values`` by name)."""
        return [("val_loss", f"{values['loss']:.4g} (step {step})")]

    def model_rows(self, model_dir) -> list[tuple[str, str]]:
        """The summary's rows of the exported model directory ``model_dir``."""
        return [("fit from model", f"python -m lit_ppo fit model={shown_path(model_dir)}")]

    def lines(self, trainer: L.Trainer) -> list[tuple[str, str]]:
        rows = [("steps", self.progress(trainer))]
        if self._first_loss is not None and self._last_loss is not None:
            (first_step, first), (last_step, last) = self._first_loss, self._last_loss
            rows.append(("loss", f"{first:.4g} (step {first_step}) -> {last:.4g} (step {last_step})"))
        if self._val is not None:
            rows += self.evaluation_rows(*self._val)
        rows += places(trainer)
        checkpoint = last_checkpoint_path(trainer)
        if checkpoint.exists() and trainer.global_step < trainer.max_steps:
            rows.append(("resume", f"python -m lit_ppo {self.JOB} --ckpt_path {shown_path(checkpoint)}"))
        for callback in trainer.callbacks:
            model_dir = callback.output_dir(trainer) if isinstance(callback, ExportModel) else None
            if model_dir is not None and (model_dir / "config.json").is_file():
                rows += self.model_rows(model_dir)
        return rows


class SFTSummary(ExampleJobSummary):
    """The block that ends an sft run (``ExampleJobSummary``): its last loss on the test split, and the command
    that starts RL from its model (which records its base model: fit chooses that model's settings)."""
