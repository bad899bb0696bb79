"""The block that ends a fit: what was trained and how it went, where everything is, and what to run next."""

from __future__ import annotations

import math
import time
from pathlib import Path

import lightning as L
import yaml
from lightning.pytorch.loggers import CSVLogger, MLFlowLogger, TensorBoardLogger, WandbLogger

from lit_ppo.callbacks.export import ExportModel
from lit_ppo.callbacks.graceful_stop import last_checkpoint_path
from lit_ppo.config.keys import typed_key
from lit_ppo.rollout.source import RolloutSource
from lit_ppo.utils.fs import shown_path
from lit_ppo.utils.imports import object_references, python_source

REWARD = "rollout/reward_mean"
KL_ROWS = {"kl": "actor/kl_ref", "approx_kl": "actor/approx_kl"}
"""Summary row -> the KL it shows: TRL's ``kl`` (to the reference or the teacher, logged only with one) and the
policy's change in each update."""
REWARD_TERMS = "rollout/rewards/"
"""Each reward function's mean (``rollout/rewards/<name>/mean``), for a task that sums several."""
SUMMARY_FILE = "summary.txt"
"""The summary's file in the run directory (``trainer.default_root_dir``) and in each tracked run."""


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    hours, minutes = divmod(seconds // 60, 60)
    return f"{hours} h {minutes} min" if hours else f"{minutes} min {seconds % 60} s" if minutes else f"{seconds} s"


class RunSummary(L.Callback):
    """When a fit ends (its last iteration, or stopped by a signal), rank 0 prints a block to stdout and
    writes it to ``summary.txt`` in the run directory and in each MLflow and W&B run: the iterations and
    time, the reward of the first and last iteration of this session (and each reward function's mean,
    for a task that sums several), the KL to the reference or teacher (with one) and the policy's change per
    update at the same iterations, the last evaluation's scores, the run directory, the last checkpoint,
    the exported model, the MLflow run, and the commands that resume a run stopped early, score the
    checkpoint on the test split (for a task that has one) and export it."""

    def __init__(self):
        # None until this session's training loop starts (it never does when a resumed checkpoint is at
        # trainer.max_steps already).
        self._started: float | None = None
        self._first_step = 0
        self._rewards: list[tuple[int, float]] = []
        self._kls: dict[str, list[tuple[int, float]]] = {}
        """Logged KL metric -> its (iteration, value) at the first and the last iteration of this session."""
        self._terms: dict[str, list[float]] = {}
        """Reward function name -> its mean at the first and the last iteration of this session that gave it."""
        self._eval: tuple[int, dict[str, float]] | None = None

    def on_train_start(self, trainer: L.Trainer, pl_module) -> None:
        self._started, self._first_step, self._rewards, self._eval = time.monotonic(), trainer.global_step, [], None
        self._terms, self._kls = {}, {}

    def on_train_batch_end(self, trainer: L.Trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        reward = trainer.callback_metrics.get(REWARD)
        if reward is not None:
            self._rewards.append((trainer.global_step, float(reward)))
        for key in KL_ROWS.values():
            if key in trainer.callback_metrics:
                point = (trainer.global_step, float(trainer.callback_metrics[key]))
                self._kls[key] = [self._kls.get(key, [point])[0], point]
        for key, value in trainer.callback_metrics.items():
            if key.startswith(REWARD_TERMS) and key.endswith("/mean") and not math.isnan(float(value)):
                name = key.removeprefix(REWARD_TERMS).removesuffix("/mean")
                self._terms[name] = [self._terms.get(name, [float(value)])[0], float(value)]

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
        if path.exists() and (self._started is None or trainer.global_step == self._first_step):
            return  # this session trained nothing: the run's summary of its training stays as it was
        path.write_text(text)
        for logger in trainer.loggers:
            if isinstance(logger, MLFlowLogger) and logger.run_id:
                logger.experiment.log_text(logger.run_id, text, SUMMARY_FILE)
            elif isinstance(logger, WandbLogger):
                logger.experiment.save(str(path), base_path=str(path.parent), policy="now")

    def progress(self, trainer: L.Trainer) -> str:
        """How far the run got: ``<step> of <max_steps> (<done> in <time>)``, or that this session trained none."""
        done = trainer.global_step - self._first_step
        of = f" of {trainer.max_steps}" if trainer.max_steps > 0 else ""
        if self._started is None or done == 0:  # e.g. a resume of a run at its trainer.max_steps already
            reached = 0 < trainer.max_steps <= trainer.global_step
            why = f": trainer.max_steps={trainer.max_steps} was reached already" if reached else ""
            return f"{trainer.global_step}{of} (none trained{why})"
        return (f"{trainer.global_step}{of} ({done} in {_duration(time.monotonic() - self._started)}"
                f"{' after resuming' if self._first_step else ''})")

    def lines(self, trainer: L.Trainer) -> list[tuple[str, str]]:
        """The summary's ``(label, value)`` rows."""
        rows = [("iterations", self.progress(trainer))]
        if self._rewards:
            (first_step, first), (last_step, last) = self._rewards[0], self._rewards[-1]
            rows.append(("reward", f"{first:.3g} (iteration {first_step}) -> {last:.3g} (iteration {last_step})"))
        if self._terms:
            rows.append(("rewards", ", ".join(f"{name} {first:.3g} -> {last:.3g}"
                                              for name, (first, last) in self._terms.items())))
        rows += self._kl_rows(trainer)
        if self._eval is not None:
            step, scores = self._eval
            shown = ", ".join(f"{key.removeprefix('eval/')} {value:.3g}" for key, value in scores.items())
            rows.append(("eval", f"{shown} (iteration {step})"))
        rows += places(trainer)
        checkpoint = last_checkpoint_path(trainer)
        if checkpoint.exists():
            # validate refuses a task without test problems (exit code 2): offered only where it scores some.
            datamodule = trainer.datamodule
            scored = isinstance(datamodule, RolloutSource) and datamodule.eval_problem_count() > 0
            rows += _commands(Path(trainer.default_root_dir) / "config.yaml", checkpoint,
                              resume=trainer.global_step < trainer.max_steps, scored=scored)
        return rows

    def _kl_rows(self, trainer: L.Trainer) -> list[tuple[str, str]]:
        """``kl``: TRL's kl, the KL of the policy to the reference model (or to the teacher, with
        ``model.teacher``); ``approx_kl``: how far each update moved the policy. Each at the first and the last
        iteration of this session, named by its metric."""
        teacher = getattr(getattr(trainer.lightning_module, "model_cfg", None), "teacher", None)
        meaning = {"kl": f"KL to the {'teacher' if teacher else 'reference model'}, TRL's kl",
                   "approx_kl": "the policy's change per update"}
        rows = []
        for label, key in KL_ROWS.items():
            if key in self._kls:
                (first_step, first), (last_step, last) = self._kls[key]
                rows.append((label, f"{first:.3g} (iteration {first_step}) -> {last:.3g} (iteration {last_step}): "
                                    f"{meaning[label]} ({key})"))
        return rows


def places(trainer: L.Trainer) -> list[tuple[str, str]]:
    """The summary's rows of where a run's outputs are: its directory, last checkpoint, exported model and
    tracked runs."""
    rows = [("run directory", shown_path(trainer.default_root_dir))]
    checkpoint = last_checkpoint_path(trainer)
    if checkpoint.exists():
        rows.append(("checkpoint", shown_path(checkpoint)))
    for callback in trainer.callbacks:
        if isinstance(callback, ExportModel) and (callback.output_dir(trainer) / "config.json").is_file():
            rows.append(("model", f"{shown_path(callback.output_dir(trainer))} (a Hugging Face model directory)"))
    for logger in trainer.loggers:
        if isinstance(logger, MLFlowLogger) and logger.run_id:
            experiment = logger.experiment.get_experiment(logger.experiment_id)  # None: the store failed
            named = f" (experiment {experiment.name})" if experiment is not None else ""
            rows.append(("mlflow run", f"{logger.run_id} in {logger.experiment.tracking_uri}{named}"))
        elif isinstance(logger, CSVLogger):
            rows.append(("csv metrics", shown_path(logger.experiment.metrics_file_path)))
        elif isinstance(logger, TensorBoardLogger):
            rows.append(("tensorboard", f"tensorboard --logdir {shown_path(logger.log_dir)}"))
        elif isinstance(logger, WandbLogger):
            run = logger.experiment
            rows.append(("wandb run", f"{shown_path(Path(run.dir).parent)} (offline: wandb sync uploads it)"
                         if run.offline else run.url))
    return rows


def _commands(config: Path, checkpoint: Path, resume: bool, scored: bool) -> list[tuple[str, str]]:
    """The rows that resume a run stopped early (``resume``), score its checkpoint on the test split
    (``scored``: the task has test problems) and export it: command lines, or the Python API's calls for a run
    whose config holds Python objects (which only the Python API takes again)."""
    ckpt = shown_path(checkpoint)
    export = ("export", f"python -m lit_ppo export --ckpt_path {ckpt} --output my-policy")
    objects = object_references(yaml.safe_load(config.read_text())) if config.is_file() else {}
    if not objects:
        resumed = [("resume", f"python -m lit_ppo fit --ckpt_path {ckpt}")] if resume else []
        tested = [("test scores", f"python -m lit_ppo validate --ckpt_path {ckpt}")] if scored else []
        return [*resumed, *tested, export]
    given = ", ".join(f"{typed_key(key)!r}: {python_source(value)}" for key, value in objects.items())
    resumed = [("resume", f"lit_ppo.fit(lit_ppo.compose(..., values={{{given}}}), ckpt_path={ckpt!r})")] \
        if resume else []
    tested = [("test scores", f"lit_ppo.validate({ckpt!r}, values={{{given}}})")] if scored else []
    return [*resumed, *tested, export]
