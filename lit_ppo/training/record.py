"""What a checkpoint was made with: the algorithm, the model source (and LoRA settings) and the task.

LitPPO stores this record under ``lit_ppo`` in every checkpoint, LitSFT its own (``sft_record``); a resume
must match it (``lit_ppo.run.resume.check_resume``). The run layer adds where the run is recorded (its
``run`` entry, written by ``lit_ppo.run.tracked_run.TrackedConfig``), which is not compared.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from lit_ppo.config import DEFAULT_ALGO, ModelConfig
from lit_ppo.config.rm import RM_ALGO
from lit_ppo.tasks import DEFAULT_TASK, build_task
from lit_ppo.tasks.dataset import data_digest
from lit_ppo.training.checkpoint_files import PLAIN_TYPES
from lit_ppo.utils.config_values import is_plain
from lit_ppo.utils.fs import user_path

RECORD_KEY = "lit_ppo"
"""Top-level checkpoint key of what the run was made with (see ``run_record``)."""


RUN_KEY = "run"
"""Entry of the record naming the run directory and MLflow run that a resume continues."""


def model_identity(source: str) -> str:
    """A model source as compared on resume: a local directory by its resolved path."""
    if source not in ("tiny", "smollm2") and os.path.isdir(os.path.expanduser(source)):
        return os.path.realpath(os.path.expanduser(source))
    return source


DATA_PATH_FIELDS = ("train_path", "test_path")
"""Task fields naming data files: the record holds their content's SHA-256 too (``task.<field>.sha256``)."""


DATA_DIGEST_SUFFIX = ".sha256"
SFT_ALGO = "sft"
"""The ``algo`` of the sft job's config and record: what tells its checkpoints from a fit's."""


def task_identity(task: Any) -> dict[str, Any]:
    """``task``'s class and its plain-valued dataclass init fields, as ``task`` / ``task.<field>``, and
    the content digest of the data files of ``DATA_PATH_FIELDS`` (``lit_ppo.tasks.dataset.data_digest``)."""
    cls = type(task)
    out: dict[str, Any] = {"task": f"{cls.__module__}.{cls.__qualname__}"}
    if dataclasses.is_dataclass(task):
        for f in dataclasses.fields(task):
            value = getattr(task, f.name, None)
            value = os.fspath(value) if isinstance(value, os.PathLike) else value
            if f.init and not f.name.startswith("_") and is_plain(value, PLAIN_TYPES):
                out[f"task.{f.name}"] = value
    return {**out, **_data_digests(out)}


def _data_digests(identity: dict[str, Any]) -> dict[str, str]:
    """``task.<field>.sha256``: the content digest of each data file of ``DATA_PATH_FIELDS`` that the task
    ``identity`` names and that exists (``lit_ppo.tasks.dataset.data_digest``)."""
    out = {}
    for name in DATA_PATH_FIELDS:
        path = identity.get(f"task.{name}")
        if isinstance(path, str) and user_path(path).exists():
            out[f"task.{name}{DATA_DIGEST_SUFFIX}"] = data_digest(path)
    return out


def run_record(algo: str, model_cfg: ModelConfig, task: Any | None) -> dict[str, Any]:
    """What a LitPPO checkpoint is made with: algorithm, model source (and LoRA settings) and task."""
    record = {"algo": algo, "model": model_identity(model_cfg.source), **lora_identity(model_cfg)}
    if task is not None:
        record.update(task_identity(task))
    return record


def sft_record(model_cfg, task: str, task_kwargs: dict[str, Any] | None, algo: str = SFT_ALGO) -> dict[str, Any]:
    """What an sft checkpoint (or, with ``algo`` ``rm``, an rm checkpoint) is made with: the ``algo``, the model
    source (and LoRA settings) of ``model_cfg`` (a ModelConfig or a mapping of its fields), the data section's
    ``task`` and its plain-valued ``task_kwargs`` as given, and the content digests of its data files: sft and rm
    read a dataset's rows without building its task."""
    source = model_cfg.source if isinstance(model_cfg, ModelConfig) else model_cfg.get("source", ModelConfig.source)
    identity = {"task": task, **{f"task.{name}": value for name, value in (task_kwargs or {}).items()
                                 if is_plain(value, PLAIN_TYPES)}}
    return {"algo": algo, "model": model_identity(source), **lora_identity(model_cfg), **identity,
            **_data_digests(identity)}


def expected_record(tree: dict) -> dict[str, Any]:
    """``run_record`` (``sft_record`` for the sft and rm jobs) of the run that LightningCLI's config ``tree`` describes
    (builds the task, no model)."""
    model = tree.get("model") or {}
    algo = model.get("algo", DEFAULT_ALGO)
    model_cfg = model.get("model") or {}
    source = model_cfg.source if isinstance(model_cfg, ModelConfig) else model_cfg.get("source", ModelConfig.source)
    data = tree.get("data") or {}
    if algo in (SFT_ALGO, RM_ALGO):
        return sft_record(model_cfg, data.get("task", DEFAULT_TASK), data.get("task_kwargs"), algo)
    task = build_task(data.get("task", DEFAULT_TASK), **(data.get("task_kwargs") or {}))
    return {"algo": algo, "model": model_identity(source), **lora_identity(model_cfg), **task_identity(task)}


LORA_FIELDS = ("lora_rank", "lora_alpha", "lora_target_modules")
"""Model settings a LoRA checkpoint is recorded with: its adapters' shapes, places and scaling."""


def lora_identity(model_cfg) -> dict[str, Any]:
    """``model.<field>`` of ``LORA_FIELDS`` of a LoRA model config (a ModelConfig or a mapping of
    its fields); {} without LoRA, so the records of other checkpoints are unchanged."""
    def get(name: str):
        value = getattr(model_cfg, name) if isinstance(model_cfg, ModelConfig) else model_cfg.get(
            name, getattr(ModelConfig, name))
        return list(value) if isinstance(value, tuple) else value

    return {f"model.{name}": get(name) for name in LORA_FIELDS} if get("lora_rank") else {}
