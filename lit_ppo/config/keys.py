"""The two names of a config key: LightningCLI's dotted path (what ``--print_config`` shows) and the key
typed on the command line (``model.actor.eps_clip`` is ``actor.eps_clip``)."""

from __future__ import annotations

ROLLOUT_KEYS = ("engine", "engine_kwargs", "max_logp_gap", "max_head_offpolicyness", "num_threads", "devices")
"""The rollout group's keys: RolloutDataModule arguments under their own names (rollout.engine -> data.engine)."""
LIGHTNING_NAMES = (("model.actor", "actor"), ("model.critic", "critic"), ("model.model", "model"),
                   ("model.algo", "algo"), ("data.gconfig", "gconfig"), ("data.eval", "eval"),
                   *((f"data.{key}", f"rollout.{key}") for key in ROLLOUT_KEYS),
                   ("trainer.logger", "logger"), ("seed_everything", "seed"))
"""Section of LightningCLI's tree (what ``--print_config`` shows) -> the key typed on the command line."""


def typed_key(key: str) -> str:
    """The command line's name of LightningCLI's dotted ``key``: ``model.actor.eps_clip`` -> ``actor.eps_clip``,
    ``data.engine`` -> ``rollout.engine``, ``trainer.logger.init_args.run_name`` -> ``logger.init_args.run_name``."""
    for lightning, typed in LIGHTNING_NAMES:
        if key == lightning or key.startswith(lightning + "."):
            return typed + key[len(lightning):]
    return key
