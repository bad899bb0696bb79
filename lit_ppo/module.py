"""``lit_ppo.module``: where ``LitPPO`` and ``ModelConfig`` were imported from before the package had
layers; kept so that existing code keeps importing. They live in ``lit_ppo.training.module`` and
``lit_ppo.config``."""

from lit_ppo.config import ModelConfig
from lit_ppo.training.module import LitPPO

__all__ = ["LitPPO", "ModelConfig"]
