"""Both front ends of ``python -m lit_ppo fit``: Hydra-style overrides and LightningCLI YAML.

Hydra composes ``conf/`` with the user's ``group=option`` / ``key=value`` overrides; the result is
mapped onto LightningCLI's argument tree, validated, written to a YAML file and handed to the same
LitPPOCLI that ``--config run.yaml`` uses, so both paths validate, instantiate and save the config
identically and ``--print_config`` output replays exactly.
"""

from __future__ import annotations

import difflib
import inspect
import subprocess
import sys
import tempfile
from dataclasses import fields, is_dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from lightning.pytorch.cli import LightningCLI, SaveConfigCallback

from lit_ppo.config import GenerationConfig, PPOActorConfig, PPOCriticConfig
from lit_ppo.data import RolloutDataModule
from lit_ppo.module import LitPPO, ModelConfig


class ConfigError(ValueError):
    """A configuration mistake, reported as one line (exit code 2)."""


# Hydra root key -> path in LightningCLI's tree.
HYDRA_TO_LIGHTNING = {
    "algo": ("model", "algo"),
    "model": ("model", "model"),
    "actor": ("model", "actor"),
    "critic": ("model", "critic"),
    "data": ("data",),
    "gconfig": ("data", "gconfig"),
    "trainer": ("trainer",),
    "logger": ("trainer", "logger"),
    "seed": ("seed_everything",),
}
SCHEDULERS = ("local",)


def conf_dir() -> Path:
    return Path(str(resources.files("lit_ppo.conf")))


def group_options(group: str) -> list[str]:
    return sorted(p.stem for p in (conf_dir() / group).glob("*.yaml"))


def git_sha() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=5,
                              cwd=Path(__file__).parent, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"


# ---------------------------------------------------------------------------------------------
# Hydra front end
# ---------------------------------------------------------------------------------------------

def _register_resolvers() -> None:
    from omegaconf import OmegaConf

    if not OmegaConf.has_resolver("int_mul"):
        # ${int_mul:a,f}: max(1, int(a * f)), e.g. a buffer that is a fraction of a token budget.
        OmegaConf.register_new_resolver("int_mul", lambda a, f: max(1, int(int(a) * float(f))))


def _explain_hydra_error(error: Exception, overrides: list[str]) -> str:
    text = str(error).splitlines()[0] if str(error) else type(error).__name__
    for override in overrides:
        key = override.lstrip("+~").split("=", 1)[0]
        if "." not in key and (conf_dir() / key).is_dir() and ("Could not find" in text or "not found" in text.lower()):
            value = override.split("=", 1)[1] if "=" in override else ""
            return f"{key}={value} is invalid: must be one of {', '.join(group_options(key))}"
        if f"'{key}'" in text or f"Key '{key.rsplit('.', 1)[-1]}'" in text:
            return f"{key} is not a key{_suggest(key)}"
    return text


def _known_keys() -> dict[str, list[str]]:
    """Hydra-side section -> field names, for 'did you mean' suggestions."""
    return {"actor": [f.name for f in fields(PPOActorConfig)], "critic": [f.name for f in fields(PPOCriticConfig)],
            "gconfig": [f.name for f in fields(GenerationConfig)], "model": [f.name for f in fields(ModelConfig)],
            "data": list(inspect.signature(RolloutDataModule.__init__).parameters)[1:],
            "rollout": ["engine", "engine_kwargs"],
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


def compose(overrides: list[str]) -> dict:
    """The Hydra-composed config for ``overrides``, resolved, as LightningCLI's tree."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    _register_resolvers()
    try:
        with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
            presets = hydra_compose(config_name="config", overrides=[o for o in overrides if _is_group(o)])
            overrides = _add_known_keys(overrides, presets)
            cfg = hydra_compose(config_name="config", overrides=overrides)
        tree = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
    except (HydraException, OmegaConfBaseException) as e:
        raise ConfigError(_explain_hydra_error(e, overrides)) from None
    return to_lightning_tree(tree)


def to_lightning_tree(hydra_tree: dict) -> dict:
    scheduler = hydra_tree.pop("scheduler", "local")
    if scheduler not in SCHEDULERS:
        raise ConfigError(f"scheduler={scheduler} is invalid: must be one of {', '.join(SCHEDULERS)}")
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
        if key not in ("engine", "engine_kwargs"):
            raise ConfigError(f"rollout.{key} is not a key: must be one of engine, engine_kwargs")
        out["data"][key] = value
    logger = out["trainer"].get("logger")
    if isinstance(logger, dict) and "MLFlowLogger" in logger.get("class_path", ""):
        logger.setdefault("init_args", {}).setdefault("tags", {})["git_sha"] = git_sha()
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


def validate(tree: dict) -> None:
    """Check a LightningCLI tree before anything is instantiated (no model is loaded)."""
    model = tree.get("model") or {}
    for name in model:
        if name not in ("model", "actor", "critic", "algo"):
            raise ConfigError(f"model.{name} is not a key; allowed: algo, actor, critic, model")
    actor = _construct(PPOActorConfig, model.get("actor") or {}, "actor")
    _construct(PPOCriticConfig, model.get("critic"), "critic")
    _construct(ModelConfig, model.get("model") or {}, "model")
    data = dict(tree.get("data") or {})
    allowed = list(inspect.signature(RolloutDataModule.__init__).parameters)[1:]
    for name in data:
        if name not in allowed:
            close = difflib.get_close_matches(name, allowed, n=1)
            hint = f" (did you mean data.{close[0]}?)" if close else ""
            raise ConfigError(f"data.{name} is not a key{hint}; allowed: {', '.join(allowed)}")
    gconfig = _construct(GenerationConfig, data.get("gconfig") or {}, "gconfig")
    try:  # builds the task (its data, not a model): bad task settings fail here
        RolloutDataModule(**{**data, "gconfig": gconfig})
    except (ValueError, TypeError) as e:
        raise ConfigError(str(e).splitlines()[0]) from None
    if actor.temperature != gconfig.temperature:
        raise ConfigError(f"actor.temperature={actor.temperature} must equal gconfig.temperature="
                          f"{gconfig.temperature}: the trainer recomputes log-probs under the sampling distribution")
    if actor.reward_norm is not None and actor.reward_norm.mean_level == "group" and gconfig.n_samples == 1:
        import warnings

        warnings.warn("actor.reward_norm.mean_level=group with gconfig.n_samples=1: singleton group centering "
                      "erases the task reward", UserWarning, stacklevel=2)
    trainer = tree.get("trainer") or {}
    allowed = list(inspect.signature(__import__("lightning").Trainer.__init__).parameters)[1:]
    for name in trainer:
        if name not in allowed:
            close = difflib.get_close_matches(name, allowed, n=1)
            hint = f" (did you mean trainer.{close[0]}?)" if close else ""
            raise ConfigError(f"trainer.{name} is not a key{hint}")


# ---------------------------------------------------------------------------------------------
# LightningCLI
# ---------------------------------------------------------------------------------------------

class TrackedConfig(SaveConfigCallback):
    """Saves the resolved config as ``config.yaml`` in the run directory and as an artifact of every
    MLflow run (an MLflow logger with a database store has no log directory of its own)."""

    def setup(self, trainer, pl_module, stage: str) -> None:
        # trainer.log_dir is a broadcast: read it on every rank, not only in rank 0's save_config.
        self.run_dir = Path(trainer.log_dir or trainer.default_root_dir)
        super().setup(trainer, pl_module, stage)

    def save_config(self, trainer, pl_module, stage: str) -> None:
        text = self.parser.dump(self.config, skip_none=False)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / "config.yaml").write_text(text)
        for logger in trainer.loggers:
            run_id = getattr(logger, "run_id", None)
            if run_id and hasattr(logger.experiment, "log_text"):
                logger.experiment.log_text(run_id, text, "config.yaml")


class LitPPOCLI(LightningCLI):
    def __init__(self, args: list[str]):
        super().__init__(LitPPO, RolloutDataModule, args=args, save_config_callback=TrackedConfig,
                         save_config_kwargs={"overwrite": True, "save_to_log_dir": False}, parser_kwargs={"exit_on_error": False},
                         seed_everything_default=0, auto_configure_optimizers=False)


def _one_line(error: BaseException) -> str:
    """The most specific line of a (possibly multi-line) parser error."""
    lines = [line.strip(" -") for line in str(error).splitlines() if line.strip(" -")]
    for marker in ("is invalid", "is not a key", "must", "unrecognized arguments", "not a valid", "does not"):
        for line in lines:
            if marker in line:
                return line
    return lines[0] if lines else type(error).__name__


# Lightning notes about choices LitPPO makes on purpose: checkpoints hold the weights after the
# iteration's update (what resuming needs), and the step pulls its own batch (dataloader_iter) so
# that nothing is generated ahead of the weight push; sys.argv holds the command beside LightningCLI's
# args on purpose (a DDP launcher re-runs it).
EXPECTED_WARNINGS = ("Using ModelCheckpoint with manual optimization", "You are using the `dataloader_iter` step",
                     "Found `dataloader_iter` argument", "Found .* module\\(s\\) in eval mode",
                     "LightningCLI's args parameter is intended")


def run(argv: list[str]) -> int:
    """``fit`` with Hydra overrides and/or LightningCLI flags; returns the exit code."""
    import warnings

    for message in EXPECTED_WARNINGS:
        warnings.filterwarnings("ignore", message=message)
    subcommand, rest = argv[0], argv[1:]
    overrides = [a for a in rest if "=" in a and not a.startswith("-")]
    flags = [a for a in rest if a not in overrides]
    try:
        if "--config" in flags:
            if overrides:
                raise ConfigError("give either Hydra overrides (key=value) or --config run.yaml, not both")
            i = flags.index("--config")
            if i + 1 >= len(flags):
                raise ConfigError("--config needs a YAML file")
            path = Path(flags[i + 1])
            if not path.is_file():
                raise ConfigError(f"--config {path}: no such file")
            loaded = yaml.safe_load(path.read_text()) or {}
            validate({k: v for k, v in loaded.items() if k in ("model", "data", "trainer")})
            args = [subcommand] + flags
        else:
            tree = compose(overrides)
            validate(tree)
            handle = tempfile.NamedTemporaryFile("w", suffix=".yaml", prefix="lit_ppo_", delete=False)
            with handle:
                yaml.safe_dump(tree, handle, sort_keys=False)
            args = [subcommand, "--config", handle.name] + flags
        # A DDP launcher starts the other ranks by re-running sys.argv: make it this very command.
        saved_argv, sys.argv = sys.argv, [sys.argv[0], *argv]
        try:
            LitPPOCLI(args)
        finally:
            sys.argv = saved_argv
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except Exception as e:  # jsonargparse parse errors arrive as ArgumentError / ValueError
        if type(e).__name__ in ("ArgumentError", "NSKeyError") or isinstance(e, SystemExit):
            print(f"error: {_one_line(e)}", file=sys.stderr)
            return 2
        raise
    return 0
