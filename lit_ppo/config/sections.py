"""The sections of a LightningCLI config tree that lit_ppo's dataclasses declare, built and checked
without torch or Lightning: the seeds, ``model.{actor,critic,model}`` and ``data.{gconfig,eval}``. Each
mistake is one ConfigError naming the key as typed; what needs the layers above (the task's data, a model
directory, Lightning's own arguments) ``lit_ppo.launch.check`` adds."""

from __future__ import annotations

import re
from dataclasses import fields, is_dataclass
from typing import Any, Callable, NamedTuple

from lit_ppo.config.algo import EvalConfig, GenerationConfig, PPOActorConfig, PPOCriticConfig
from lit_ppo.config.model import ModelConfig
from lit_ppo.errors import ConfigError
from lit_ppo.utils.text import did_you_mean

SEED_RANGE = (0, 2**32 - 1)
"""Seeds numpy (and so Lightning's seed_everything) accepts."""
MODEL_KEYS = ("algo", "actor", "critic", "model")
"""The keys of LightningCLI's ``model`` section (LitPPO's arguments)."""


class Sections(NamedTuple):
    """The dataclass sections of a config tree, built."""

    actor: PPOActorConfig
    critic: PPOCriticConfig | None
    model: ModelConfig
    gconfig: GenerationConfig
    eval: EvalConfig


def construct(cls, values: Any, key: str, check: Callable[[Any], None] | None = None):
    """The config ``cls`` of the section ``key`` from its mapping (or as given), passed through ``check``;
    a ConfigError naming ``key.<field>`` for any mistake."""
    if values is None:
        return None
    if not is_dataclass(values):
        if not isinstance(values, dict):
            raise ConfigError(f"{key} must be a mapping of {cls.__name__} fields, got {values!r}")
        names = {f.name for f in fields(cls)}
        for name in values:
            if name not in names:
                hint = did_you_mean(name, sorted(names), prefix=f"{key}.")
                raise ConfigError(f"{key}.{name} is not a key{hint}; allowed: {', '.join(sorted(names))}")
    try:
        config = values if is_dataclass(values) else cls(**values)
        if check is not None:
            check(config)
        return config
    except (ValueError, TypeError) as e:
        message = str(e).splitlines()[0]
        named = re.match(r"([A-Za-z_][\w.]*)(=| is not a key)", message)  # a key of the section, or nested
        if named and not named.group(1).startswith(f"{key}."):
            message = f"{key}.{message}".replace("(did you mean ", f"(did you mean {key}.", 1)
        raise ConfigError(message) from None


def check_seed(key: str, value: Any) -> None:
    """ConfigError unless ``value`` is a seed numpy takes."""
    low, high = SEED_RANGE
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ConfigError(f"{key}={value!r} is invalid: must be an integer in [{low}, {high}]")


def check_sections(tree: dict) -> Sections:
    """The dataclass sections of the LightningCLI ``tree``, built and checked, and its seeds checked (the
    names the actor refers to are checked where the algorithms live, ``lit_ppo.algos.checks``)."""
    if "seed_everything" in tree:
        check_seed("seed", tree["seed_everything"])
    model = tree.get("model") or {}
    for name in model:
        if name not in MODEL_KEYS:
            raise ConfigError(f"model.{name} is not a key; allowed: {', '.join(sorted(MODEL_KEYS))}")
    data = tree.get("data") or {}
    if "seed" in data:
        check_seed("data.seed", data["seed"])
    return Sections(actor=construct(PPOActorConfig, model.get("actor") or {}, "actor"),
                    critic=construct(PPOCriticConfig, model.get("critic"), "critic"),
                    model=construct(ModelConfig, model.get("model") or {}, "model"),
                    gconfig=construct(GenerationConfig, data.get("gconfig") or {}, "gconfig"),
                    eval=construct(EvalConfig, data.get("eval") or {}, "eval"))


def actor_rollout_problem(actor: PPOActorConfig, temperature: float, max_head_offpolicyness: int) -> str | None:
    """Why the actor cannot train on the rollouts, or None: samples up to ``max_head_offpolicyness`` policy
    versions old need the decoupled loss, and the log-probs the actor recomputes must be those of the
    sampling ``temperature``. The command line checks it before anything loads, the trainer at fit start."""
    if max_head_offpolicyness > 0 and not actor.use_decoupled_loss:
        return (f"rollout.max_head_offpolicyness={max_head_offpolicyness} trains on samples up to "
                f"{max_head_offpolicyness} policy versions old, which needs the decoupled loss: set "
                f"actor.use_decoupled_loss=true (with rejection=icepop or rejection=kpop for the off-policy "
                f"correction), or use algo=icepop or algo=kpop")
    if actor.temperature != temperature:
        return (f"actor.temperature={actor.temperature} must equal gconfig.temperature={temperature}: the "
                f"trainer recomputes log-probs under the sampling distribution")
    return None
