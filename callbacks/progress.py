"""Progress in RL iterations and in evaluated test problems, on a terminal and in a log file alike."""

from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass
from datetime import timedelta

import lightning as L
from lightning.pytorch.callbacks import RichProgressBar
from lightning.pytorch.callbacks.progress.rich_progress import BatchesProcessedColumn, CustomBarColumn
from rich.progress import ProgressColumn, Task, TextColumn
from rich.text import Text

from lit_ppo.utils.stop_requests import stop_requested

SHOWN = {"reward": "rollout/reward_mean", "kl": "actor/kl_ref", "approx_kl": "actor/approx_kl",
         "entropy": "actor/entropy", "length": "rollout/response_length"}
"""Progress name -> logged metric: ``kl`` is TRL's, the KL to the reference model or the teacher (logged only with
one), ``approx_kl`` the policy's change in each update."""
BAR_WIDTH = 12
"""Characters of the bar itself: with the counts, the times and the reward it fits 80 columns."""
NARROW_ORDER = ("reward", "s/it", "kl", "approx_kl", "entropy", "length")
"""What the bar keeps first when the terminal is too narrow for every metric."""
EVALUATION_LINES = 10
"""Plain lines of an evaluation's progress besides its first and last: one per tenth of its problems."""
EVALUATION_LINE_SECONDS = 60.0
"""A plain line of an evaluation's progress at the first batch done this long after the previous line, when its
batches are slower than a tenth of it."""


def _seconds_per_iteration(metrics: dict) -> float | None:
    parts = [metrics.get(k) for k in ("time/generate_s", "time/train_s", "time/sync_s")]
    return sum(float(p) for p in parts if p is not None) if any(p is not None for p in parts) else None


def _clock(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def remaining_seconds(elapsed: float, done: int, total: int | float) -> float | None:
    """The time left at the mean pace so far (``elapsed`` seconds for ``done`` of ``total``); None before the
    first is done or without an end. The mean of the whole, not of the last seconds: an iteration or a batch
    of test problems may take minutes."""
    if done <= 0 or not math.isfinite(total):
        return None
    return elapsed / done * max(total - done, 0)


class MeanPaceTimeColumn(ProgressColumn):
    """``elapsed • left`` as Lightning's time column shows it, the time left at the mean pace since the bar
    started (``remaining_seconds``), counted from the task's field ``counted_from`` (the step it started at:
    a resumed run's, an sft epoch's): rich's own estimate looks at the last 30 seconds only, and has no answer
    when one step takes longer."""

    max_refresh = 0.5
    """Redrawn at most twice a second, so that the seconds do not jitter."""

    def __init__(self, style):
        self.style = style
        super().__init__()

    def render(self, task: Task) -> Text:
        elapsed = task.finished_time if task.finished else task.elapsed
        done = task.completed - task.fields.get("counted_from", 0)
        left = None if elapsed is None or task.total is None else remaining_seconds(elapsed, done, task.total)
        shown = ["-:--:--" if t is None else str(timedelta(seconds=int(t))) for t in (elapsed, left)]
        return Text(" • ".join(shown), style=self.style)


@dataclass
class EvaluationCount:
    """The problems that the running evaluation has scored, for its progress."""

    problems: int
    """This rank's share of the evaluation's test problems."""
    started: float
    """``time.perf_counter()`` at its start."""
    done: int = 0
    """Problems scored so far."""
    tenths: int = 0
    """Tenths of ``problems`` scored at the last plain line."""
    printed: float = 0.0
    """``time.perf_counter()`` at the last plain line."""

    def add(self, problems: int, now: float) -> bool:
        """Count ``problems`` more scored at ``now``; whether a plain line is due: at every tenth reached
        (``EVALUATION_LINES``), at the last problem, and when ``EVALUATION_LINE_SECONDS`` passed since the
        previous line."""
        self.done += problems
        tenths = EVALUATION_LINES * self.done // max(self.problems, 1)
        due = tenths > self.tenths or self.done >= self.problems or now - self.printed >= EVALUATION_LINE_SECONDS
        if due:
            self.tenths, self.printed = tenths, now
        return due


class IterationProgress(RichProgressBar):
    """``iteration i/N`` with its ETA, reward, KL to the reference or teacher (with one), the policy's change per
    update, entropy, response length and seconds per iteration.

    On a terminal this is Lightning's rich bar counting RL iterations (not epochs: the prompt stream
    has none). When stdout is not a terminal (nohup, Slurm, CI logs), where a live bar shows nothing
    until the run ends, it prints one plain line every ``trainer.log_every_n_steps`` iterations.
    Another job's progress (sft's) counts its own steps with its own metrics: ``description``, ``shown``,
    ``narrow_order``, ``plain_line_due`` and ``evaluation_line``.

    An evaluation of an RL task's test problems (during fit, and ``validate`` / ``test``) shows the same: a bar
    ``eval`` counting the problems scored with its ETA, or, when stdout is not a terminal, a plain line at its
    start, at each tenth of it (or a minute after the previous line) and at its end. Under DDP every rank scores
    its own share of the problems: rank 0 counts its share and says so. Another loader's evaluation (sft's) keeps
    Lightning's bar, which counts batches.
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
        self._evaluation: EvaluationCount | None = None
        """The count of the last evaluation of test problems."""

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
                BatchesProcessedColumn(style=self.theme.batch_progress), MeanPaceTimeColumn(style=self.theme.time)]

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

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module) -> None:
        super().on_train_epoch_start(trainer, pl_module)
        if self.progress is not None and self.train_progress_bar_id is not None:
            # The bar's clock starts here: its pace is that of the steps from here on (MeanPaceTimeColumn).
            self.progress.update(self.train_progress_bar_id, counted_from=trainer.global_step)

    def on_train_batch_end(self, trainer: L.Trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        if not self.plain:
            super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
            self._update(self.train_progress_bar_id, trainer.global_step)  # resumed runs start past 0
            return
        step, total = trainer.global_step, self.total_train_batches
        if not self.plain_line_due(trainer, step, total):
            return
        left = remaining_seconds(time.perf_counter() - self._started, step - self._first_step, total)
        eta = f" eta {_clock(left)}" if left is not None else ""
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

    # ------------------------------------------------------------------ evaluations
    @staticmethod
    def _test_problems(trainer: L.Trainer):
        """The running evaluation's loader when it holds test problems to count (an RL task's ``EvalBatches``:
        ``problems``, ``problems_in_all``, ``world_size``); None for another loader and a sanity check."""
        if trainer.sanity_checking:
            return None
        loader = trainer.test_dataloaders if trainer.testing else trainer.val_dataloaders
        return loader if hasattr(loader, "problems_in_all") else None

    def _start_evaluation(self, trainer: L.Trainer, loader) -> None:
        now = time.perf_counter()
        self._evaluation = EvaluationCount(loader.problems, started=now, printed=now)
        if not self.plain:
            if self.is_disabled or self.progress is None:
                return
            bar = self._add_task(loader.problems, self._evaluation_description(loader))
            if trainer.testing:
                self.test_progress_bar_id = bar
            else:
                if self.val_progress_bar_id is not None:  # the previous evaluation's
                    self.progress.update(self.val_progress_bar_id, advance=0, visible=False)
                self.val_progress_bar_id = bar  # Lightning hides it when an evaluation during fit ends
            self.refresh()
        elif trainer.is_global_zero:
            print(f"eval 0/{loader.problems} problems{self._share(loader)}", flush=True)

    def _count_evaluated(self, trainer: L.Trainer, loader, batch: list) -> None:
        if stop_requested():  # stopping: the rest of the problems go unscored
            return
        count, now = self._evaluation, time.perf_counter()
        line_due = count.add(len(batch), now)
        if not self.plain:  # drawn now: a batch takes seconds to minutes, and the last is hidden right after in fit
            self._update(self.test_progress_bar_id if trainer.testing else self.val_progress_bar_id, count.done,
                         hard=True)
        elif line_due and trainer.is_global_zero:
            left = remaining_seconds(now - count.started, count.done, count.problems)
            print(f"eval {count.done}/{count.problems} problems{self._share(loader)} eta {_clock(left)}", flush=True)

    @staticmethod
    def _evaluation_description(loader) -> str:
        """The bar's name: ``eval``, and the rank whose share it counts under DDP."""
        return "eval" if loader.world_size == 1 else "eval rank 0"

    @staticmethod
    def _share(loader) -> str:
        """What a plain line's count is a share of under DDP: `` on rank 0 (200 on 2 ranks)``."""
        return "" if loader.world_size == 1 else f" on rank 0 ({loader.problems_in_all} on {loader.world_size} ranks)"

    def on_validation_batch_start(self, trainer: L.Trainer, pl_module, batch, batch_idx: int,
                                  dataloader_idx: int = 0) -> None:
        loader = self._test_problems(trainer)
        if loader is None:
            super().on_validation_batch_start(trainer, pl_module, batch, batch_idx, dataloader_idx)
        elif batch_idx == 0:
            self._start_evaluation(trainer, loader)

    def on_validation_batch_end(self, trainer: L.Trainer, pl_module, outputs, batch, batch_idx: int,
                                dataloader_idx: int = 0) -> None:
        loader = self._test_problems(trainer)
        if loader is None:
            super().on_validation_batch_end(trainer, pl_module, outputs, batch, batch_idx, dataloader_idx)
        else:
            self._count_evaluated(trainer, loader, batch)

    def on_test_batch_start(self, trainer: L.Trainer, pl_module, batch, batch_idx: int,
                            dataloader_idx: int = 0) -> None:
        loader = self._test_problems(trainer)
        if loader is None:
            super().on_test_batch_start(trainer, pl_module, batch, batch_idx, dataloader_idx)
        elif batch_idx == 0:
            self._start_evaluation(trainer, loader)

    def on_test_batch_end(self, trainer: L.Trainer, pl_module, outputs, batch, batch_idx: int,
                          dataloader_idx: int = 0) -> None:
        loader = self._test_problems(trainer)
        if loader is None:
            super().on_test_batch_end(trainer, pl_module, outputs, batch, batch_idx, dataloader_idx)
        else:
            self._count_evaluated(trainer, loader, batch)

    def on_validation_end(self, trainer: L.Trainer, pl_module) -> None:
        super().on_validation_end(trainer, pl_module)
        if trainer.state.fn == "fit" and trainer.global_step == self._first_step:
            self._started = time.perf_counter()  # the ETA of training leaves out the evaluation before it
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
