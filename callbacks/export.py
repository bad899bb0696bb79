"""At the end of fit, export the final policy as a Hugging Face model directory (and to MLflow)."""

from __future__ import annotations

from pathlib import Path

import lightning as L
from lightning.pytorch.loggers import MLFlowLogger


class ExportModel(L.Callback):
    """On rank 0, when training ends, write the policy to ``<run dir>/model`` (``lit_ppo.export``)
    and log that directory to every MLflow logger's run as the artifact directory ``model``.
    LitPPO adds one to every trainer that has none of its own (give ``ExportModel(dirpath=...)`` in
    the trainer's callbacks to write elsewhere).

    Args:
        dirpath: where to write; None for ``<trainer.default_root_dir>/model``, which the CLI makes the
            run directory. An earlier export there is replaced.
    """

    def __init__(self, dirpath: str | Path | None = None):
        self.dirpath = dirpath

    def output_dir(self, trainer: L.Trainer) -> Path:
        if self.dirpath is not None:
            return Path(self.dirpath)
        return Path(trainer.default_root_dir) / "model"

    def on_train_end(self, trainer: L.Trainer, pl_module) -> None:
        policy = pl_module.full_policy()  # every rank: sharded weights are gathered from all of them
        if not trainer.is_global_zero:
            return
        from lit_ppo.export import write_model_dir

        was_training = policy.training
        path = write_model_dir(policy.eval(), pl_module.tokenizer, self.output_dir(trainer), overwrite=True)
        policy.train(was_training)
        for logger in trainer.loggers:
            if isinstance(logger, MLFlowLogger):
                logger.experiment.log_artifacts(logger.run_id, str(path), "model")
