"""The Hydra front end of ``python -m lit_ppo fit``: ``conf/`` composed with the user's ``group=option`` /
``key=value`` overrides and mapped onto LightningCLI's argument tree.

The names ``--print_config`` and the MLflow params show (``data.gconfig.n_samples``,
``model.actor.eps_clip``) work as overrides too; ``model=DIR`` loads a local model directory; a field
that no preset sets needs no ``+``. A mistake is one line naming the key as typed, with the keys close
to it (``_suggest``).
"""

from __future__ import annotations

import typing
from dataclasses import fields, is_dataclass
from pathlib import Path
from typing import Any

from hydra import compose as hydra_compose
from hydra import initialize_config_dir
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException, OverrideParseException
from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException

from lit_ppo.config import EvalConfig, GenerationConfig, ModelConfig, PPOActorConfig, PPOCriticConfig, type_hints
from lit_ppo.config.checkpoint import CheckpointConfig
from lit_ppo.config.keys import ROLLOUT_KEYS, SECTIONS, foreign_key_hint, foreign_keys_error, lightning_path, typed_key
from lit_ppo.config.model import base_model
from lit_ppo.config.rollout import DATA_KEYS, DATA_SECTIONS
from lit_ppo.config.samples import SamplesConfig
from lit_ppo.config.scheduler import JobConfig, RayConfig, SlurmConfig, scheduler_config
from lit_ppo.config.sections import construct
from lit_ppo.config.trainer import TRAINER_KEYS
from lit_ppo.errors import ConfigError
from lit_ppo.launch.explain import explain_hydra_error
from lit_ppo.launch.presets import (
    conf_dir,
    follow_sampling_temperature,
    given_task_kwargs,
    group_options,
    groups,
    is_group,
    keep_taken_task_kwargs,
    real_model_choices,
    register_resolvers,
    typed_overrides,
)
from lit_ppo.utils.text import closest, did_you_mean, one_of


def _explain_hydra_error(error: Exception, overrides: list[str], typed: list[str]) -> str:
    """One line for a composition error; ``typed[i]`` is what the user typed for ``overrides[i]``."""
    text = str(error)
    for override, original in zip(overrides, typed):
        key = override.lstrip("+~").split("=", 1)[0]
        if ("Could not override" in text and f"'{key}'" in text) or f"Key '{key.rsplit('.', 1)[-1]}'" in text:
            key = original.lstrip("+~").split("=", 1)[0]
            return f"{key} is not a key{_suggest(key)}"
    if isinstance(error, OverrideParseException) and "Error parsing override" not in text:
        for original in typed:  # Hydra names no override here: parse them one at a time
            try:
                OverridesParser.create().parse_overrides([original])
            except OverrideParseException as e:
                return (f"override {original!r} does not parse ({str(e).splitlines()[0]}): quote a value with "
                        f"special characters, e.g. key='a=b'")
    return explain_hydra_error(error, group_options)


_SECTION_TYPES = {"actor": PPOActorConfig, "critic": PPOCriticConfig, "gconfig": GenerationConfig,
                  "model": ModelConfig, "eval": EvalConfig, "checkpoint": CheckpointConfig,
                  "samples": SamplesConfig}
"""Hydra-side section -> the dataclass that declares its fields (nested sections follow the type hints)."""
_DATA_TYPES = {key: _SECTION_TYPES[key] for key in DATA_SECTIONS}
"""The data section's keys that are configs of their own -> their dataclass."""
ROOTS = (*_SECTION_TYPES, "data", "rollout", "scheduler", "trainer", "logger")
"""The Hydra-side sections whose keys are known, in the order suggestions list them."""


def _root_keys(root: str) -> list[str]:
    """The keys of the Hydra-side section ``root``; [] where unknown."""
    if root in _SECTION_TYPES:
        return [f.name for f in fields(_SECTION_TYPES[root])]
    if root == "trainer":
        return list(TRAINER_KEYS)
    return {"data": list(DATA_KEYS), "rollout": list(ROLLOUT_KEYS),
            "scheduler": [f.name for cls in (SlurmConfig, RayConfig) for f in fields(cls)],
            "logger": ["class_path", "init_args"]}.get(root, [])


def _section_keys(section: str) -> list[str]:
    """The keys of the Hydra-side ``section`` (``actor``, ``actor.optimizer``, ``trainer``); [] where unknown."""
    root, *rest = section.split(".")
    if not rest:
        return _root_keys(root)
    owner = _SECTION_TYPES.get(root) or (_DATA_TYPES.get(rest.pop(0)) if root == "data" else None)
    for part in rest:
        hint = type_hints(owner).get(part) if owner is not None else None
        owner = next((t for t in typing.get_args(hint) or (hint,) if is_dataclass(t)), None)
    return [f.name for f in fields(owner)] if owner is not None else []


def _suggest(key: str) -> str:
    """`` (did you mean <section>.<field>?)`` for a mistyped ``key``, in the section as typed (a
    LightningCLI name such as ``model.model.lora_rnk`` included); for a key without a section, the
    keys that end in it or close to it (``lr``: ``actor.optimizer.lr or critic.optimizer.lr``); another
    trainer's name answered with lit_ppo's (``: TRL's learning_rate is actor.optimizer.lr``); "" when
    nothing is close."""
    foreign = foreign_key_hint(key)
    if foreign is not None:
        return foreign
    section, _, name = key.rpartition(".")
    if section:
        return did_you_mean(name, _section_keys(typed_key(section)), prefix=f"{section}.")
    keys = _all_keys()
    ends = {k.rsplit(".", 1)[-1].lower() for k in keys}
    last = name.lower() if name.lower() in ends else next(iter(closest(name, ends)), None)
    matches = [k for k in keys if k.rsplit(".", 1)[-1].lower() == last]
    return f" (did you mean {one_of(matches[:3])}?)" if matches else ""


def _all_keys() -> list[str]:
    """Every ``section.field`` key and its nested ``section.field.field`` keys, in section order, each
    under one name (``gconfig.n_samples``, not also ``data.gconfig.n_samples``)."""
    out = []

    def walk(prefix: str) -> None:
        for name in _section_keys(prefix):
            if name not in ROOTS:
                out.append(f"{prefix}.{name}")
                walk(f"{prefix}.{name}")

    for section in ROOTS:
        walk(section)
    return out


def _add_known_keys(overrides: list[str], composed) -> list[str]:
    """``section.field=value`` for a field the presets do not set becomes ``+section.field=value``, and
    ``key={...}`` for a mapping a preset sets ``++key={...}`` (its keys merged into the preset's): every
    dataclass field can be overridden without knowing which keys a preset writes."""
    out = []
    for override in overrides:
        key, _, value = override.partition("=")
        parts = key.split(".")
        current = OmegaConf.select(composed, key, default=_ABSENT)
        absent = current is _ABSENT
        if override[0] not in "+~" and isinstance(current, DictConfig) and value.lstrip().startswith("{"):
            out.append("++" + override)  # keys merged into a preset's mapping (the presets' are closed to new keys)
            continue
        # A whole section no preset writes (eval=...) or a field of a section; in a nested config
        # section (actor.optimizer.*) only its fields, so that a typo is reported with a suggestion.
        nested = _section_keys(".".join(parts[:-1])) if len(parts) > 2 else []
        if (override[0] not in "+~" and not is_group(override) and absent
                and (parts[1] in _root_keys(parts[0]) and (not nested or parts[-1] in nested)
                     if len(parts) >= 2 else key in SECTIONS)):
            override = "+" + override
        out.append(override)
    return out


_ABSENT = object()


def _quoted(value: str) -> str:
    """``value`` as a Hydra single-quoted string."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _model_dir_overrides(overrides: list[str]) -> list[str]:
    """``model=DIR`` (a value that is not an option of the model group) becomes ``model.source=DIR``,
    DIR made absolute (a hub id in the local Hugging Face cache kept as it is), on top of the default model
    option; anything else is left as is. ConfigError for a value that is neither an option nor a loadable
    local causal LM directory or cached hub model."""
    options = group_options("model")
    out = []
    for override in overrides:
        key, eq, value = override.partition("=")
        if key != "model" or not eq or value in options:
            out.append(override)
            continue
        path = Path(value).expanduser()
        if not (path.is_dir() or "/" in value or value.startswith("~")):
            raise ConfigError(f"model={value} is invalid{did_you_mean(value, options, prefix='model=')}: must be one "
                              f"of {', '.join(options)} or a local model directory")
        from lit_ppo.models import model_dir_problem  # torch and transformers: only for a model directory

        problem = model_dir_problem(value)
        if problem is not None:
            raise ConfigError(f"model={value} {problem}")
        # A cached hub id stays the id: a resumed or scored run finds it in the cache again.
        out.append(f"model.source={_quoted(str(path.absolute()) if path.is_dir() else value)}")
    return out


def _refuse_foreign_keys(overrides: list[str]) -> None:
    """ConfigError of one line answering every key of ``overrides`` that is another trainer's name (TRL's
    ``learning_rate``, verl's ``actor_rollout_ref.rollout.n``) with lit_ppo's, all of them at once: a port
    brings several."""
    keys = [override.lstrip("+~").split("=", 1)[0] for override in overrides]
    error = foreign_keys_error(keys, {*ROOTS, *SECTIONS, *groups()})
    if error is not None:
        raise ConfigError(error)


def compose(overrides: list[str]) -> dict:
    """The Hydra-composed config for ``overrides``, resolved, as LightningCLI's tree."""
    return compose_run(overrides)[0]


def compose_run(overrides: list[str]) -> tuple[dict, JobConfig | None]:
    """``compose``'s tree and the checked ``scheduler`` section: None to run here, else the job's."""
    register_resolvers()
    typed = list(overrides)
    _refuse_foreign_keys(typed)
    overrides = _model_dir_overrides(typed_overrides(overrides))
    try:
        with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
            groups = [o for o in overrides if is_group(o)]
            presets = hydra_compose(config_name="config", overrides=groups)
            overrides = _add_known_keys(overrides, presets)
            cfg = presets if overrides == groups else hydra_compose(config_name="config", overrides=overrides)
        task = OmegaConf.select(cfg, "data.task")
        if task != OmegaConf.select(presets, "data.task") and OmegaConf.select(cfg, "data.task_kwargs") is not None:
            with open_dict(cfg):
                cfg.data.task_kwargs = keep_taken_task_kwargs(
                    OmegaConf.to_container(cfg.data.task_kwargs), task, given_task_kwargs(overrides))
        tree = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
    except (HydraException, OmegaConfBaseException) as e:
        raise ConfigError(_explain_hydra_error(e, overrides, typed)) from None
    # Checked only: the trainer presets' ModelCheckpoint and CompletionSamples hold their values
    # (${checkpoint.*}, ${samples.*}).
    construct(CheckpointConfig, tree.pop("checkpoint", None) or {}, "checkpoint")
    construct(SamplesConfig, tree.pop("samples", None) or {}, "samples")
    scheduler = scheduler_config(tree.pop("scheduler", None))
    return to_lightning_tree(tree), scheduler


def real_model_note(tree: dict) -> str | None:
    """The ``note:`` line of a run whose model is not the tiny one: the settings that the presets choose for
    a real model (``lit_ppo.launch.presets.real_model_choices``) and LightningCLI's ``tree`` holds; None for the
    tiny model (or a directory lit_ppo wrote from it) or when it holds other values (the user's)."""
    model = tree.get("model") or {}
    source = (model.get("model") or {}).get("source", ModelConfig.source)
    if not isinstance(source, str) or base_model(source) == "tiny":
        return None
    algo = model.get("algo")
    register_resolvers()
    with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
        cfg = hydra_compose(config_name="config", overrides=[
            *([f"algo={algo}"] if algo in group_options("algo") else []), f"model.source={_quoted(source)}"])
    held = []
    for key, (value, tiny) in real_model_choices(cfg).items():
        node = tree
        for part in lightning_path(key) or ():
            node = node.get(part) if isinstance(node, dict) else None
        if node == value:
            held.append(f"{key}={value} (the tiny model's: {tiny})")
    if not held:
        return None
    return (f"note: model.source={source} is not the tiny model, so it trains with a real model's settings (TRL's "
            f"and verl's): {', '.join(held)}; give these keys to choose others")


def to_lightning_tree(hydra_tree: dict) -> dict:
    """The composed Hydra ``hydra_tree`` (without its ``scheduler`` section) as LightningCLI's tree: each
    section where ``lit_ppo.config.keys.SECTIONS`` puts it, rollout's keys over data's."""
    rollout = hydra_tree.pop("rollout", {}) or {}
    out: dict[str, Any] = {"model": {}, "data": {}, "trainer": {}}
    for key, value in hydra_tree.items():
        path = lightning_path(key)
        if path is None:
            raise ConfigError(f"{key} is not a config section" + (
                foreign_key_hint(key) or f": must be one of {', '.join([*SECTIONS, 'scheduler'])}"))
        *parents, leaf = path
        node = out
        for p in parents:
            node = node.setdefault(p, {})
        if isinstance(node.get(leaf), dict) and isinstance(value, dict):
            node[leaf].update(value)
        else:
            node[leaf] = value
    follow_sampling_temperature(out["model"].get("actor"), out["data"].get("gconfig"))
    for key, value in rollout.items():
        if key not in ROLLOUT_KEYS:
            raise ConfigError(f"rollout.{key} is not a key{_suggest(f'rollout.{key}')}: must be one of "
                              f"{', '.join(ROLLOUT_KEYS)}")
        out["data"][key] = value
    return out
