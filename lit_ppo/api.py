"""The Python API: ``compose`` a run's config from the presets as the command line does, with Python objects
(reward functions, Task classes and instances) among its values, then ``fit`` it (or, composed for the job,
``sft`` / ``rm``), ``validate`` / ``test`` a checkpoint and ``export`` its policy or reward model, in this process
(docs/python-api.md). Every function checks its input as the command line does and raises the same one-line
ConfigError for a mistake.

A config holds a Python object as a reference (``python:<module>.<name>``, ``lit_ppo.utils.imports``), which
only this process resolves: such a run trains in one process (no DDP launcher, no scheduler), and its
recorded ``config.yaml`` replays with the object given again."""

from __future__ import annotations

import copy
import hashlib
import os
import shutil
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml

from lit_ppo.config.keys import key_path, set_key, typed_key
from lit_ppo.config.sections import Sections, check_sections, construct
from lit_ppo.errors import ConfigError
from lit_ppo.launch import run as launch
from lit_ppo.launch.compose import compose_run
from lit_ppo.launch.jobs import JOBS, given_max_steps, section_overrides
from lit_ppo.launch.lightning_cli import LitPPOCLI
from lit_ppo.launch.presets import given_task_kwargs, group_options, is_group, keep_taken_task_kwargs
from lit_ppo.models import default_cache_dir
from lit_ppo.run import export as run_export
from lit_ppo.run.lock import release_run_locks
from lit_ppo.run.resume import job_of
from lit_ppo.utils.config_values import PLAIN_SCALARS, is_plain
from lit_ppo.utils.fs import file_sha256, temporary_directory
from lit_ppo.utils.imports import object_reference, object_references
from lit_ppo.utils.quiet import quiet_expected_output
from lit_ppo.utils.stop_requests import exit_on_signals, forget_stop_requests, received_signal, signal_name


class RunConfig:
    """A composed config: LightningCLI's tree (``tree``, what ``--print_config`` prints), read and set by
    the keys the command line types (``config["actor.eps_clip"]``, ``config["data.task_kwargs.reward_fns"]``).
    A value may be a Python object: it is held by reference (``python:<module>.<name>``)."""

    def __init__(self, tree: dict):
        self.tree = tree
        """LightningCLI's config tree: model, data, trainer, seed_everything."""

    def __getitem__(self, key: str) -> Any:
        """The value of ``key``: as the config sets it, else its section's default (``actor.eps_clip``)."""
        node = self.tree
        for part in key_path(key):
            if not isinstance(node, dict) or part not in node:
                return _section_default(self.tree, key)
            node = node[part]
        return node

    def __setitem__(self, key: str, value: Any) -> None:
        set_key(self.tree, key, _held(value))

    def to_yaml(self) -> str:
        """The config as ``--print_config`` prints it: ``python -m lit_ppo fit --config FILE`` replays it
        (a config that holds Python objects replays only through this API, the objects given again)."""
        return yaml.safe_dump(self.tree, sort_keys=False)

    def __repr__(self) -> str:
        return (f"RunConfig(algo={self.tree.get('model', {}).get('algo')!r}, "
                f"task={self.tree.get('data', {}).get('task')!r})")


@dataclass
class FitResult:
    """What ``fit``, ``sft`` or ``rm`` made."""

    run_dir: Path
    """The run's directory: config.yaml, checkpoints/, model/, samples.jsonl, summary.txt."""
    checkpoint: Path
    """Its ``last.ckpt``: resume, validate or export from it."""
    model_dir: Path | None
    """The final policy (of ``rm``, the reward model) as a Hugging Face model directory (transformers and vLLM
    load it; ``reward_fns`` takes a reward model's); None when the run stopped early."""
    metrics: dict[str, float]
    """The last value of every metric (``rollout/reward_mean``, ``eval/accuracy``; ``rm/val_accuracy``, ...)."""
    stopped_by: str | None
    """The signal that stopped the run after a completed iteration (``SIGINT``, ``SIGTERM``), else None."""


def compose(*overrides: str, values: dict[str, Any] | None = None, job: str = "fit") -> RunConfig:
    """The config of ``python -m lit_ppo fit <overrides>``: the presets (``algo=grpo``, ``data=dataset``)
    and ``key=value`` overrides composed and checked; then ``values``, ``{key: value}`` under the command
    line's keys, set on top, where a value may be any Python object: a reward function or a lambda in
    ``data.task_kwargs.reward_fns``, a Task class or instance as ``data.task`` (an instance takes no
    ``data.task_kwargs``: the preset's are dropped unless ``values`` gives some). ``job`` ``sft`` or ``rm``:
    the config of ``python -m lit_ppo <job> <overrides>`` instead, its ``<job>.*`` keys among the overrides
    and ``values``, for ``lit_ppo.sft`` / ``lit_ppo.rm``. ConfigError of one line for a mistake."""
    if job == "fit":
        return _compose_fit(list(overrides), dict(values or {}))
    if job not in JOBS:
        raise ConfigError(f"job={job!r} is not a job: one of fit, {', '.join(JOBS)}")
    section_class, job_tree = JOBS[job]
    section, others = section_overrides(list(overrides), job, section_class)
    values = dict(values or {})
    own = {key.split(".", 1)[1]: values.pop(key) for key in list(values) if key.startswith(f"{job}.")}
    if own:
        section = construct(section_class, {**asdict(section), **own}, job)
    max_steps = values["trainer.max_steps"] if "trainer.max_steps" in values else given_max_steps(others)
    return RunConfig(job_tree(_compose_fit(others, values).tree, section, max_steps))


def _compose_fit(overrides: list[str], values: dict[str, Any]) -> RunConfig:
    """``compose``'s config of fit."""
    values = _with_saved_datasets(values)
    for key, value in values.items():
        if is_group(f"{key}="):
            option = value if isinstance(value, str) else "<option>"
            raise ConfigError(f"{key} is a preset group, not a value: give {key}={option} among the overrides "
                              f"(one of {', '.join(group_options(key))})")
    plain = {k: v for k, v in values.items() if is_plain(v)}
    typed = [*overrides, *(f"{key}={_override_value(value)}" for key, value in plain.items())]
    tree, scheduler = compose_run(typed)
    if scheduler is not None:
        raise ConfigError("scheduler=slurm|ray submits a job: run it from the command line (python -m lit_ppo fit "
                          "... scheduler=...); lit_ppo.fit trains in this process")
    config = RunConfig(tree)
    for key, value in values.items():
        if key not in plain:
            config[key] = value
    task = values.get("data.task")
    if task is not None and not is_plain(task) and not isinstance(task, type) and "data.task_kwargs" not in values:
        config["data.task_kwargs"] = {}
    elif isinstance(task, type):  # a class gets the preset's settings it takes, and every one given
        given = given_task_kwargs(typed) | {key.split(".")[2] for key in values if key.startswith("data.task_kwargs.")}
        given |= set(values.get("data.task_kwargs") or ())
        config["data.task_kwargs"] = keep_taken_task_kwargs(
            config["data.task_kwargs"] or {}, config["data.task"], given)
    check_sections(config.tree)
    return config


def fit(config: RunConfig, ckpt_path: str | Path | None = None) -> FitResult:
    """Train the run ``config`` in this process, from scratch or resuming ``ckpt_path`` (a ``last.ckpt``),
    as ``python -m lit_ppo fit`` does: its run directory, checkpoints, tracking, final evaluation and
    exported model. ConfigError for a mistake found before anything loads; RunStopped, of one line, for a
    run that a failure ended (an invalid reward, a stale engine, user code that exited); any other error
    as it was raised."""
    return _train("fit", launch.fit, config, ckpt_path)


def sft(config: RunConfig, ckpt_path: str | Path | None = None) -> FitResult:
    """Fine-tune as ``config`` (``compose(..., job="sft")``) says, in this process, from scratch or resuming
    ``ckpt_path``, as ``python -m lit_ppo sft`` does; its ``model_dir`` is what ``compose("model=<dir>")``
    starts a fit from. Errors as ``fit``'s."""
    return _train("sft", launch.sft, config, ckpt_path)


def rm(config: RunConfig, ckpt_path: str | Path | None = None) -> FitResult:
    """Train a reward model as ``config`` (``compose(..., job="rm")``) says, in this process, from scratch or
    resuming ``ckpt_path``, as ``python -m lit_ppo rm`` does; its ``model_dir`` is what
    ``data.task_kwargs.reward_fns`` takes. Errors as ``fit``'s."""
    return _train("rm", launch.rm, config, ckpt_path)


def _train(job: str, verb: Callable[..., LitPPOCLI], config: RunConfig, ckpt_path: str | Path | None) -> FitResult:
    """Run the job ``job`` of ``config`` through its verb of ``lit_ppo.launch.run``; what it made."""
    if not isinstance(config, RunConfig):
        raise TypeError(f"lit_ppo.{job} takes the RunConfig that lit_ppo.compose(...) returns, not a "
                        f"{type(config).__name__}: lit_ppo.{job}(lit_ppo.compose('key=value', values={{...}}"
                        f"{'' if job == 'fit' else f', job={job!r}'}))")
    composed_for = job_of(config.tree)
    if composed_for != job:
        how = "lit_ppo.compose(...)" if job == "fit" else f"lit_ppo.compose(..., job={job!r})"
        raise ConfigError(f"lit_ppo.{job} was given the config of {composed_for}: compose it with {how}"
                          + (f", or run it with lit_ppo.{composed_for}" if composed_for != "fit" else ""))
    _check_one_process(config.tree)
    try:
        cli = _run(lambda: verb(copy.deepcopy(config.tree), str(ckpt_path) if ckpt_path is not None else None))
    finally:
        release_run_locks()  # the run has ended: a resume from another process may continue it
    checkpoint = cli.run_dir / "checkpoints" / "last.ckpt"
    model_dir = cli.run_dir / "model"
    signum = received_signal()
    return FitResult(run_dir=cli.run_dir, checkpoint=checkpoint, model_dir=model_dir if model_dir.is_dir() else None,
                     metrics=_metrics(cli.trainer), stopped_by=signal_name(signum) if signum is not None else None)


def validate(ckpt_path: str | Path, *overrides: str, values: dict[str, Any] | None = None) -> dict[str, float]:
    """The test-split scores of the checkpoint ``ckpt_path`` (``eval/accuracy``, ``eval/pass_at_4``, ...)
    under its own config with ``key=value`` overrides (``eval.k=8``), as ``python -m lit_ppo validate
    --ckpt_path`` prints them. ``values`` sets keys to Python objects as ``compose`` does: a run trained
    with a reward function or Task of its own process is scored in another by giving them again
    (``values={"data.task_kwargs.reward_fns": [correct]}``)."""
    return _evaluate("validate", ckpt_path, overrides, values)


def test(ckpt_path: str | Path, *overrides: str, values: dict[str, Any] | None = None) -> dict[str, float]:
    """As ``validate``, through Lightning's test loop (``python -m lit_ppo test``)."""
    return _evaluate("test", ckpt_path, overrides, values)


test.__test__ = False  # a function of the API, not one for pytest to collect


def export(ckpt_path: str | Path, output: str | Path | None = None, *, adapter: str | Path | None = None,
           overwrite: bool = False) -> list[Path]:
    """The checkpoint's policy as a Hugging Face model directory ``output`` (LoRA adapters merged) and / or
    its LoRA adapter in peft's format at ``adapter``, as ``python -m lit_ppo export`` writes them (an rm
    checkpoint's reward model as its run's ``model/``, with its reward statistics); the directories written."""
    quiet_expected_output()
    return run_export.export(ckpt_path, output, overwrite, adapter)


def _evaluate(subcommand: str, ckpt_path: str | Path, overrides: tuple[str, ...],
              values: dict[str, Any] | None) -> dict[str, float]:
    # A Python object becomes its reference, which the checkpoint's recorded config names the same way.
    typed = [*overrides, *(f"{key}={_override_value(_held(value))}" for key, value in (values or {}).items())]
    tree = launch.evaluation_tree(subcommand, str(ckpt_path), typed)
    if tree is None:
        raise ConfigError(f"--ckpt_path {ckpt_path} records no config: score it from the command line with the "
                          f"fit overrides it was trained with")
    cli = _run(lambda: launch.evaluate(subcommand, tree, str(ckpt_path), recorded=True))
    return {k: v for k, v in _metrics(cli.trainer).items() if k.startswith("eval/")}


def _run(verb: Callable[[], LitPPOCLI]) -> LitPPOCLI:
    """``verb()``, a job of ``lit_ppo.launch.run``, under the signal handling of the command line."""
    quiet_expected_output()
    forget_stop_requests()
    with exit_on_signals():
        return verb()


def _check_one_process(tree: dict) -> None:
    """ConfigError for a config with Python objects whose trainer would start more processes."""
    references = list(object_references(tree))
    if not references:
        return
    trainer = tree.get("trainer") or {}
    devices, nodes = trainer.get("devices", 1), trainer.get("num_nodes", 1)
    count = len(devices) if isinstance(devices, list) else devices if isinstance(devices, int) else 1
    if count > 1 or nodes != 1 or devices == -1:
        raise ConfigError(f"{typed_key(references[0])} is a Python object of this process: a run on more than one "
                          f"process (trainer.devices={devices}, trainer.num_nodes={nodes}) needs a dotted path "
                          f"module.name that every rank imports")


def _metrics(trainer) -> dict[str, float]:
    return {key: float(value) for key, value in trainer.callback_metrics.items() if key != "step"}


def _section_default(tree: dict, key: str) -> Any:
    """The value of ``key`` in its built section (a dataclass field's default); KeyError if none has it."""
    root, *rest = key.split(".")
    node = getattr(check_sections(tree), root, None) if root in Sections._fields else None
    for part in rest:
        if node is None or not hasattr(node, part):
            raise KeyError(key)
        node = getattr(node, part)
    if node is None and rest:
        raise KeyError(key)
    return node


DATA_PATH_KEYS = ("train_path", "test_path")
"""The dataset task's settings that take data: a path, or from Python a ``datasets.Dataset`` or a list of rows."""


def _with_saved_datasets(values: dict[str, Any]) -> dict[str, Any]:
    """``values`` with each in-memory dataset given as ``data.task_kwargs.train_path`` / ``test_path`` (also
    inside a ``data.task_kwargs`` mapping) replaced by the directory it is saved in (``_saved_dataset``)."""
    kwargs = values.get("data.task_kwargs")
    if isinstance(kwargs, dict):
        values["data.task_kwargs"] = {name: _saved_dataset(f"data.task_kwargs.{name}", value)
                                      if name in DATA_PATH_KEYS else value for name, value in kwargs.items()}
    for name in DATA_PATH_KEYS:
        key = f"data.task_kwargs.{name}"
        if key in values:
            values[key] = _saved_dataset(key, values[key])
    return values


def _saved_dataset(key: str, value: Any) -> Any:
    """A ``datasets.Dataset`` or a list of rows (mappings of column -> value) as the directory
    ``Dataset.save_to_disk`` writes, which ``data=dataset`` reads: ``<lit_ppo cache>/datasets/<digest>``,
    named by its content, so that the config records a path that replays (resuming, ``validate``) and the
    same data composes the same config. Any other value is returned as it is."""
    if value is None or isinstance(value, (str, os.PathLike)):
        return value
    import datasets

    if isinstance(value, datasets.DatasetDict):
        raise ConfigError(f"{key} is a DatasetDict: give one split, e.g. {key}=dataset['train']")
    if isinstance(value, list):
        if not value or not all(isinstance(row, dict) for row in value):
            raise ConfigError(f"{key} is a list: data given as a list must be rows, mappings of column -> value")
        value = datasets.Dataset.from_list(value)
    if not isinstance(value, datasets.Dataset):
        return value
    if len(value) == 0:
        raise ConfigError(f"{key} is a dataset with no rows")
    root = default_cache_dir() / "datasets"
    try:
        temp = temporary_directory(root / "dataset")
    except OSError as e:
        raise ConfigError(f"{key}: the dataset cannot be saved in {root} ({e.strerror or e}): set LIT_PPO_CACHE "
                          f"to a writable directory") from None
    try:
        datasets.disable_progress_bars()
        value.save_to_disk(temp)
        digest = hashlib.sha256()
        for arrow in sorted(Path(temp).glob("*.arrow")):
            digest.update(file_sha256(arrow).encode())
        final = root / digest.hexdigest()[:16]
        try:
            os.rename(temp, final)
        except OSError:
            if not final.is_dir():  # not a copy of the same data saved before
                raise
            shutil.rmtree(temp)
    except BaseException:
        shutil.rmtree(temp, ignore_errors=True)
        raise
    return str(final)


def _held(value: Any) -> Any:
    """``value`` as a config holds it: Python objects as references, lists and mappings item by item."""
    if isinstance(value, PLAIN_SCALARS):
        return value
    if isinstance(value, (list, tuple)):
        return [_held(v) for v in value]
    if isinstance(value, dict):
        return {k: _held(v) for k, v in value.items()}
    return object_reference(value)


def _override_value(value: Any) -> str:
    """``value`` as the value of a Hydra override: strings quoted, so that ``'true'``, ``'1'`` or a path
    with ``=``, ``,`` or spaces stays the string it is."""
    if isinstance(value, str):
        return "'" + value.replace("'", "\\'") + "'"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(map(_override_value, value)) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_override_value(v)}" for k, v in value.items()) + "}"
    return "null" if value is None else str(value).lower() if isinstance(value, bool) else repr(value)


__all__ = ["FitResult", "RunConfig", "compose", "export", "fit", "rm", "sft", "test", "validate"]
