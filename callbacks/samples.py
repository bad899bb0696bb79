"""Log sample completions (prompt, completion, reward) of the training batches as run artifacts."""

from __future__ import annotations

import json

import lightning as L


class CompletionSamples(L.Callback):
    """Every ``every_n_steps`` iterations, write ``num_samples`` rows of the batch just trained on to
    ``samples/step_<k>.json`` through the logger (MLflow artifact, or a file for other loggers).

    Args:
        every_n_steps: log every this many RL iterations (the first one included).
        num_samples: rows per log.
    """

    def __init__(self, every_n_steps: int = 10, num_samples: int = 8):
        if every_n_steps < 1 or num_samples < 1:
            raise ValueError(f"CompletionSamples(every_n_steps={every_n_steps}, num_samples={num_samples}) is "
                             "invalid: both must be positive integers")
        self.every_n_steps = every_n_steps
        self.num_samples = num_samples

    def on_train_batch_end(self, trainer: L.Trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        rollout = pl_module.last_batch
        step = pl_module.version - 1
        if rollout is None or not rollout.completions or step % self.every_n_steps or not trainer.is_global_zero:
            return
        rows = [{"prompt": p, "completion": c, "reward": float(r)}
                for p, c, r in zip(rollout.prompts, rollout.completions, rollout.rewards.tolist())][:self.num_samples]
        text = json.dumps({"step": step, "samples": rows}, indent=1)
        for logger in trainer.loggers:
            experiment = logger.experiment
            if hasattr(experiment, "log_text") and getattr(logger, "run_id", None):
                experiment.log_text(logger.run_id, text, f"samples/step_{step:06d}.json")
