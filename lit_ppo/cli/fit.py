"""Both front ends of ``python -m lit_ppo fit``: Hydra-style overrides and LightningCLI YAML.

Hydra composes ``conf/`` with the user's ``group=option`` / ``key=value`` overrides; the result is
mapped onto LightningCLI's argument tree, validated, written to a YAML file and handed to the same
LitPPOCLI that ``--config run.yaml`` uses, so both paths validate, instantiate and save the config
identically and ``--print_config`` output replays exactly. The names ``--print_config`` and the MLflow
params show (``data.gconfig.n_samples``, ``model.actor.eps_clip``) work as overrides too.
"""

from __future__ import annotations

import inspect
import re
import sys
import tempfile
import typing
from dataclasses import fields, is_dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Callable

import yaml
from lightning.pytorch.callbacks import ModelCheckpoint, ProgressBar
from lightning.pytorch.cli import LightningCLI

from lit_ppo import schedulers
from lit_ppo.cli.explain import check_trainer, explain_hydra_error, explain_parser_error, read_config_file
from lit_ppo.cli.user_exit import user_exit_message
from lit_ppo.algos.checks import check_names
from lit_ppo.config import (ROLLOUT_KEYS, EvalConfig, GenerationConfig, ModelConfig, PPOActorConfig, PPOCriticConfig,
                            check_value, type_hints, typed_key)
from lit_ppo.errors import ConfigError, RunStopped
from lit_ppo.models import MODEL_SOURCES, model_dir_problem
from lit_ppo.rollout.producer import decoupled_loss_problem
from lit_ppo.rollout.workflows import task_name
from lit_ppo.run.resume import check_resume_args, recorded_config
from lit_ppo.run.tracking import RUN_DIR_ENV, TrackedConfig, end_started_runs, run_name, start, start_mlflow_runs
from lit_ppo.schedulers import scheduler_config
from lit_ppo.training.datamodule import RolloutDataModule
from lit_ppo.training.module import LitPPO
from lit_ppo.utils.flags import flag_value, split_arguments
from lit_ppo.utils.quiet import quiet_dependencies
from lit_ppo.utils.stop_requests import Stopped, exit_code, pending_failure, received_signal, signal_name
from lit_ppo.utils.text import closest, did_you_mean, one_of

# Hydra root key -> path in LightningCLI's tree.
HYDRA_TO_LIGHTNING = {
    "algo": ("model", "algo"),
    "model": ("model", "model"),
    "actor": ("model", "actor"),
    "critic": ("model", "critic"),
    "data": ("data",),
    "gconfig": ("data", "gconfig"),
    "eval": ("data", "eval"),
    "trainer": ("trainer",),
    "logger": ("trainer", "logger"),
    "seed": ("seed_everything",),
}
FLAG_KEYS = ("config", "ckpt_path", "weights_only", "print_config")
"""LightningCLI's own arguments: flags of the command (``--ckpt_path X``), not config keys."""
SEED_RANGE = (0, 2**32 - 1)
"""Seeds numpy (and so Lightning's seed_everything) accepts."""
NAME_MAX = 255
"""Bytes in one file name: the run directory's, ``<run name>-YYYYmmdd-HHMMSS`` (``-N`` on a collision)."""
EVALUATING = ("validate", "test")
"""Subcommands that score the test split of a trained (or the untrained) model (lit_ppo.rollout.evaluation)."""


def _print_error(message: str) -> None:
    """``error: message`` as one write: the ranks of one run share stderr, and print writes the
    newline in a second call to the file, after which another rank's line may land."""
    sys.stderr.write(f"error: {message}\n")
    sys.stderr.flush()


def conf_dir() -> Path:
    return Path(str(resources.files("lit_ppo.conf")))


def group_options(group: str) -> list[str]:
    return sorted(p.stem for p in (conf_dir() / group).glob("*.yaml"))


# ---------------------------------------------------------------------------------------------
# Hydra front end
# ---------------------------------------------------------------------------------------------

def _register_resolvers() -> None:
    from omegaconf import OmegaConf

    if not OmegaConf.has_resolver("int_mul"):
        # ${int_mul:a,f}: max(1, int(a * f)), e.g. a buffer that is a fraction of a token budget.
        OmegaConf.register_new_resolver("int_mul", lambda a, f: max(1, int(int(a) * float(f))))
    if not OmegaConf.has_resolver("on_gpu"):
        # ${on_gpu:a,b}: a where CUDA devices are visible, else b (presets that suit both kinds of machine).
        OmegaConf.register_new_resolver("on_gpu", _on_gpu)


def _on_gpu(on_gpu, otherwise):
    import torch

    return on_gpu if torch.cuda.is_available() else otherwise


def _explain_hydra_error(error: Exception, overrides: list[str], typed: list[str]) -> str:
    """One line for a composition error; ``typed[i]`` is what the user typed for ``overrides[i]``."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

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


def _known_keys() -> dict[str, list[str]]:
    """Hydra-side section -> field names, for 'did you mean' suggestions."""
    return {"actor": [f.name for f in fields(PPOActorConfig)], "critic": [f.name for f in fields(PPOCriticConfig)],
            "gconfig": [f.name for f in fields(GenerationConfig)], "model": [f.name for f in fields(ModelConfig)],
            "eval": [f.name for f in fields(EvalConfig)],
            "data": list(inspect.signature(RolloutDataModule.__init__).parameters)[1:],
            "rollout": list(ROLLOUT_KEYS),
            "scheduler": [f.name for cls in (schedulers.SlurmConfig, schedulers.RayConfig) for f in fields(cls)],
            "trainer": list(inspect.signature(__import__("lightning").Trainer.__init__).parameters)[1:],
            "logger": ["class_path", "init_args"]}


_SECTION_TYPES = {"actor": PPOActorConfig, "critic": PPOCriticConfig, "gconfig": GenerationConfig,
                  "eval": EvalConfig, "model": ModelConfig, "data": RolloutDataModule.__init__}
"""Hydra-side section -> what declares its fields' types (nested sections follow the type hints)."""


def _section_keys(section: str) -> list[str]:
    """The keys of the Hydra-side ``section`` (``actor``, ``actor.optimizer``, ``trainer``); [] where unknown."""
    root, *rest = section.split(".")
    if not rest:
        return _known_keys().get(root, [])
    owner = _SECTION_TYPES.get(root)
    for part in rest:
        hint = type_hints(owner).get(part) if owner is not None else None
        owner = next((t for t in typing.get_args(hint) or (hint,) if is_dataclass(t)), None)
    return [f.name for f in fields(owner)] if owner is not None else []


def _suggest(key: str) -> str:
    """`` (did you mean <section>.<field>?)`` for a mistyped ``key``, in the section as typed (a
    LightningCLI name such as ``model.model.lora_rnk`` included); for a key without a section, the
    keys that end in it or close to it (``lr``: ``actor.optimizer.lr or critic.optimizer.lr``); "" when
    nothing is close."""
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
    sections, out = _known_keys(), []

    def walk(prefix: str) -> None:
        for name in _section_keys(prefix):
            if name not in sections:
                out.append(f"{prefix}.{name}")
                walk(f"{prefix}.{name}")

    for section in sections:
        walk(section)
    return out


def _is_group(override: str) -> bool:
    key = override.lstrip("+~").split("=", 1)[0]
    return "." not in key and (conf_dir() / key).is_dir()


def _add_known_keys(overrides: list[str], composed) -> list[str]:
    """``section.field=value`` for a field the presets do not set becomes ``+section.field=value``, and
    ``key={...}`` for a mapping a preset sets ``++key={...}`` (its keys merged into the preset's): every
    dataclass field can be overridden without knowing which keys a preset writes."""
    from omegaconf import DictConfig, OmegaConf

    known = _known_keys()
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
        if (override[0] not in "+~" and not _is_group(override) and absent
                and (parts[1] in known.get(parts[0], ()) and (not nested or parts[-1] in nested)
                     if len(parts) >= 2 else key in HYDRA_TO_LIGHTNING)):
            override = "+" + override
        out.append(override)
    return out


_ABSENT = object()


def _typed_overrides(overrides: list[str]) -> list[str]:
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


def _quoted(value: str) -> str:
    """``value`` as a Hydra single-quoted string."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _model_dir_overrides(overrides: list[str]) -> list[str]:
    """``model=DIR`` (a value that is not an option of the model group) becomes ``model.source=DIR``,
    DIR made absolute, on top of the default model option; anything else is left as is. ConfigError
    for a value that is neither an option nor a loadable local causal LM directory."""
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
        problem = model_dir_problem(value)
        if problem is not None:
            raise ConfigError(f"model={value} {problem}")
        out.append(f"model.source={_quoted(str(path.absolute()))}")
    return out


def compose(overrides: list[str]) -> dict:
    """The Hydra-composed config for ``overrides``, resolved, as LightningCLI's tree."""
    return compose_run(overrides)[0]


def compose_run(overrides: list[str]) -> tuple[dict, schedulers.JobConfig | None]:
    """``compose``'s tree and the checked ``scheduler`` section: None to run here, else the job's."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    _register_resolvers()
    typed = list(overrides)
    overrides = _model_dir_overrides(_typed_overrides(overrides))
    try:
        with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
            presets = hydra_compose(config_name="config", overrides=[o for o in overrides if _is_group(o)])
            overrides = _add_known_keys(overrides, presets)
            cfg = hydra_compose(config_name="config", overrides=overrides)
        tree = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
    except (HydraException, OmegaConfBaseException) as e:
        raise ConfigError(_explain_hydra_error(e, overrides, typed)) from None
    scheduler = scheduler_config(tree.pop("scheduler", None))
    return to_lightning_tree(tree), scheduler


def to_lightning_tree(hydra_tree: dict) -> dict:
    rollout = hydra_tree.pop("rollout", {}) or {}
    out: dict[str, Any] = {"model": {}, "data": {}, "trainer": {}}
    for key, value in hydra_tree.items():
        if key not in HYDRA_TO_LIGHTNING:
            raise ConfigError(f"{key} is not a config section: must be one of "
                              f"{', '.join(sorted(HYDRA_TO_LIGHTNING) + ['rollout', 'scheduler'])}")
        *parents, leaf = HYDRA_TO_LIGHTNING[key]
        node = out
        for p in parents:
            node = node.setdefault(p, {})
        if isinstance(node.get(leaf), dict) and isinstance(value, dict):
            node[leaf].update(value)
        else:
            node[leaf] = value
    # One temperature: the trainer's log-probs follow the sampler's unless actor.temperature is set as well.
    actor, gconfig = out["model"].get("actor"), out["data"].get("gconfig")
    if isinstance(actor, dict) and isinstance(gconfig, dict) and "temperature" in gconfig:
        actor.setdefault("temperature", gconfig["temperature"])
    for key, value in rollout.items():
        if key not in ROLLOUT_KEYS:
            raise ConfigError(f"rollout.{key} is not a key{_suggest(f'rollout.{key}')}: must be one of "
                              f"{', '.join(ROLLOUT_KEYS)}")
        out["data"][key] = value
    return out


# ---------------------------------------------------------------------------------------------
# validation (both front ends): one line naming the key and what is allowed
# ---------------------------------------------------------------------------------------------

def _construct(cls, values: Any, key: str, check: Callable[[Any], None] | None = None):
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


def _check_seed(key: str, value: Any) -> None:
    low, high = SEED_RANGE
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ConfigError(f"{key}={value!r} is invalid: must be an integer in [{low}, {high}]")


def _check_logger(trainer: dict) -> None:
    """``logger.init_args.*`` on top of ``logger=none`` (no logger to give them to)."""
    logger = trainer.get("logger")
    if isinstance(logger, dict) and "class_path" not in logger:
        key = "logger." + next(iter(logger), "init_args")
        raise ConfigError(f"{key} is given without a logger (logger=none): choose one, logger=mlflow, csv or "
                          f"tensorboard, or drop {key}")


def _check_run_names(trainer: dict) -> None:
    """A logger's run name must leave the run directory's name, ``<run name>-YYYYmmdd-HHMMSS``, within
    one file name (with room for the ``-N`` of a collision)."""
    loggers = trainer.get("logger")
    stamp = len(run_name("x")) - 1
    longest = NAME_MAX - stamp - len("-99")
    for spec in loggers if isinstance(loggers, list) else [loggers]:
        name = (spec.get("init_args") or {}).get("run_name") if isinstance(spec, dict) else None
        if name is None:
            continue
        length = len(run_name(str(name)).encode()) - stamp  # as the directory spells it
        if length > longest:
            shown = str(name)[:24] + "..."
            raise ConfigError(f"logger.init_args.run_name={shown} is invalid: must be at most {longest} characters "
                              f"(it has {length}): the run directory, <run name>-YYYYmmdd-HHMMSS, is one file name "
                              f"of at most {NAME_MAX} bytes")


def check_config(tree: dict, subcommand: str = "fit") -> None:
    """Check a LightningCLI tree for ``subcommand`` before anything is instantiated (no model is loaded)."""
    if "seed_everything" in tree:
        _check_seed("seed", tree["seed_everything"])
    model = tree.get("model") or {}
    for name in model:
        if name not in ("model", "actor", "critic", "algo"):
            raise ConfigError(f"model.{name} is not a key; allowed: algo, actor, critic, model")
    actor = _construct(PPOActorConfig, model.get("actor") or {}, "actor", check_names)
    _construct(PPOCriticConfig, model.get("critic"), "critic")
    model_cfg = _construct(ModelConfig, model.get("model") or {}, "model")
    if model_cfg is not None and model_cfg.source not in MODEL_SOURCES:
        problem = model_dir_problem(model_cfg.source)
        if problem is not None:
            raise ConfigError(f"model.source={model_cfg.source} {problem}")
    data = dict(tree.get("data") or {})
    allowed = list(inspect.signature(RolloutDataModule.__init__).parameters)[1:]
    for name in data:
        if name not in allowed:
            hint = did_you_mean(name, allowed, prefix="data.")
            raise ConfigError(f"data.{name} is not a key{hint}; allowed: {', '.join(allowed)}")
    hints = type_hints(RolloutDataModule.__init__)
    for name, value in data.items():
        if name not in ("gconfig", "eval"):  # configs of their own, checked as they are built
            try:
                check_value(typed_key(f"data.{name}"), value, hints[name])
            except ValueError as e:
                raise ConfigError(str(e)) from None
    if "seed" in data:
        _check_seed("data.seed", data["seed"])
    gconfig = _construct(GenerationConfig, data.get("gconfig") or {}, "gconfig")
    eval_cfg = _construct(EvalConfig, data.get("eval") or {}, "eval")
    try:  # builds the task (its data, not a model): bad task settings fail here
        datamodule = RolloutDataModule(**{**data, "gconfig": gconfig, "eval": eval_cfg})
    except (ValueError, TypeError) as e:
        raise ConfigError(str(e).splitlines()[0]) from None
    if subcommand in EVALUATING and datamodule.eval_problem_count() == 0:
        raise ConfigError(f"{subcommand}: task {task_name(datamodule.task)!r} has no test problems to score "
                          f"(eval.max_problems={datamodule.eval.max_problems}; a dataset task takes "
                          f"data.task_kwargs.test_path or test_fraction)")
    problem = decoupled_loss_problem(datamodule.max_head_offpolicyness, actor.use_decoupled_loss)
    if problem:
        raise ConfigError(problem)
    if actor.temperature != gconfig.temperature:
        raise ConfigError(f"actor.temperature={actor.temperature} must equal gconfig.temperature="
                          f"{gconfig.temperature}: the trainer recomputes log-probs under the sampling distribution")
    if actor.reward_norm is not None and actor.reward_norm.mean_level == "group" and gconfig.n_samples == 1:
        import warnings

        warnings.warn("actor.reward_norm.mean_level=group with gconfig.n_samples=1: singleton group centering "
                      "erases the task reward", UserWarning, stacklevel=2)
    _check_logger(tree.get("trainer") or {})
    check_trainer(tree.get("trainer") or {})
    if subcommand == "fit":
        _check_run_names(tree.get("trainer") or {})


# ---------------------------------------------------------------------------------------------
# LightningCLI
# ---------------------------------------------------------------------------------------------

class LitPPOCLI(LightningCLI):
    def __init__(self, args: list[str], **kwargs: Any):
        """``kwargs``: more LightningCLI arguments (a Ray worker's ``trainer_defaults``)."""
        super().__init__(LitPPO, RolloutDataModule, args=args, save_config_callback=TrackedConfig,
                         save_config_kwargs={"overwrite": True, "save_to_log_dir": False}, parser_kwargs={"exit_on_error": False},
                         seed_everything_default=0, auto_configure_optimizers=False, **kwargs)

    def before_instantiate_classes(self) -> None:
        if self.subcommand in EVALUATING:
            # The scores print as a table; nothing is recorded: no run directory, tracking or saved config.
            self.run_dir = None
            self.save_config_callback = None
            self.config[self.subcommand].trainer.logger = False
            return
        # Before any model loads: a tracking store that answers (else a ConfigError), the run's own directory.
        self.run_dir = start(self.config[self.subcommand])
        self.save_config_kwargs["run_dir"] = self.run_dir

    def instantiate_trainer(self, **kwargs):
        # Whatever Lightning writes under default_root_dir lands in the run directory too.
        if self.run_dir is not None:
            kwargs.setdefault("default_root_dir", str(self.run_dir))
        trainer_config = self._get(self.config_init, "trainer", default={})
        callbacks = trainer_config.get("callbacks") or []
        if trainer_config.get("enable_progress_bar") is False:
            # The presets' progress callback yields to the switch (Lightning refuses the two together).
            callbacks = kwargs["callbacks"] = [cb for cb in callbacks if not isinstance(cb, ProgressBar)]
        if self.subcommand in EVALUATING:  # nothing trains, so nothing is checkpointed
            kwargs["callbacks"] = [cb for cb in callbacks if not isinstance(cb, ModelCheckpoint)]
        trainer = super().instantiate_trainer(**kwargs)
        if self.subcommand in EVALUATING:
            return trainer
        start_mlflow_runs(trainer, self.config[self.subcommand], self.run_dir)
        return trainer

    def instantiate_classes(self) -> None:
        try:
            super().instantiate_classes()
        except SystemExit as e:  # user code (a model, task or callback class) exiting is a failure here
            raise RunStopped(user_exit_message(e, "while the run was built")) from e

    def _run_subcommand(self, subcommand: str) -> None:
        try:
            super()._run_subcommand(subcommand)
        except SystemExit as e:
            if received_signal() is not None:  # Lightning exits after a signal that abandoned an iteration
                raise
            where = (f"during iteration {self.trainer.global_step + 1}" if subcommand == "fit"
                     else f"during {subcommand}")
            raise RunStopped(user_exit_message(e, where)) from e
        except Exception as e:
            if not _collective_failure(e, self.trainer):
                raise
            raise RunStopped(_lost_peers(self.trainer)) from e
        except Stopped as e:  # a signal outside the training loop (GracefulStop handles those inside it)
            e.where = (f"during {subcommand}" if subcommand != "fit" else "before the first iteration"
                       if self.trainer.global_step == 0 else f"after iteration {self.trainer.global_step}")
            raise
        finally:
            if received_signal() is not None:
                end_started_runs("KILLED")


def _collective_failure(error: Exception, trainer) -> bool:
    """Whether ``error`` is a collective that failed because another rank of the run is gone."""
    import torch.distributed as dist

    if trainer.world_size <= 1:
        return False
    text = str(error)
    return isinstance(error, dist.DistError) or any(
        marker in text for marker in ("Connection closed by peer", "Connection reset by peer", "Broken pipe"))


def _lost_peers(trainer) -> str:
    """The one line about the ranks that a collective lost: "" when each of them ended with exit code 1
    (lit_ppo printed its error line there: one line per failure, from the rank that failed)."""
    import subprocess

    procs = getattr(trainer.strategy.launcher, "procs", None) or []  # the ranks Lightning started from here
    lines = [] if procs else ["another rank of the run stopped (see its error)"]
    for rank, proc in enumerate(list(procs), start=1):
        try:
            code = proc.wait(timeout=15)  # it closed its connections: it is ending
        except subprocess.TimeoutExpired:
            code = None
        if code is not None:  # ended: Lightning's process observer must not SIGKILL this process for it
            procs.remove(proc)
        if code in (0, 1):
            continue
        lines.append(f"rank {rank} " + ("still runs" if code is None else f"was killed by {signal_name(-code)}"
                                       if code < 0 else f"exited with code {code}"))
    return f"rank {trainer.global_rank} stopped: {'; '.join(lines)}" if lines else ""


# Lightning notes about choices LitPPO makes on purpose: checkpoints hold the weights after the
# iteration's update (what resuming needs), and the step pulls its own batch (dataloader_iter) so
# that nothing is generated ahead of the weight push; sys.argv holds the command beside LightningCLI's
# args on purpose (a DDP launcher re-runs it).
EXPECTED_WARNINGS = ("Using ModelCheckpoint with manual optimization", "You are using the `dataloader_iter` step",
                     "Found `dataloader_iter` argument", "Found .* module\\(s\\) in eval mode",
                     "LightningCLI's args parameter is intended",
                     "Be aware that when using `ckpt_path`, callbacks used to create the checkpoint",
                     # eval/* are sums that on_validation_epoch_end all-reduces itself.
                     "It is recommended to use `self.log\\('eval/")


def _keep_traceback(error: BaseException) -> Path | None:
    """Append the traceback of a stopped run to its run directory's ``error.log``; that file."""
    import os
    import traceback

    run_dir = os.environ.get(RUN_DIR_ENV)
    if run_dir and Path(run_dir).is_dir():
        try:
            with open(Path(run_dir) / "error.log", "a", encoding="utf-8") as log:
                log.write("".join(traceback.format_exception(error)))
        except OSError:  # the disk that failed the run may refuse the log too: the traceback goes to stderr
            return None
        return Path(run_dir) / "error.log"
    return None


def _set_key(tree: dict, override: str) -> None:
    """Apply one ``key=value`` override (Hydra-side key, YAML value) to a LightningCLI tree."""
    key, _, value = override.partition("=")
    root, *rest = key.split(".")
    if root == "rollout":
        path = ["data", *rest]
    elif root in HYDRA_TO_LIGHTNING:
        path = [*HYDRA_TO_LIGHTNING[root], *rest]
    else:
        raise ConfigError(f"{key} is not a key: must start with one of "
                          f"{', '.join(sorted(HYDRA_TO_LIGHTNING) + ['rollout'])}")
    node = tree
    for part in path[:-1]:
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            raise ConfigError(f"{key}: {part} is not a mapping in the checkpoint's config")
        node = child
    node[path[-1]] = yaml.safe_load(value) if value else None
    if key == "seed":  # as in fit, where data.seed follows seed
        tree.setdefault("data", {})["seed"] = node[path[-1]]


TRAINED_SECTIONS = ("algo", "model", "actor", "critic", "rejection")
"""What the model in a checkpoint was trained as: LightningCLI restores it from the checkpoint."""


def _check_evaluation_overrides(subcommand: str, overrides: list[str], typed: list[str]) -> None:
    """ConfigError for an override that ``validate`` / ``test --ckpt_path`` would ignore: the model's
    settings (LightningCLI takes the checkpoint's) and the logger's (nothing is recorded). ``typed``:
    ``overrides`` as given, ``overrides`` under Hydra's names."""
    for original, override in zip(typed, overrides):
        key = override.lstrip("+~").split("=", 1)[0]
        shown = original.lstrip("+~")
        if key.split(".")[0] in TRAINED_SECTIONS:
            raise ConfigError(f"{shown} cannot be given to {subcommand} --ckpt_path: it scores the checkpoint's "
                              f"model as trained (algo, model.*, actor.*, critic.* come from the checkpoint); "
                              f"eval.*, gconfig.*, rollout.*, data.* and trainer.* can change")
        if key.startswith("logger."):
            raise ConfigError(f"{shown} cannot be given to {subcommand}: it records nothing (no logger, run "
                              f"directory or MLflow run); the scores are printed")


def evaluation_tree(subcommand: str, ckpt_path: str, overrides: list[str]) -> dict | None:
    """The config of ``validate`` / ``test --ckpt_path``: the run's own, recorded in the checkpoint,
    with ``key=value`` overrides on top (e.g. ``eval.k=16``); None for a checkpoint that records none
    (then the overrides are fit's, composed from the presets). ConfigError for an override of the
    model's settings, which the checkpoint's replace."""
    try:
        text = recorded_config(ckpt_path)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    typed, overrides = overrides, _typed_overrides(overrides)
    _check_evaluation_overrides(subcommand, overrides, typed)
    if text is None:
        return None
    groups = [o for o in overrides if _is_group(o)]
    if groups:
        raise ConfigError(f"{subcommand} --ckpt_path uses the checkpoint's own config: {groups[0]} cannot change it "
                          f"(give key=value overrides, or every fit override with --config run.yaml)")
    tree = {k: v for k, v in yaml.safe_load(text).items() if k in ("model", "data", "trainer", "seed_everything")}
    for override in overrides:
        _set_key(tree, override)
    return tree


def _fit_on_ray_worker(job: dict) -> None:
    """A ``scheduler=ray`` worker's rank of the fit (``lit_ppo.cli.ray_worker``, which imports Ray: only
    Ray's workers load it)."""
    from lit_ppo.cli.ray_worker import fit_on_worker

    fit_on_worker(job)


def run(argv: list[str]) -> int:
    """``fit``, ``validate`` or ``test`` with Hydra overrides and/or LightningCLI flags; returns the
    exit code."""
    import warnings

    for message in EXPECTED_WARNINGS:
        warnings.filterwarnings("ignore", message=message)
    quiet_dependencies()
    subcommand, rest = argv[0], argv[1:]
    try:
        overrides, flags = split_arguments(rest)
        config_file = flag_value(flags, "--config")
        if config_file is not None:
            if overrides:
                raise ConfigError("give either Hydra overrides (key=value) or --config run.yaml, not both")
            loaded = read_config_file(config_file)
            check_config({k: v for k, v in loaded.items() if k in ("model", "data", "trainer", "seed_everything")},
                     subcommand)
            check_resume_args(flags, loaded, error=ConfigError)
            args = [subcommand] + flags
        else:
            ckpt_path = flag_value(flags, "--ckpt_path") if subcommand in EVALUATING else None
            tree = evaluation_tree(subcommand, ckpt_path, overrides) if ckpt_path else None
            # A config read from the checkpoint (which evaluation_tree verified) matches it by construction.
            from_checkpoint = tree is not None
            scheduler = None
            if tree is None:
                tree, scheduler = compose_run(overrides)
                if scheduler is not None:
                    schedulers.check_trainer(scheduler, tree["trainer"])
            check_config(tree, subcommand)
            if not from_checkpoint:
                check_resume_args(flags, tree, error=ConfigError)
            if scheduler is not None:
                if subcommand != "fit":
                    raise ConfigError(f"scheduler={schedulers.scheduler_name(scheduler)} submits fit only: "
                                      f"run {subcommand} here (scheduler=local)")
                if not any(flag.split("=", 1)[0] == "--print_config" for flag in flags):
                    return schedulers.submit(scheduler, overrides, flags, tree, _fit_on_ray_worker)
                tree["trainer"].update(schedulers.job_trainer(scheduler, tree["trainer"]))  # the job's config
            handle = tempfile.NamedTemporaryFile("w", suffix=".yaml", prefix="lit_ppo_", delete=False)
            with handle:
                yaml.safe_dump(tree, handle, sort_keys=False)
            args = [subcommand, "--config", handle.name] + flags
        # A DDP launcher starts the other ranks by re-running sys.argv: make it this very command.
        saved_argv, sys.argv = sys.argv, [sys.argv[0], *argv]
        try:
            LitPPOCLI(args)
        except SystemExit:  # Lightning exits after a stop signal that abandoned an iteration
            if received_signal() is None:
                raise  # the parser's own exit (--print_config, --help)
        finally:
            sys.argv = saved_argv
    except ConfigError as e:
        _print_error(str(e))
        return 2
    except Stopped as e:
        end_started_runs("KILLED")
        where = getattr(e, "where", None) or ("during " + subcommand if subcommand in EVALUATING else
                                             "before the first iteration")
        what = (": no scores" if subcommand in EVALUATING else
                ": nothing was trained" if where == "before the first iteration" else "")
        _print_error(f"stopped by {signal_name(e.signum)} {where}{what}")
        return exit_code(e.signum)
    except RunStopped as e:
        if not str(e):  # another process of the run has said why
            return 1
        log = _keep_traceback(e)
        _print_error(f"{e}" + (f" (traceback in {log})" if log else ""))
        return 1
    except Exception as e:  # jsonargparse parse errors arrive as ArgumentError / ValueError
        if type(e).__name__ in ("ArgumentError", "NSKeyError") or isinstance(e, SystemExit):
            _print_error(explain_parser_error(e))
            return 2
        # Anything else failed the run: one line, the traceback kept in the run directory (or, without
        # one, shown, since it is all there is to go on).
        log = _keep_traceback(e)
        if log is None:
            import traceback

            traceback.print_exception(e)
        reason = str(e).strip().splitlines()[0] if str(e).strip() else ""
        _print_error(f"{type(e).__name__}: {reason}" + (f" (traceback in {log})" if log else ""))
        return 1
    failure = pending_failure()
    if failure is not None:
        _print_error(failure)
        return 1
    signum = received_signal()
    return 0 if signum is None else exit_code(signum)
