"""The two names of a config key: LightningCLI's dotted path (what ``--print_config`` shows) and the key
typed on the command line (``model.actor.eps_clip`` is ``actor.eps_clip``). One table, ``SECTIONS``,
holds the correspondence; both directions are derived from it: ``typed_key`` (LightningCLI's name to the
command line's, e.g. for MLflow params) and ``lightning_path`` (the command line's to LightningCLI's), which
``set_key`` uses to set a key of a LightningCLI tree."""

from __future__ import annotations

from typing import Any

from lit_ppo.errors import ConfigError

ROLLOUT_KEYS = ("engine", "engine_kwargs", "max_logp_gap", "max_head_offpolicyness", "num_threads", "devices")
"""The rollout group's keys: RolloutDataModule arguments under their own names (rollout.engine -> data.engine)."""
SECTIONS = {"actor": "model.actor", "algo": "model.algo", "critic": "model.critic", "data": "data",
            "eval": "data.eval", "gconfig": "data.gconfig", "logger": "trainer.logger", "model": "model.model",
            "seed": "seed_everything", "trainer": "trainer", "rollout": "data"}
"""Section typed on the command line (a root of the Hydra config) -> where LightningCLI's tree holds it. In
the order that error messages list them: by name, rollout last, since its keys (``ROLLOUT_KEYS``) are
data's, set over those of the data section."""
LIGHTNING_SECTIONS = tuple(dict.fromkeys(path.split(".")[0] for path in SECTIONS.values()))
"""The roots of LightningCLI's tree that a config sets: model, data, trainer, seed_everything."""
LIGHTNING_NAMES = (*((path, typed) for typed, path in SECTIONS.items() if typed not in (path, "rollout")),
                   *((f"{SECTIONS['rollout']}.{key}", f"rollout.{key}") for key in ROLLOUT_KEYS))
"""Section of LightningCLI's tree -> the key typed on the command line, where the two names differ."""


def typed_key(key: str) -> str:
    """The command line's name of LightningCLI's dotted ``key``: ``model.actor.eps_clip`` -> ``actor.eps_clip``,
    ``data.engine`` -> ``rollout.engine``, ``trainer.logger.init_args.run_name`` -> ``logger.init_args.run_name``."""
    for lightning, typed in LIGHTNING_NAMES:
        if key == lightning or key.startswith(lightning + "."):
            return typed + key[len(lightning):]
    return key


def lightning_path(key: str) -> tuple[str, ...] | None:
    """Where LightningCLI's tree holds the command line's dotted ``key``, part by part: ``actor.eps_clip``
    -> ``("model", "actor", "eps_clip")``, ``rollout.engine`` -> ``("data", "engine")``, ``seed`` ->
    ``("seed_everything",)``; None for a key in no section."""
    root, *rest = key.split(".")
    return (*SECTIONS[root].split("."), *rest) if root in SECTIONS else None


def key_path(key: str) -> tuple[str, ...]:
    """``lightning_path(key)``; ConfigError for a key in no section."""
    path = lightning_path(key)
    if path is None:
        raise ConfigError(f"{key} is not a key: must start with one of {', '.join(SECTIONS)}")
    return path


def set_key(tree: dict, key: str, value: Any) -> None:
    """Set the command line's ``key`` of the LightningCLI ``tree`` to ``value``, making the mappings on the
    way; ``seed`` sets ``data.seed`` too, as on the command line. ConfigError for a key in no section or
    under a value that is not a mapping."""
    *parents, last = key_path(key)
    node = tree
    for part in parents:
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            raise ConfigError(f"{key}: {part} is not a mapping in the config")
        node = child
    node[last] = value
    if key == "seed":
        tree.setdefault("data", {})["seed"] = value
