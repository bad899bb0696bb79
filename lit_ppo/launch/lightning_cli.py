"""LitPPOCLI, the LightningCLI that runs ``fit``, ``validate`` and ``test`` from one checked config (on
this machine and on each worker of a Ray job), and what it needs around it: the one line about ranks of
the run that a failed collective lost (the Lightning notes that LitPPO's choices make expected are silenced
by ``lit_ppo.utils.quiet``)."""

from __future__ import annotations

import subprocess
from typing import Any

import torch.distributed as dist
from lightning.pytorch import LightningDataModule, LightningModule
from lightning.pytorch.callbacks import ModelCheckpoint, ProgressBar
from lightning.pytorch.cli import LightningCLI

from lit_ppo.errors import RunStopped
from lit_ppo.launch.presets import EVALUATING
from lit_ppo.launch.user_exit import user_exit_message
from lit_ppo.run.tracked_run import TrackedConfig, end_started_runs, start, start_mlflow_runs
from lit_ppo.training.datamodule import RolloutDataModule
from lit_ppo.training.module import LitPPO
from lit_ppo.utils.stop_requests import Stopped, received_signal, signal_name


class LitPPOCLI(LightningCLI):
    """A job's LightningModule and data module under LightningCLI (LitPPO and RolloutDataModule, or another
    job's, such as sft's LitSFT and SFTDataModule): ``fit`` starts the run's directory and tracking before
    any model loads; ``validate`` and ``test`` record nothing and print the scores; user code that exits
    and collectives that lose a rank are failures of one line (RunStopped).

    Args:
        args: LightningCLI's arguments, the subcommand first.
        model_class: the job's LightningModule.
        datamodule_class: the job's data module.
        kwargs: more LightningCLI arguments (a Ray worker's ``trainer_defaults``).
    """

    def __init__(self, args: list[str], model_class: type[LightningModule] = LitPPO,
                 datamodule_class: type[LightningDataModule] = RolloutDataModule, **kwargs: Any):
        super().__init__(model_class, datamodule_class, args=args, save_config_callback=TrackedConfig,
                         save_config_kwargs={"overwrite": True, "save_to_log_dir": False},
                         parser_kwargs={"exit_on_error": False}, seed_everything_default=0,
                         auto_configure_optimizers=False, **kwargs)

    def _parse_ckpt_path(self) -> None:
        # LightningCLI would replace the model's settings with the checkpoint's hyperparameters. A fit's
        # config is the run's recorded one already, with each change named (lit_ppo.launch.run.resume_fit):
        # nothing of it is replaced silently (a new learning rate included).
        if self.config.get("subcommand") != "fit":
            super()._parse_ckpt_path()

    def before_instantiate_classes(self) -> None:
        if self.subcommand in EVALUATING:
            # The scores print as a table; nothing is recorded: no run directory, tracking or saved config.
            self.run_dir = None
            self.save_config_callback = None
            self.config[self.subcommand].trainer.logger = False
            return
        # Before any model loads: a tracking store that answers (else a ConfigError), the run's own directory.
        self.run_dir = start(self.config[self.subcommand])
        self.save_config_kwargs["run_dir"] = self.run_dir

    def instantiate_trainer(self, **kwargs):
        # Whatever Lightning writes under default_root_dir lands in the run directory too.
        if self.run_dir is not None:
            kwargs.setdefault("default_root_dir", str(self.run_dir))
        trainer_config = self._get(self.config_init, "trainer", default={})
        callbacks = trainer_config.get("callbacks") or []
        if trainer_config.get("enable_progress_bar") is False:
            # The presets' progress callback yields to the switch (Lightning refuses the two together).
            callbacks = kwargs["callbacks"] = [cb for cb in callbacks if not isinstance(cb, ProgressBar)]
        if self.subcommand in EVALUATING or trainer_config.get("enable_checkpointing") is False:
            # Nothing trains, so nothing is checkpointed; or the presets' checkpoint callback yields to the switch.
            kwargs["callbacks"] = [cb for cb in callbacks if not isinstance(cb, ModelCheckpoint)]
        trainer = super().instantiate_trainer(**kwargs)
        if self.subcommand in EVALUATING:
            return trainer
        start_mlflow_runs(trainer, self.config[self.subcommand], self.run_dir)
        return trainer

    def instantiate_classes(self) -> None:
        try:
            super().instantiate_classes()
        except SystemExit as e:  # user code (a model, task or callback class) exiting is a failure here
            raise RunStopped(user_exit_message(e, "while the run was built")) from e

    def _run_subcommand(self, subcommand: str) -> None:
        try:
            super()._run_subcommand(subcommand)
        except SystemExit as e:
            if received_signal() is not None:  # Lightning exits after a signal that abandoned an iteration
                raise
            where = (f"during iteration {self.trainer.global_step + 1}" if subcommand == "fit"
                     else f"during {subcommand}")
            raise RunStopped(user_exit_message(e, where)) from e
        except Exception as e:
            if not _collective_failure(e, self.trainer):
                raise
            raise RunStopped(_lost_peers(self.trainer)) from e
        except Stopped as e:  # a signal outside the training loop (GracefulStop handles those inside it)
            e.where = (f"during {subcommand}" if subcommand != "fit" else "before the first iteration"
                       if self.trainer.global_step == 0 else f"after iteration {self.trainer.global_step}")
            raise
        finally:
            if received_signal() is not None:
                end_started_runs("KILLED")


def _collective_failure(error: Exception, trainer) -> bool:
    """Whether ``error`` is a collective that failed because another rank of the run is gone."""
    if trainer.world_size <= 1:
        return False
    text = str(error)
    return isinstance(error, dist.DistError) or any(
        marker in text for marker in ("Connection closed by peer", "Connection reset by peer", "Broken pipe"))


def _lost_peers(trainer) -> str:
    """The one line about the ranks that a collective lost: "" when each of them ended with exit code 1
    (lit_ppo printed its error line there: one line per failure, from the rank that failed)."""
    procs = getattr(trainer.strategy.launcher, "procs", None) or []  # the ranks Lightning started from here
    lines = [] if procs else ["another rank of the run stopped (see its error)"]
    for rank, proc in enumerate(list(procs), start=1):
        try:
            code = proc.wait(timeout=15)  # it closed its connections: it is ending
        except subprocess.TimeoutExpired:
            code = None
        if code is not None:  # ended: Lightning's process observer must not SIGKILL this process for it
            procs.remove(proc)
        if code in (0, 1):
            continue
        lines.append(f"rank {rank} " + ("still runs" if code is None else f"was killed by {signal_name(-code)}"
                                       if code < 0 else f"exited with code {code}"))
    return f"rank {trainer.global_rank} stopped: {'; '.join(lines)}" if lines else ""
