"""The presets of ``conf/`` (Hydra config groups) and the names of their keys, without Lightning or torch:
what ``fit --help`` and the composition of a run share (``lit_ppo.launch.compose`` builds on it)."""

from __future__ import annotations

import re
from importlib import resources
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from lit_ppo.config.keys import typed_key
from lit_ppo.config.model import base_model
from lit_ppo.errors import ConfigError

EVALUATING = ("validate", "test")
"""Subcommands that score the test split of a trained (or the untrained) model (lit_ppo.rollout.evaluation)."""
FLAG_KEYS = ("config", "ckpt_path", "weights_only", "print_config")
"""LightningCLI's own arguments: flags of the command (``--ckpt_path X``), not config keys."""


def conf_dir() -> Path:
    """The Hydra config tree (``conf/``, installed as ``lit_ppo.conf``)."""
    return Path(str(resources.files("lit_ppo.conf")))


def group_options(group: str) -> list[str]:
    """The options of the config ``group`` (``algo``: dapo, ..., sapo), sorted."""
    return sorted(p.stem for p in (conf_dir() / group).glob("*.yaml"))


def groups() -> list[str]:
    """The config groups in the order of ``conf/config.yaml``'s defaults list (algo, model, data, ...)."""
    defaults = OmegaConf.load(conf_dir() / "config.yaml").defaults
    return [next(iter(entry)) for entry in defaults if isinstance(entry, dict) or OmegaConf.is_dict(entry)]


def is_group(override: str) -> bool:
    """Whether ``override`` chooses an option of a config group (``algo=grpo``, ``+rejection=...``)."""
    key = override.lstrip("+~").split("=", 1)[0]
    return "." not in key and (conf_dir() / key).is_dir()


def follow_sampling_temperature(actor: dict | None, gconfig: dict | None) -> None:
    """One temperature: the trainer's log-probs (``actor``'s) follow the sampler's (``gconfig``'s) unless
    actor.temperature is set as well."""
    if isinstance(actor, dict) and isinstance(gconfig, dict) and "temperature" in gconfig:
        actor.setdefault("temperature", gconfig["temperature"])


REAL_MODEL_RESOLVER = "tiny_or_real"
"""``${tiny_or_real:a,b}``: a for the tiny model (model.source=tiny, or a directory lit_ppo wrote from it:
``lit_ppo.config.model.base_model``), b for any other: the presets' settings that suit only the tiny model (a
large learning rate) and what a real model gets instead."""


def register_resolvers() -> None:
    """The interpolations the presets use: ``${int_mul:a,f}``, ``${on_gpu:a,b}`` and ``${tiny_or_real:a,b}``."""
    if not OmegaConf.has_resolver("int_mul"):
        # ${int_mul:a,f}: max(1, int(a * f)), e.g. a buffer that is a fraction of a token budget.
        OmegaConf.register_new_resolver("int_mul", lambda a, f: max(1, int(int(a) * float(f))))
    if not OmegaConf.has_resolver("on_gpu"):
        # ${on_gpu:a,b}: a where CUDA devices are visible, else b (presets that suit both kinds of machine).
        OmegaConf.register_new_resolver("on_gpu", _on_gpu)
    if not OmegaConf.has_resolver(REAL_MODEL_RESOLVER):
        OmegaConf.register_new_resolver(REAL_MODEL_RESOLVER, _tiny_or_real)


def _on_gpu(on_gpu, otherwise):
    import torch  # only a preset that asks loads torch: help and the other presets compose without it

    return on_gpu if torch.cuda.is_available() else otherwise


def typed_overrides(overrides: list[str]) -> list[str]:
    """The overrides with LightningCLI's names (what ``--print_config`` shows) rewritten to the keys
    Hydra composes, so that they set the same value as the command line's own names and win over the
    presets: ``data.gconfig.n_samples=8`` -> ``gconfig.n_samples=8``, ``model.actor.eps_clip`` ->
    ``actor.eps_clip``, ``data.engine`` -> ``rollout.engine``, ``trainer.logger.init_args.run_name`` ->
    ``logger.init_args.run_name``, ``seed_everything`` -> ``seed``. ConfigError of one line for a name
    that only another way can set: a preset group (``model.algo=x``: ``algo=x``) or a flag."""
    out = []
    for override in overrides:
        prefix, key, eq, value = re.fullmatch(r"([+~]*)([^=]*)(=?)(.*)", override, re.S).groups()
        if key in FLAG_KEYS:
            raise ConfigError(f"{key} is not a config key: give the flag --{key}" + (f" {value}" if value else ""))
        typed = typed_key(key)
        if typed != key and (conf_dir() / typed).is_dir():
            options = group_options(typed)
            choice = (value if value in options else
                      "none" if value.lower() in ("false", "null", "none") and "none" in options else "<option>")
            raise ConfigError(f"{key}={value} cannot be set here: the {typed} preset sets it: use {typed}={choice} "
                              f"(one of {', '.join(options)})")
        out.append(prefix + typed + eq + value)
    return out


def _tiny_or_real(tiny, real, _root_):
    return tiny if base_model(OmegaConf.select(_root_, "model.source")) == "tiny" else real


def real_model_choices(cfg) -> dict[str, tuple[Any, str]]:
    """The keys of a composed (unresolved) Hydra ``cfg`` that take a real model's value: each
    ``${tiny_or_real:a,b}`` that no override replaced, where model.source is not the tiny model. Key ->
    (its value, the tiny model's as the preset writes it)."""
    if base_model(OmegaConf.select(cfg, "model.source")) == "tiny":
        return {}
    chosen = {}

    def walk(node, prefix: str) -> None:
        for key in node.keys():
            child = node._get_node(key)
            if OmegaConf.is_dict(child):
                walk(child, f"{prefix}{key}.")
                continue
            tiny = re.fullmatch(rf"\$\{{{REAL_MODEL_RESOLVER}:\s*([^,]+),.*\}}", str(child._value()).strip())
            if child._is_interpolation() and tiny:
                chosen[f"{prefix}{key}"] = (node[key], tiny.group(1).strip())

    walk(cfg, "")
    return chosen


def given_task_kwargs(overrides: list[str]) -> set[str]:
    """The ``data.task_kwargs`` keys that ``overrides`` (with the command line's names) set."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    given = set()
    for override in overrides:
        key = override.lstrip("+~").split("=", 1)[0]
        if key.startswith("data.task_kwargs."):
            given.add(key.split(".")[2])
        elif key == "data.task_kwargs" and "=" in override:
            value = OverridesParser.create().parse_overrides([override])[0].value()
            given.update(value if isinstance(value, dict) else ())
    return given


def keep_taken_task_kwargs(task_kwargs: dict, task, given: set[str]) -> dict:
    """``task_kwargs`` of a ``data.task`` that is not its data preset's own: the preset's keys that ``task``
    does not take are dropped (they were its preset task's settings, never the user's); the ``given`` keys
    stay, and the task refuses those it does not take."""
    from lit_ppo.tasks import task_parameters  # the task's class: only for a task the preset did not choose

    taken = task_parameters(task)
    if taken is None:
        return task_kwargs
    return {key: value for key, value in task_kwargs.items() if key in given or key in taken}
