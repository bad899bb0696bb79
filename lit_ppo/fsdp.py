"""``lit_ppo.fsdp``: the class path of ``FSDP2Strategy`` in configs recorded before the package had
layers (``trainer.strategy.class_path``); kept so that they replay. It lives in ``lit_ppo.training.fsdp``."""

from lit_ppo.training.fsdp import FSDP2Strategy

__all__ = ["FSDP2Strategy"]
