"""``lit_ppo.data``: where ``RolloutDataModule`` was imported from before the package had layers; kept
so that existing code keeps importing. It lives in ``lit_ppo.training.datamodule``."""

from lit_ppo.training.datamodule import RolloutDataModule

__all__ = ["RolloutDataModule"]
