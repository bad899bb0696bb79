"""Progress in RL iterations, on a terminal and in a log file alike."""

from __future__ import annotations

import math
import sys
import time

import lightning as L
from lightning.pytorch.callbacks import RichProgressBar
from lightning.pytorch.callbacks.progress.rich_progress import BatchesProcessedColumn, CustomBarColumn, CustomTimeColumn
from rich.progress import TextColumn

from lit_ppo.utils.stop_requests import stop_requested

SHOWN = {"reward": "rollout/reward_mean", "kl": "actor/kl_ref", "approx_kl": "actor/approx_kl",
         "entropy": "actor/entropy", "length": "rollout/response_length"}
"""Progress name -> logged metric: ``kl`` is TRL's, the KL to the reference model or the teacher (logged only with
one), ``approx_kl`` the policy's change in each update."""
BAR_WIDTH = 12
"""Characters of the bar itself: with the counts, the times and the reward it fits 80 columns."""
NARROW_ORDER = ("reward", "s/it", "kl", "approx_kl", "entropy", "length")
"""What the bar keeps first when the terminal is too narrow for every metric."""


def _seconds_per_iteration(metrics: dict) -> float | None:
    parts = [metrics.get(k) for k in ("time/generate_s", "time/train_s", "time/sync_s")]
    return sum(float(p) for p in parts if p is not None) if any(p is not None for p in parts) else None


def _clock(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


class IterationProgress(RichProgressBar):
    """``iteration i/N`` with its ETA, reward, KL to the reference or teacher (with one), the policy's change per
    update, entropy, response length and seconds per iteration.

    On a terminal this is Lightning's rich bar counting RL iterations (not epochs: the prompt stream
    has none). When stdout is not a terminal (nohup, Slurm, CI logs), where a live bar shows nothing
    until the run ends, it prints one plain line every ``trainer.log_every_n_steps`` iterations.
    Another job's progress (sft's) counts its own steps with its own metrics: ``description``, ``shown``,
    ``narrow_order``, ``plain_line_due`` and ``evaluation_line``.
    """

    description = "iteration"
    """What the bar counts, and the first word of each plain line."""
    shown = SHOWN
    """Progress name -> logged metric."""
    narrow_order = NARROW_ORDER
    """What the bar keeps first when the terminal is too narrow for every metric."""

    def __init__(self):
        super().__init__(leave=True)
        self.plain = not sys.stdout.isatty()
        self._started = 0.0
        self._first_step = 0

    @property
    def is_enabled(self) -> bool:
        return super().is_enabled and not self.plain

    @property
    def total_train_batches(self) -> int | float:
        return self.trainer.max_steps if self.trainer.max_steps > 0 else float("inf")

    def _get_train_description(self, current_epoch: int) -> str:
        return self.description

    def configure_columns(self, trainer: L.Trainer) -> list:
        # Lightning's columns less the speed (iterations per second: s/it is among the metrics), the bar
        # narrower, so that a bar and its metrics fit one line of an 80-column terminal.
        return [TextColumn("[progress.description]{task.description}"),
                CustomBarColumn(bar_width=BAR_WIDTH, complete_style=self.theme.progress_bar,
                                finished_style=self.theme.progress_bar_finished,
                                pulse_style=self.theme.progress_bar_pulse),
                BatchesProcessedColumn(style=self.theme.batch_progress), CustomTimeColumn(style=self.theme.time)]

    def get_metrics(self, trainer: L.Trainer, pl_module) -> dict:
        logged = trainer.callback_metrics
        shown = {name: float(logged[key]) for name, key in self.shown.items() if key in logged}
        seconds = _seconds_per_iteration(logged)
        if seconds is not None:
            shown["s/it"] = seconds
        shown = {k: (f"{v:.3g}" if isinstance(v, float) else v) for k, v in shown.items()}
        if self.plain or self._console is None:
            return shown
        return self._fitting(shown, self._console.width - self._columns_width())

    def _columns_width(self) -> int:
        """Characters of the line before the metrics: description, bar, ``i/N``, ``elapsed • left``, and
        the one space rich puts between columns."""
        total = self.total_train_batches
        counts = 2 * len(str(total)) + 1 if math.isfinite(total) else 6
        return len(self.description) + BAR_WIDTH + counts + len("0:00:00 • 0:00:00") + 4

    def _fitting(self, shown: dict[str, str], width: int) -> dict[str, str]:
        """The metrics of ``shown`` that fit ``width`` characters as rich writes them (``name: value``,
        one space apart), the most telling first (``narrow_order``), in their usual order."""
        kept, used = set(), 0
        for name in (n for n in self.narrow_order if n in shown):
            size = len(f"{name}: {shown[name]}") + (1 if kept else 0)
            if used + size > width:
                break
            kept.add(name)
            used += size
        return {k: v for k, v in shown.items() if k in kept}

    def on_train_start(self, trainer: L.Trainer, pl_module) -> None:
        super().on_train_start(trainer, pl_module)
        self._started, self._first_step = time.perf_counter(), trainer.global_step

    def on_train_batch_end(self, trainer: L.Trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        if not self.plain:
            super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
            self._update(self.train_progress_bar_id, trainer.global_step)  # resumed runs start past 0
            return
        step, total = trainer.global_step, self.total_train_batches
        if not self.plain_line_due(trainer, step, total):
            return
        done = step - self._first_step
        per_iteration = (time.perf_counter() - self._started) / max(done, 1)
        eta = f" eta {_clock(per_iteration * (total - step))}" if math.isfinite(total) else ""
        shown = " ".join(f"{k} {v}" for k, v in self.get_metrics(trainer, pl_module).items())
        of_total = f"/{total}" if math.isfinite(total) else ""
        if trainer.is_global_zero:
            print(f"{self.description} {step}{of_total} {shown}{eta}", flush=True)

    @staticmethod
    def plain_line_due(trainer: L.Trainer, step: int, total: int | float) -> bool:
        """Whether a plain line reports ``step`` of ``total``: every ``trainer.log_every_n_steps``, and the last."""
        return step % max(trainer.log_every_n_steps, 1) == 0 or step == total

    def on_fit_end(self, trainer: L.Trainer, pl_module) -> None:
        # The bar's last state stays above what follows it (the run summary), not redrawn below it.
        if not self.plain:
            self._stop_progress()

    def on_validation_end(self, trainer: L.Trainer, pl_module) -> None:
        super().on_validation_end(trainer, pl_module)
        if not trainer.is_global_zero or trainer.state.fn != "fit" or trainer.sanity_checking:
            return  # validate / test print Lightning's table instead
        if stop_requested():
            return  # a stop cut the evaluation short: it logged no score, and an earlier one's is not this one's
        line = self.evaluation_line(trainer)
        if line is None:
            return
        if self.plain:
            print(line, flush=True)
        else:
            self._console.print(line)

    def evaluation_line(self, trainer: L.Trainer) -> str | None:
        """The line of an evaluation during the fit: its scores (``eval/*``), None without any."""
        scores = {key.split("/", 1)[1]: float(value) for key, value in trainer.callback_metrics.items()
                  if key.startswith("eval/") and key != "eval/problems"}
        if not scores:
            return None
        return f"eval at iteration {trainer.global_step}: " + " ".join(f"{k} {v:.3g}" for k, v in scores.items())
