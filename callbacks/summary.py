"""The block that ends a fit: what was trained and how it went, where everything is, and what to run next."""

from __future__ import annotations

import os
import time
from pathlib import Path

import lightning as L
from lightning.pytorch.loggers import MLFlowLogger, WandbLogger

from lit_ppo.callbacks.export import ExportModel
from lit_ppo.callbacks.graceful_stop import last_checkpoint_path

REWARD = "rollout/reward_mean"
SUMMARY_FILE = "summary.txt"
"""The summary's file in the run directory (``trainer.default_root_dir``) and in each tracked run."""


def _shown(path: str | os.PathLike) -> str:
    """``path`` relative to the working directory when it lies inside it (shorter to copy), else absolute."""
    absolute = Path(path).absolute()
    return str(absolute.relative_to(Path.cwd())) if absolute.is_relative_to(Path.cwd()) else str(absolute)


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    hours, minutes = divmod(seconds // 60, 60)
    return f"{hours} h {minutes} min" if hours else f"{minutes} min {seconds % 60} s" if minutes else f"{seconds} s"


class RunSummary(L.Callback):
    """When a fit ends (its last iteration, or stopped by a signal), rank 0 prints a block to stdout and
    writes it to ``summary.txt`` in the run directory and in each MLflow and W&B run: the iterations and time, the reward of the first and
    last iteration of this session, the last evaluation's scores, the run directory, the last checkpoint,
    the exported model, the MLflow run, and the commands that resume a run stopped early, score the
    checkpoint on the test split and export it."""

    def __init__(self):
        self._started = 0.0
        self._first_step = 0
        self._rewards: list[tuple[int, float]] = []
        self._eval: tuple[int, dict[str, float]] | None = None

    def on_train_start(self, trainer: L.Trainer, pl_module) -> None:
        self._started, self._first_step, self._rewards, self._eval = time.monotonic(), trainer.global_step, [], None

    def on_train_batch_end(self, trainer: L.Trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        reward = trainer.callback_metrics.get(REWARD)
        if reward is not None:
            self._rewards.append((trainer.global_step, float(reward)))

    def on_validation_end(self, trainer: L.Trainer, pl_module) -> None:
        scores = {key: float(value) for key, value in trainer.callback_metrics.items()
                  if key.startswith("eval/") and key != "eval/problems"}
        if trainer.state.fn == "fit" and scores:
            self._eval = (trainer.global_step, scores)

    def on_fit_end(self, trainer: L.Trainer, pl_module) -> None:
        if not trainer.is_global_zero:
            return
        text = "\n".join(["run summary", *(f"  {key:<15}{value}" for key, value in self.lines(trainer))]) + "\n"
        print(text, end="", flush=True)
        path = Path(trainer.default_root_dir) / SUMMARY_FILE
        path.write_text(text)
        for logger in trainer.loggers:
            if isinstance(logger, MLFlowLogger) and logger.run_id:
                logger.experiment.log_text(logger.run_id, text, SUMMARY_FILE)
            elif isinstance(logger, WandbLogger):
                logger.experiment.save(str(path), base_path=str(path.parent), policy="now")

    def lines(self, trainer: L.Trainer) -> list[tuple[str, str]]:
        """The summary's ``(label, value)`` rows."""
        done = trainer.global_step - self._first_step
        of = f" of {trainer.max_steps}" if trainer.max_steps > 0 else ""
        rows = [("iterations", f"{trainer.global_step}{of} ({done} in {_duration(time.monotonic() - self._started)}"
                               f"{' after resuming' if self._first_step else ''})")]
        if self._rewards:
            (first_step, first), (last_step, last) = self._rewards[0], self._rewards[-1]
            rows.append(("reward", f"{first:.3g} (iteration {first_step}) -> {last:.3g} (iteration {last_step})"))
        if self._eval is not None:
            step, scores = self._eval
            shown = ", ".join(f"{key.removeprefix('eval/')} {value:.3g}" for key, value in scores.items())
            rows.append(("eval", f"{shown} (iteration {step})"))
        rows.append(("run directory", _shown(trainer.default_root_dir)))
        checkpoint = last_checkpoint_path(trainer)
        if checkpoint.exists():
            rows.append(("checkpoint", _shown(checkpoint)))
        for callback in trainer.callbacks:
            if isinstance(callback, ExportModel) and (callback.output_dir(trainer) / "config.json").is_file():
                rows.append(("model", f"{_shown(callback.output_dir(trainer))} (a Hugging Face model directory)"))
        for logger in trainer.loggers:
            if isinstance(logger, MLFlowLogger) and logger.run_id:
                experiment = logger.experiment.get_experiment(logger.experiment_id)  # None: the store failed
                named = f" (experiment {experiment.name})" if experiment is not None else ""
                rows.append(("mlflow run", f"{logger.run_id} in {logger.experiment.tracking_uri}{named}"))
        if checkpoint.exists():
            config = Path(trainer.default_root_dir) / "config.yaml"
            if trainer.global_step < trainer.max_steps and config.is_file():
                rows.append(("resume", f"python -m lit_ppo fit --config {_shown(config)} --ckpt_path {_shown(checkpoint)}"))
            rows += [("test scores", f"python -m lit_ppo validate --ckpt_path {_shown(checkpoint)}"),
                     ("export", f"python -m lit_ppo export --ckpt_path {_shown(checkpoint)} --output my-policy")]
        return rows
