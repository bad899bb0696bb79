"""``lit_ppo.tracking``: the class paths of the run loggers in configs recorded before the package had
layers (``trainer.logger.class_path``); kept so that they replay. They live in ``lit_ppo.run.tracking``."""

from lit_ppo.run.tracking import CSVRunLogger, MLflowRunLogger, TensorBoardRunLogger

__all__ = ["CSVRunLogger", "MLflowRunLogger", "TensorBoardRunLogger"]
