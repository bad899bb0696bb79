"""The checks of a LightningCLI config that run before anything is instantiated (no model loads), each
mistake one line naming the key the user typed and what is allowed, in two stages. ``check_values`` needs
no Lightning, transformers or model, so that a wrong value is refused within a second or two: the config
sections, the data section's keys and types, its task built as the run builds it (its data and reward
functions, a judge's endpoint probed), the rollout problem, the logger, its run name, the launch
environment, the trainer's argument names and the values lit_ppo's loop cannot honour, and a teacher's
vocabulary (its tokenizer's files); then what loads torch (the names the actor refers to) or reads a model
directory's config (``model.source``, the teacher). ``check_config`` adds every prompt with its completion
budget within the model's context (its config and tokenizer read, no weights) from the task built once, and
last what only Lightning can judge (the accelerator / devices / strategy / precision combination on this
machine, the callbacks). Lightning and the models are imported by the checks that need them. Every front
door's ``fit``, ``validate`` and ``test`` (whatever their input), and each combination of a ``sweep``, come
here through ``lit_ppo.launch.run.check``; ``sft`` through ``check_sft_config``, ``rm`` through
``check_rm_config``.
"""
from __future__ import annotations

import inspect
import logging
import os
import warnings
from collections.abc import Callable
from typing import Any, NamedTuple

from lit_ppo.config import ModelConfig, PPOActorConfig, RolloutConfig, check_value, typed_key
from lit_ppo.config.keys import foreign_key_hint
from lit_ppo.config.model import NAMED_SOURCES
from lit_ppo.config.rm import RMConfig
from lit_ppo.config.rollout import DATA_KEYS, DATA_SECTIONS, DATA_TYPES
from lit_ppo.config.sections import Sections, actor_rollout_problem, check_sections, construct
from lit_ppo.config.sft import SFTActorConfig, SFTConfig
from lit_ppo.config.trainer import TRAINER_KEYS
from lit_ppo.errors import ConfigError
from lit_ppo.launch.presets import EVALUATING
from lit_ppo.rollout.context import check_context, test_problem_count
from lit_ppo.run.processes import RANK_ENV
from lit_ppo.run.run_dir import run_name
from lit_ppo.tasks import DEFAULT_TASK, build_task
from lit_ppo.tasks.base import Task, task_name
from lit_ppo.utils.imports import import_function, import_object
from lit_ppo.utils.text import did_you_mean

NAME_MAX = 255
"""Bytes in one file name: the run directory's, ``<run name>-YYYYmmdd-HHMMSS`` (``-N`` on a collision)."""


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


class CheckedValues(NamedTuple):
    """What ``check_values`` built of a tree: its dataclass sections, its rollout settings and its task."""

    sections: Sections
    rollout: RolloutConfig
    task: Task


def check_config(tree: dict, subcommand: str = "fit") -> None:
    """Check a LightningCLI tree for ``subcommand`` before anything is instantiated (no model is loaded):
    ``check_values``, then the prompts within the model's context, then what only Lightning can judge."""
    checked = check_values(tree, subcommand)
    _check_context(checked, subcommand)
    check_lightning_args(tree.get("trainer") or {})


def check_values(tree: dict, subcommand: str = "fit") -> CheckedValues:
    """Every check of a LightningCLI tree for ``subcommand`` that Lightning has no part in, the task built
    once; first those that load neither torch nor a model's files, so that a mistake among them is refused
    before either loads."""
    sections = check_sections(tree)
    actor, model_cfg, gconfig = sections.actor, sections.model, sections.gconfig
    if model_cfg.teacher is not None and not (actor.kl_ctl > 0 or actor.kl_loss_coef > 0):
        raise ConfigError(f"model.teacher={model_cfg.teacher} needs actor.kl_ctl > 0 or actor.kl_loss_coef > 0: "
                          f"the teacher's log-probs enter through the KL reward or the KL loss (algo=opd sets "
                          f"the first, algo=kdrl the second)")
    rollout, task = _check_data(dict(tree.get("data") or {}))
    if subcommand in EVALUATING and test_problem_count(task, sections.eval) == 0:
        raise ConfigError(f"{subcommand}: task {task_name(task)!r} has no test problems to score "
                          f"(eval.max_problems={sections.eval.max_problems}; a dataset task takes "
                          f"data.task_kwargs.test_path or test_fraction)")
    problem = actor_rollout_problem(actor, gconfig.temperature, rollout.max_head_offpolicyness)
    if problem:
        raise ConfigError(problem)
    if actor.reward_norm is not None and actor.reward_norm.mean_level == "group" and gconfig.n_samples == 1:
        warnings.warn("actor.reward_norm.mean_level=group with gconfig.n_samples=1: singleton group centering "
                      "erases the task reward", UserWarning, stacklevel=2)
    trainer = tree.get("trainer") or {}
    _check_logger(trainer)
    _check_launch_environment(trainer)
    _check_cpu_kernels()
    if subcommand == "fit":
        _check_run_names(trainer)
    check_trainer_values(trainer)
    _check_teacher(model_cfg, files_only=True)
    from lit_ppo.algos.checks import check_names  # torch: the registries hold the losses themselves

    construct(PPOActorConfig, actor, "actor", check_names)
    _check_model_source(model_cfg)
    _check_teacher(model_cfg)
    return CheckedValues(sections, rollout, task)


def _check_data(data: dict) -> tuple[RolloutConfig, Task]:
    """The data section's keys and value types, then its rollout settings, its task (its data and reward
    functions) and its dynamic filter, each built as RolloutDataModule builds them."""
    for name in data:
        if name not in DATA_KEYS:
            hint = foreign_key_hint(f"data.{name}") or did_you_mean(name, DATA_KEYS, prefix="data.")
            raise ConfigError(f"data.{name} is not a key{hint}; allowed: {', '.join(DATA_KEYS)}")
    for name, value in data.items():
        if name not in DATA_SECTIONS:  # configs of their own, checked as their sections
            try:
                check_value(typed_key(f"data.{name}"), value, DATA_TYPES[name])
            except ValueError as e:
                raise ConfigError(str(e)) from None
    try:
        rollout = RolloutConfig(**{k: v for k, v in data.items() if k not in ("task", "task_kwargs", *DATA_SECTIONS)})
        task = build_task(data.get("task", DEFAULT_TASK), **(data.get("task_kwargs") or {}))
        if rollout.dynamic_filter_fn:
            import_function(rollout.dynamic_filter_fn, "data.dynamic_filter_fn")
    except (ValueError, TypeError) as e:
        raise ConfigError(str(e).splitlines()[0]) from None
    return rollout, task


def _check_context(checked: CheckedValues, subcommand: str) -> None:
    """The prompts of the splits ``subcommand`` reads, each with ``gconfig.max_new_tokens``, within the model's
    context (``lit_ppo.rollout.context``), from its config and tokenizer alone (``policy_context``): last, as
    the tokenizer is the first thing loaded."""
    from lit_ppo.models.policy import policy_context

    sections = checked.sections
    found = policy_context(sections.model)
    if found is not None:
        check_context(checked.task, sections.gconfig, checked.rollout, sections.eval, *found, stage=subcommand)


def check_sft_config(tree: dict) -> None:
    """Check the sft job's LightningCLI tree (``lit_ppo.launch.sft.sft_tree``) before anything is instantiated
    (``_check_example_job``, its examples read as ``SFTDataModule`` reads them, without Lightning)."""
    from lit_ppo.training.sft_examples import SFTExamples

    _check_example_job(tree, "sft", lambda data: SFTExamples(
        data.get("task", DEFAULT_TASK), data.get("task_kwargs"), construct(SFTConfig, data.get("sft") or {}, "sft"),
        data.get("system_prompt")))


def check_rm_config(tree: dict) -> None:
    """Check the rm job's LightningCLI tree (``lit_ppo.launch.rm.rm_tree``) before anything is instantiated
    (``_check_example_job``, its preference pairs read as ``RMDataModule`` reads them, without Lightning)."""
    from lit_ppo.training.rm_examples import RMPairs

    _check_example_job(tree, "rm", lambda data: RMPairs(
        data.get("task", DEFAULT_TASK), data.get("task_kwargs"), construct(RMConfig, data.get("rm") or {}, "rm")))


def _check_example_job(tree: dict, job: str, datamodule: Callable[[dict], Any]) -> None:
    """Check the LightningCLI tree of a job that trains on examples of its own (sft, rm): the model and ``actor``
    sections, the strategy, the logger, run names, launch environment and trainer argument names as a fit's, the
    model directory, then the examples (``datamodule`` of the data section reads them), each example tokenised
    by the model's tokenizer (no weights load), and last what only Lightning can judge of the trainer."""
    model = tree.get("model") or {}
    model_cfg = construct(ModelConfig, model.get("model") or {}, "model")
    if model_cfg.teacher is not None:
        raise ConfigError(f"model.teacher={model_cfg.teacher} is fit's (algo=opd, algo=kdrl): {job} trains on its "
                          f"examples")
    construct(SFTActorConfig, model.get("actor") or {}, "actor")
    trainer = tree.get("trainer") or {}
    strategy = trainer.get("strategy")
    if strategy not in (None, "auto") and not str(strategy).startswith("ddp"):
        raise ConfigError(f"trainer.strategy={strategy!r}: {job} runs in one process or under trainer=ddp")
    _check_logger(trainer)
    _check_launch_environment(trainer)
    _check_cpu_kernels()
    _check_run_names(trainer)
    check_trainer_values(trainer, manual_optimization=False)
    _check_model_source(model_cfg)
    try:  # reads the examples (no model): bad data is one line
        examples = datamodule(dict(tree.get("data") or {}))
    except (ValueError, TypeError) as e:
        raise ConfigError(str(e).splitlines()[0]) from None
    from lit_ppo.models import load_policy_tokenizer

    try:  # every example: the tokenizer is the first thing loaded
        examples.tokenize(load_policy_tokenizer(model_cfg))
    except ValueError as e:
        raise ConfigError(str(e)) from None
    check_lightning_args(trainer)


def _check_model_source(model_cfg: ModelConfig) -> None:
    """A ``model.source`` that is a directory Hugging Face cannot load as a causal LM (its config read)."""
    if model_cfg.source not in NAMED_SOURCES:
        from lit_ppo.models import model_dir_problem

        problem = model_dir_problem(model_cfg.source)
        if problem is not None:
            raise ConfigError(f"model.source={model_cfg.source} {problem}")


def _check_teacher(model_cfg: ModelConfig, files_only: bool = False) -> None:
    """A ``model.teacher`` that cannot score the policy's tokens: ``files_only``, what its files and the
    tokenizers' tell without torch (a directory, its vocabulary against the policy's), else that it is a causal
    LM (its config and weights' headers read)."""
    if model_cfg.teacher is not None:
        from lit_ppo.models.local_model import model_dir_problem
        from lit_ppo.models.teacher import teacher_tokenizer_problem

        problem = (teacher_tokenizer_problem(model_cfg.teacher, model_cfg.source, model_cfg.cache_dir) if files_only
                   else model_dir_problem(model_cfg.teacher))
        if problem is not None:
            raise ConfigError(f"model.teacher={model_cfg.teacher} {problem}")


def _check_cpu_kernels() -> None:
    """The float32 CPU kernels the environment chooses (``lit_ppo.models.cpu_matmul.ENV``), before the run."""
    from lit_ppo.models.cpu_matmul import onednn_chosen

    onednn_chosen()


def _check_launch_environment(trainer: dict) -> None:
    """A process rank other than 0 (or a world of several processes) left in the environment by another
    launch, for a config that runs one process: Lightning would take this process for that rank, keep it
    from logging, and lit_ppo would write no run for it."""
    devices, nodes = trainer.get("devices", "auto"), trainer.get("num_nodes", 1)
    one = nodes == 1 and (len(devices) == 1 if isinstance(devices, list) else devices in (1, "1") or (
        devices == "auto" and trainer.get("accelerator") == "cpu"))
    if not one:
        return
    ranks = [f"{name}={os.environ[name]}" for name in RANK_ENV if os.environ.get(name, "0") not in ("", "0")]
    world = [f"WORLD_SIZE={os.environ['WORLD_SIZE']}"] if os.environ.get("WORLD_SIZE", "1") not in ("", "1") else []
    if ranks or world:
        what = ("a rank other than 0, which Lightning keeps from logging and lit_ppo from writing its run" if ranks
                else "one process of several (the vLLM engine would wait for an external launcher)")
        raise ConfigError(f"{', '.join(ranks + world)} in the environment, left by another launch, would make this "
                          f"one-process run (trainer.devices={devices}, trainer.num_nodes={nodes}) {what}: unset "
                          f"{' '.join(v.split('=')[0] for v in ranks + world)}")


_DEVICE_KEYS = ("accelerator", "devices", "strategy", "precision", "num_nodes")
"""Trainer arguments whose combination only Lightning's accelerator connector can judge, in the order
they are added to a probe Trainer (the first whose addition fails is the key to blame)."""


MANUAL_OPTIMIZATION_SETTINGS = {
    "gradient_clip_val": ((None, 0, 0.0), "so it clips with actor.optimizer.gradient_clipping (and "
                                          "critic.optimizer.gradient_clipping): set those"),
    "gradient_clip_algorithm": ((None,), "so it clips the global norm to actor.optimizer.gradient_clipping (and "
                                         "critic.optimizer.gradient_clipping): set those"),
    "accumulate_grad_batches": ((1,), "so it splits each iteration's batch into actor.ppo_n_minibatches optimizer "
                                      "steps, each accumulated over micro-batches of at most actor.mb_max_tokens "
                                      "tokens: set those"),
}
"""Trainer arguments that Lightning's automatic optimization applies, which lit_ppo's manual steps cannot honour:
argument -> (the values that ask nothing of it, lit_ppo's own setting)."""


def check_trainer_values(trainer: dict, manual_optimization: bool = True) -> None:
    """Check Lightning's own arguments as far as their values tell, without Lightning: names, what a module that
    steps its optimizers itself cannot honour (``manual_optimization``: LitPPO's) and ``max_steps``."""
    for name in trainer:
        if name not in TRAINER_KEYS:
            raise ConfigError(f"trainer.{name} is not a key"
                              f"{foreign_key_hint(name) or did_you_mean(name, TRAINER_KEYS, prefix='trainer.')}")
    for name, value in trainer.items() if manual_optimization else ():
        if name in MANUAL_OPTIMIZATION_SETTINGS and value not in MANUAL_OPTIMIZATION_SETTINGS[name][0]:
            raise ConfigError(f"trainer.{name}={value!r} cannot be honoured: lit_ppo steps its optimizers itself "
                              f"(Lightning's manual optimization), {MANUAL_OPTIMIZATION_SETTINGS[name][1]}")
    max_steps = trainer.get("max_steps", -1)
    if isinstance(max_steps, bool) or not isinstance(max_steps, int) or (max_steps < 1 and max_steps != -1):
        raise ConfigError(f"trainer.max_steps={max_steps!r} is invalid: must be a positive integer (RL iterations) "
                          f"or -1 (no limit)")


def check_lightning_args(trainer: dict) -> None:
    """Check what only Lightning can judge of its arguments, without building a model: the accelerator / devices
    / strategy / precision combination on this machine, and the callbacks."""
    _check_devices(trainer)
    for i, spec in enumerate(trainer.get("callbacks") or []):
        _check_callback(i, spec)


def _check_devices(trainer: dict) -> None:
    """The accelerator by name and availability here, then the device keys as Lightning's Trainer takes them."""
    import lightning as L
    from lightning.pytorch.accelerators import AcceleratorRegistry

    accelerator = trainer.get("accelerator", "auto")
    if isinstance(accelerator, str) and accelerator != "auto":
        known = sorted(AcceleratorRegistry.available_accelerators() | {"gpu"})
        if accelerator not in known:
            raise ConfigError(f"trainer.accelerator={accelerator} is invalid: must be one of auto, {', '.join(known)}")
        if not _available(AcceleratorRegistry, "cuda" if accelerator == "gpu" else accelerator):
            here = sorted(a for a in AcceleratorRegistry.available_accelerators() if _available(AcceleratorRegistry, a))
            raise ConfigError(f"trainer.accelerator={accelerator} is not available on this machine: available: "
                              f"auto, {', '.join(here)}")
    probe: dict[str, Any] = {}
    quiet = logging.getLogger("lightning.pytorch")
    level = quiet.level
    quiet.setLevel(logging.ERROR)  # the probe's "GPU available: ..." lines are printed by the real run
    try:
        for key in _DEVICE_KEYS:
            if key not in trainer or (key == "strategy" and not isinstance(trainer[key], str)):
                continue
            probe[key] = trainer[key]
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    L.Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False,
                              enable_model_summary=False, **probe)
            except Exception as e:  # MisconfigurationException, ValueError, TypeError, ModuleNotFoundError
                reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
                raise ConfigError(f"trainer.{key}={trainer[key]!r} is invalid here: {reason}") from None
    finally:
        quiet.setLevel(level)


def _available(registry, name: str) -> bool:
    try:
        return bool(registry.get(name).is_available())
    except Exception:  # e.g. the TPU accelerator raises when torch_xla is not installed
        return False


def _check_callback(index: int, spec: Any) -> None:
    """The ``class_path`` / ``init_args`` callback ``spec`` of ``trainer.callbacks``: its class imports, takes
    those arguments and accepts their values."""
    key = f"trainer.callbacks.{index}"
    if not isinstance(spec, dict) or "class_path" not in spec:
        return  # jsonargparse reports other forms with their types
    try:
        cls = import_object(str(spec["class_path"]), f"{key}.class_path", "Class")
    except ValueError as e:
        raise ConfigError(str(e)) from None
    init_args = spec.get("init_args") or {}
    parameters = inspect.signature(cls.__init__).parameters
    if not any(p.kind is p.VAR_KEYWORD for p in parameters.values()):
        names = [n for n in parameters if n != "self"]
        for name in init_args:
            if name not in names:
                raise ConfigError(f"{key}.init_args.{name} is not an argument of {cls.__name__}"
                                  f"{did_you_mean(name, names)}; allowed: {', '.join(names)}")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            cls(**init_args)
    except TypeError:
        pass  # a value of the wrong type: the argument parser names the key and the expected type
    except Exception as e:
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ConfigError(f"{key} ({cls.__name__}) is invalid: {reason}") from None
