"""At the end of fit, export the final policy as a Hugging Face model directory (and to MLflow)."""

from __future__ import annotations

from pathlib import Path

import lightning as L
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import MLFlowLogger

from lit_ppo.callbacks.graceful_stop import last_checkpoint_path
from lit_ppo.config.model import MODEL_RECORD
from lit_ppo.errors import ConfigError, RunStopped
from lit_ppo.models import base_model_paths
from lit_ppo.models.hf_dir import relation, write_model_dir


class ExportModel(L.Callback):
    """On rank 0, when training ends, write the policy to ``<run dir>/model`` (``lit_ppo.run.export``)
    and log that directory to every MLflow logger's run as the artifact directory ``model``.
    LitPPO adds one to every trainer that has none of its own (give ``ExportModel(dirpath=...)`` in
    the trainer's callbacks to write elsewhere).

    Args:
        dirpath: where to write; None for ``<trainer.default_root_dir>/model``, which the CLI makes the
            run directory. An earlier export there (a directory holding its ``lit_ppo_model.json``) is
            replaced. Refused when fit starts: a directory holding anything else, and a place whose
            replacement would take the run's own files with it (the run directory or an ancestor, a
            checkpoint directory, the base model).
    """

    def __init__(self, dirpath: str | Path | None = None):
        self.dirpath = dirpath

    def output_dir(self, trainer: L.Trainer) -> Path:
        if self.dirpath is not None:
            return Path(self.dirpath)
        return Path(trainer.default_root_dir) / "model"

    def on_fit_start(self, trainer: L.Trainer, pl_module) -> None:
        # The first hook where every checkpoint callback's directory is resolved; nothing is trained yet.
        output = self.output_dir(trainer)
        reads = {f"the checkpoint directory of {type(cb).__name__}": cb.dirpath
                 for cb in trainer.checkpoint_callbacks if isinstance(cb, ModelCheckpoint) and cb.dirpath}
        model_cfg = getattr(pl_module, "model_cfg", None)
        reads.update(base_model_paths(model_cfg) if model_cfg is not None else {})
        for what, path in reads.items():
            self._refuse(output, relation(output, path), what, path)
        how = relation(output, trainer.default_root_dir)
        if how != "is inside":  # the run directory holds the export itself, <run dir>/model
            self._refuse(output, how, "the run directory (trainer.default_root_dir)", trainer.default_root_dir)
        foreign = _foreign_content(output)
        if foreign is not None:
            raise ConfigError(f"ExportModel dirpath={output}: holds {foreign}, which no lit_ppo export wrote and the "
                              f"export at the end of fit would delete: move it, or give a new or empty directory")

    @staticmethod
    def _refuse(output: Path, how: str | None, what: str, path) -> None:
        if how is not None:
            raise ConfigError(f"ExportModel dirpath={output}: {how} {what} {path}, which the export at the end "
                              f"of fit would overwrite: give a directory apart from it")

    def on_train_end(self, trainer: L.Trainer, pl_module) -> None:
        policy = pl_module.full_policy()  # every rank: sharded weights are gathered from all of them
        if not trainer.is_global_zero:
            return
        was_training = policy.training
        model_cfg = getattr(pl_module, "model_cfg", None)
        foreign = _foreign_content(self.output_dir(trainer))
        if foreign is not None:  # put there while the run trained
            raise RunStopped(f"the export at the end of fit would delete {foreign} in {self.output_dir(trainer)}, "
                             f"which no lit_ppo export wrote: move it, then export the trained policy with python -m "
                             f"lit_ppo export --ckpt_path {last_checkpoint_path(trainer)} --output DIR")
        # A module may record more of what it trained (a reward model: its rewards' statistics).
        record = pl_module.exported_record() if hasattr(pl_module, "exported_record") else None
        path = write_model_dir(policy.eval(), pl_module.tokenizer, self.output_dir(trainer), overwrite=True,
                               flag="the export", source=model_cfg.source if model_cfg is not None else None,
                               record=record)
        policy.train(was_training)
        for logger in trainer.loggers:
            if isinstance(logger, MLFlowLogger):
                logger.experiment.log_artifacts(logger.run_id, str(path), "model")


def _foreign_content(output: Path) -> str | None:
    """What of ``output`` an export may not replace, or None: a directory that an export wrote holds its
    record of the model it descends from (``MODEL_RECORD``); anything else there is someone's own."""
    if not output.exists():
        return None
    if not output.is_dir():
        return "a file"
    entries = sorted(entry.name for entry in output.iterdir())
    if not entries or MODEL_RECORD in entries:
        return None
    return f"{entries[0]!r}" + (f" and {len(entries) - 1} more" if len(entries) > 1 else "")
