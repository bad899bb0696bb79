"""Both front ends of ``python -m lit_ppo fit``: Hydra-style overrides and LightningCLI YAML.

Hydra composes ``conf/`` with the user's ``group=option`` / ``key=value`` overrides; the result is
mapped onto LightningCLI's argument tree, validated, written to a YAML file and handed to the same
LitPPOCLI that ``--config run.yaml`` uses, so both paths validate, instantiate and save the config
identically and ``--print_config`` output replays exactly.
"""

from __future__ import annotations

import difflib
import inspect
import sys
import tempfile
from dataclasses import fields, is_dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from lightning.pytorch.callbacks import ModelCheckpoint, ProgressBar
from lightning.pytorch.cli import LightningCLI

from lit_ppo.cli_errors import (ConfigError, check_trainer, explain_hydra_error, explain_parser_error, flag_value,
                                read_config_file, split_arguments)
from lit_ppo.callbacks.graceful_stop import mark_runs_killed, received_signal
from lit_ppo.checkpoints import check_resume_args, recorded_config
from lit_ppo.config import EvalConfig, GenerationConfig, PPOActorConfig, PPOCriticConfig
from lit_ppo.console import quiet_dependencies
from lit_ppo.data import RolloutDataModule
from lit_ppo.errors import RunStopped
from lit_ppo.models import MODEL_SOURCES, model_dir_problem
from lit_ppo.module import LitPPO, ModelConfig
from lit_ppo.rollout.producer import decoupled_loss_problem
from lit_ppo.rollout.workflows import task_name
from lit_ppo import schedulers
from lit_ppo.schedulers import scheduler_config
from lit_ppo.tracking import RUN_DIR_ENV, TrackedConfig, start, start_mlflow_runs


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
ROLLOUT_KEYS = ("engine", "engine_kwargs", "max_logp_gap", "max_head_offpolicyness", "num_threads", "devices")
"""The rollout group's keys: RolloutDataModule arguments under their own names (rollout.engine -> data.engine)."""
EVALUATING = ("validate", "test")
"""Subcommands that score the test split of a trained (or the untrained) model (lit_ppo.evaluation)."""


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


def _explain_hydra_error(error: Exception, overrides: list[str]) -> str:
    text = str(error)
    for override in overrides:
        key = override.lstrip("+~").split("=", 1)[0]
        if ("Could not override" in text and f"'{key}'" in text) or f"Key '{key.rsplit('.', 1)[-1]}'" in text:
            return f"{key} is not a key{_suggest(key)}"
    return explain_hydra_error(error, group_options)


def _known_keys() -> dict[str, list[str]]:
    """Hydra-side section -> field names, for 'did you mean' suggestions."""
    return {"actor": [f.name for f in fields(PPOActorConfig)], "critic": [f.name for f in fields(PPOCriticConfig)],
            "gconfig": [f.name for f in fields(GenerationConfig)], "model": [f.name for f in fields(ModelConfig)],
            "eval": [f.name for f in fields(EvalConfig)],
            "data": list(inspect.signature(RolloutDataModule.__init__).parameters)[1:],
            "rollout": list(ROLLOUT_KEYS),
            "scheduler": [f.name for cls in (schedulers.SlurmConfig, schedulers.RayConfig) for f in fields(cls)],
            "trainer": list(inspect.signature(__import__("lightning").Trainer.__init__).parameters)[1:]}


def _suggest(key: str) -> str:
    section, _, name = key.rpartition(".")
    candidates = _known_keys().get(section.split(".")[0], [])
    close = difflib.get_close_matches(name, candidates, n=1)
    return f" (did you mean {section}.{close[0]}?)" if close else ""


def _is_group(override: str) -> bool:
    key = override.lstrip("+~").split("=", 1)[0]
    return "." not in key and (conf_dir() / key).is_dir()


def _add_known_keys(overrides: list[str], composed) -> list[str]:
    """``section.field=value`` for a field the presets do not set becomes ``+section.field=value``:
    every dataclass field can be overridden without knowing which keys a preset writes."""
    from omegaconf import OmegaConf

    known = _known_keys()
    out = []
    for override in overrides:
        key = override.split("=", 1)[0]
        parts = key.split(".")
        absent = OmegaConf.select(composed, key, default=_ABSENT) is _ABSENT
        if (override[0] not in "+~" and not _is_group(override) and len(parts) >= 2 and absent
                and parts[1] in known.get(parts[0], ())):
            override = "+" + override
        out.append(override)
    return out


_ABSENT = object()


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
            raise ConfigError(f"model={value} is invalid: must be one of {', '.join(options)} "
                              f"or a local model directory")
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
    overrides = _model_dir_overrides(overrides)
    try:
        with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
            presets = hydra_compose(config_name="config", overrides=[o for o in overrides if _is_group(o)])
            overrides = _add_known_keys(overrides, presets)
            cfg = hydra_compose(config_name="config", overrides=overrides)
        tree = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
    except (HydraException, OmegaConfBaseException) as e:
        raise ConfigError(_explain_hydra_error(e, overrides)) from None
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
    for key, value in rollout.items():
        if key not in ROLLOUT_KEYS:
            raise ConfigError(f"rollout.{key} is not a key{_suggest(f'rollout.{key}')}: must be one of "
                              f"{', '.join(ROLLOUT_KEYS)}")
        out["data"][key] = value
    return out


# ---------------------------------------------------------------------------------------------
# validation (both front ends): one line naming the key and what is allowed
# ---------------------------------------------------------------------------------------------

def _construct(cls, values: Any, key: str):
    if values is None or is_dataclass(values):
        return values
    if not isinstance(values, dict):
        raise ConfigError(f"{key} must be a mapping of {cls.__name__} fields, got {values!r}")
    names = {f.name for f in fields(cls)}
    for name in values:
        if name not in names:
            close = difflib.get_close_matches(name, sorted(names), n=1)
            hint = f" (did you mean {key}.{close[0]}?)" if close else ""
            raise ConfigError(f"{key}.{name} is not a key{hint}; allowed: {', '.join(sorted(names))}")
    try:
        return cls(**values)
    except (ValueError, TypeError) as e:
        message = str(e).splitlines()[0]
        first = message.split("=", 1)[0]
        if first and " " not in first and not first.startswith(f"{key}."):
            message = f"{key}.{message}"
        raise ConfigError(message) from None


def validate(tree: dict, subcommand: str = "fit") -> None:
    """Check a LightningCLI tree for ``subcommand`` before anything is instantiated (no model is loaded)."""
    model = tree.get("model") or {}
    for name in model:
        if name not in ("model", "actor", "critic", "algo"):
            raise ConfigError(f"model.{name} is not a key; allowed: algo, actor, critic, model")
    actor = _construct(PPOActorConfig, model.get("actor") or {}, "actor")
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
            close = difflib.get_close_matches(name, allowed, n=1)
            hint = f" (did you mean data.{close[0]}?)" if close else ""
            raise ConfigError(f"data.{name} is not a key{hint}; allowed: {', '.join(allowed)}")
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
    check_trainer(tree.get("trainer") or {})


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

    def _run_subcommand(self, subcommand: str) -> None:
        try:
            super()._run_subcommand(subcommand)
        finally:
            if received_signal() is not None:
                mark_runs_killed(self.trainer)


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
        with open(Path(run_dir) / "error.log", "a", encoding="utf-8") as log:
            log.write("".join(traceback.format_exception(error)))
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


def evaluation_tree(subcommand: str, ckpt_path: str, overrides: list[str]) -> dict | None:
    """The config of ``validate`` / ``test --ckpt_path``: the run's own, recorded in the checkpoint,
    with ``key=value`` overrides on top (e.g. ``eval.k=16``); None for a checkpoint that records none
    (then the overrides are fit's, composed from the presets)."""
    try:
        text = recorded_config(ckpt_path)
    except ValueError as e:
        raise ConfigError(str(e)) from None
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
            validate({k: v for k, v in loaded.items() if k in ("model", "data", "trainer")}, subcommand)
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
            validate(tree, subcommand)
            if not from_checkpoint:
                check_resume_args(flags, tree, error=ConfigError)
            if scheduler is not None:
                if subcommand != "fit":
                    raise ConfigError(f"scheduler={schedulers.scheduler_name(scheduler)} submits fit only: "
                                      f"run {subcommand} here (scheduler=local)")
                if not any(flag.split("=", 1)[0] == "--print_config" for flag in flags):
                    return schedulers.submit(scheduler, overrides, flags, tree)
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
                raise
        finally:
            sys.argv = saved_argv
    except ConfigError as e:
        _print_error(str(e))
        return 2
    except RunStopped as e:
        log = _keep_traceback(e)
        _print_error(f"{e}" + (f" (traceback in {log})" if log else ""))
        return 1
    except Exception as e:  # jsonargparse parse errors arrive as ArgumentError / ValueError
        if type(e).__name__ in ("ArgumentError", "NSKeyError") or isinstance(e, SystemExit):
            _print_error(explain_parser_error(e))
            return 2
        raise
    signum = received_signal()
    return 0 if signum is None else 128 + signum
