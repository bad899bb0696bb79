"""Configs checked as the command line and LitPPO check them, shared by the config and algorithm tests."""

from __future__ import annotations

from lit_ppo.algos.checks import check_names
from lit_ppo.config import PPOActorConfig


def checked_actor(**kwargs) -> PPOActorConfig:
    """PPOActorConfig(**kwargs) whose registered names and gae_lambda function are resolved, as the CLI
    and LitPPO do."""
    cfg = PPOActorConfig(**kwargs)
    check_names(cfg)
    return cfg
