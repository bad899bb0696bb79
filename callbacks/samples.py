"""Sample completions (prompt, completion, reward) of the training batches: a file in the run directory
whatever the logger, and a table in the tracked run."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import lightning as L
from lightning.pytorch.loggers import MLFlowLogger, WandbLogger

SAMPLES_FILE = "samples.jsonl"
"""File in the run directory (``trainer.default_root_dir``) that the samples are appended to."""
SAMPLES_TABLE = "samples/iteration_{iteration:06d}.json"
"""MLflow table artifact of one log of samples (the run's Artifacts tab shows it as a table)."""


class CompletionSamples(L.Callback):
    """Every ``every_n_steps`` iterations (the first one included), ``num_samples`` rows of the batch just
    trained on: appended to ``<run directory>/samples.jsonl`` as one JSON object per row (``iteration``,
    1-based as printed, ``prompt``, ``model_input`` (the tokens before the completion, decoded with the
    special tokens: the prompt as the model saw it, chat template applied), ``completion``, ``reward``
    and, for a task that sums several reward functions, ``rewards/<name>``: each one's value, null where
    it gave none), to a table ``samples/iteration_<k>.json`` of each MLflow run the trainer logs to, and
    as a ``samples`` table to each W&B run.

    Args:
        every_n_steps: log every this many RL iterations (the first one included); 0 logs none.
        num_samples: rows per log.
    """

    def __init__(self, every_n_steps: int = 10, num_samples: int = 8):
        if every_n_steps < 0 or num_samples < 1:
            raise ValueError(f"CompletionSamples(every_n_steps={every_n_steps}, num_samples={num_samples}) is "
                             "invalid: every_n_steps must be >= 0 (0: none) and num_samples positive")
        self.every_n_steps = every_n_steps
        self.num_samples = num_samples

    def on_train_batch_end(self, trainer: L.Trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        rollout = pl_module.last_batch
        iteration = trainer.global_step
        if (rollout is None or not rollout.completions or not self.every_n_steps
                or (iteration - 1) % self.every_n_steps or not trainer.is_global_zero):
            return
        n = min(self.num_samples, rollout.num_rows)
        terms = {name: values[:n].tolist() for name, values in rollout.reward_terms.items()}
        rows = [{"iteration": iteration, "prompt": rollout.prompts[b],
                 "model_input": _model_input(rollout, b, pl_module.tokenizer), "completion": rollout.completions[b],
                 "reward": float(rollout.rewards[b]),
                 **{f"rewards/{name}": None if math.isnan(values[b]) else values[b] for name, values in terms.items()}}
                for b in range(n)]
        self._append(Path(trainer.default_root_dir) / SAMPLES_FILE, rows)
        for logger in trainer.loggers:
            if isinstance(logger, MLFlowLogger) and logger.run_id:
                # One table per log: appending to one re-reads it through pandas, which turns a completion
                # of digits into a number ("047" -> 47).
                columns = {key: [row[key] for row in rows] for key in rows[0]}
                logger.experiment.log_table(logger.run_id, columns, SAMPLES_TABLE.format(iteration=iteration))
            elif isinstance(logger, WandbLogger):
                logger.log_table("samples", columns=list(rows[0]), data=[list(row.values()) for row in rows],
                                 step=iteration)

    @staticmethod
    def _append(path: Path, rows: list[dict]) -> None:
        # One write of whole lines with O_APPEND: a kill leaves the file ending at a row's end.
        path.parent.mkdir(parents=True, exist_ok=True)
        data = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows).encode()
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o666)
        try:
            while data:
                data = data[os.write(fd, data):]
        finally:
            os.close(fd)


def _model_input(rollout, row: int, tokenizer) -> str:
    """Row ``row``'s tokens before its first generated one, decoded with the special tokens."""
    generated = rollout.loss_mask[row].nonzero()
    start = int(generated[0]) if len(generated) else int(rollout.attention_mask[row].sum())
    return tokenizer.decode(rollout.input_ids[row, :start].tolist(), skip_special_tokens=False)
