"""``sft``: supervised fine-tuning from the same composed config as ``fit``. The ``model`` section chooses the
model, ``actor.optimizer`` its AdamW, ``data`` the examples (``lit_ppo.training.sft_data``), ``trainer`` the
accelerator, devices, precision and ``default_root_dir``, ``trainer.logger`` the tracking, ``checkpoint`` the
checkpoints; the ``sft`` section the rest. A run directory ``<root>/<experiment>/sft-<task>-<model>-<time>/``
holds ``config.yaml``, ``checkpoints/`` and the final model directory ``model/``, which ``fit model=<dir>``
starts from."""

from __future__ import annotations

import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import yaml

from lit_ppo.config import ModelConfig, OptimizerConfig
from lit_ppo.config.sections import construct
from lit_ppo.config.sft import SFTConfig
from lit_ppo.errors import ConfigError
from lit_ppo.utils.fs import shown_path, write_file_atomically
from lit_ppo.utils.stop_requests import received_signal

TRAINER_KEYS = ("accelerator", "devices", "num_nodes", "strategy", "precision", "accumulate_grad_batches",
                "log_every_n_steps")
"""The trainer section's keys that sft takes from fit's config; its iteration-based keys (``max_steps``,
``val_check_interval``) and callbacks are fit's (``trainer.max_steps`` given on the command line counts)."""


@dataclass
class SFTRun:
    """What ``sft`` runs, checked."""

    model: ModelConfig
    """The model section."""
    optimizer: OptimizerConfig
    """``actor.optimizer``."""
    sft: SFTConfig
    """The sft section."""
    data: dict
    """The data section (the task, its settings, ``system_prompt``, ``seed``)."""
    trainer: dict
    """Lightning Trainer arguments (``TRAINER_KEYS``)."""
    logger: Any
    """``trainer.logger``: a logger's ``class_path`` / ``init_args``, a list of them, or none."""
    root: str
    """``trainer.default_root_dir``, where run directories go."""
    seed: int
    """``seed``."""
    max_steps: int
    """``trainer.max_steps`` as given on the command line; -1: ``sft.epochs`` decide."""
    checkpoint: dict
    """ModelCheckpoint's ``every_n_train_steps`` and ``save_top_k`` (the ``checkpoint`` section's)."""


def sft_run(tree: dict, sft: SFTConfig, max_steps: int | None) -> SFTRun:
    """The checked ``SFTRun`` of LightningCLI's composed ``tree``; ConfigError of one line naming the key."""
    model = tree.get("model") or {}
    model_cfg = construct(ModelConfig, model.get("model") or {}, "model")
    if model_cfg.teacher is not None:
        raise ConfigError(f"model.teacher={model_cfg.teacher} is fit's (algo=opd, algo=kdrl): sft trains on the "
                          f"examples' completions")
    optimizer = construct(OptimizerConfig, (model.get("actor") or {}).get("optimizer") or {}, "actor.optimizer")
    trainer = dict(tree.get("trainer") or {})
    strategy = trainer.get("strategy")
    if strategy not in (None, "auto") and not str(strategy).startswith("ddp"):
        raise ConfigError(f"trainer.strategy={strategy!r}: sft runs in one process or under trainer=ddp")
    callbacks = trainer.get("callbacks") or []
    saving = next((c.get("init_args") or {} for c in callbacks if isinstance(c, dict)
                   and str(c.get("class_path", "")).endswith("ModelCheckpoint")), {})
    return SFTRun(model=model_cfg, optimizer=optimizer, sft=sft, data=dict(tree.get("data") or {}),
                  trainer={k: trainer[k] for k in TRAINER_KEYS if k in trainer}, logger=trainer.get("logger"),
                  root=trainer.get("default_root_dir") or "runs", seed=tree.get("seed_everything", 0),
                  max_steps=-1 if max_steps is None else max_steps,
                  checkpoint={"every_n_train_steps": saving.get("every_n_train_steps", 20),
                              "save_top_k": saving.get("save_top_k", 3)})


def _tracked(run: SFTRun) -> SimpleNamespace:
    """The run as ``lit_ppo.run.tracking`` reads a fit's parsed config: algo ``sft``, the task, the model."""
    return SimpleNamespace(model={"algo": "sft", "model": asdict(run.model)},
                           data={"task": run.data.get("task"), "engine": "none"},
                           trainer=SimpleNamespace(logger=run.logger, default_root_dir=run.root))


def _loggers(spec: Any) -> list:
    """The loggers the ``trainer.logger`` value names (``class_path`` / ``init_args``, or a list of them)."""
    from lightning.pytorch.cli import instantiate_class

    if not spec:
        return []
    return [instantiate_class((), dict(s)) for s in (spec if isinstance(spec, list) else [spec])]


def run_sft(run: SFTRun, ckpt_path: str | None = None) -> Path:
    """Fine-tune as ``run`` says, from the checkpoint ``ckpt_path`` of an earlier sft run if given (its
    weights, optimizer and step; the run goes on in a new run directory); returns the model directory."""
    import lightning as L
    from lightning.pytorch.callbacks import ModelCheckpoint

    from lit_ppo.run.tracking import config_params, launched_as_rank_zero, start, start_mlflow_runs
    from lit_ppo.training.sft import LitSFT, SFTProgress
    from lit_ppo.training.sft_data import SFTDataModule

    L.seed_everything(run.seed, verbose=False)
    data = run.data
    try:  # the examples' source before the run directory or any model: bad data is one line
        datamodule = SFTDataModule(data.get("task"), data.get("task_kwargs"), run.sft, data.get("system_prompt"),
                                   seed=data.get("seed", run.seed))
    except ValueError as e:
        raise ConfigError(str(e)) from None
    module = LitSFT(run.model, run.optimizer)
    try:  # every example before the run directory: one that cannot train leaves nothing behind
        datamodule.tokenize(module.tokenizer)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    tracked = _tracked(run)
    run_dir = start(tracked)
    text = yaml.safe_dump({"sft": asdict(run.sft), "model": {"model": asdict(run.model),
                                                            "actor": {"optimizer": asdict(run.optimizer)}},
                           "data": data, "trainer": run.trainer, "seed_everything": run.seed}, sort_keys=False)
    if run_dir is not None and launched_as_rank_zero():  # the other ranks share rank 0's directory
        write_file_atomically(run_dir / "config.yaml", lambda f: f.write(text.encode()), "config")
    checkpoints = ModelCheckpoint(dirpath=str(run_dir / "checkpoints") if run_dir else None, monitor="step",
                                  mode="max", save_last=True, **run.checkpoint)
    # One pass over the run's batches in their order (sft_data.step_batches), so that a resume takes up the
    # batch after the last one trained; its steps and the test split's evaluations count the epochs.
    trainer = L.Trainer(**run.trainer, max_epochs=-1, default_root_dir=str(run_dir) if run_dir else None,
                        logger=_loggers(run.logger) or False, callbacks=[checkpoints, SFTProgress()],
                        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                        check_val_every_n_epoch=None, use_distributed_sampler=False)
    per_epoch = datamodule.steps_per_epoch(trainer.world_size)  # batches of one rank
    total = -(-per_epoch // trainer.accumulate_grad_batches) * run.sft.epochs
    trainer.fit_loop.epoch_loop.max_steps = total if run.max_steps < 0 else min(run.max_steps, total)
    trainer.val_check_interval = per_epoch
    start_mlflow_runs(trainer, tracked, run_dir)
    for logger in trainer.loggers:  # every setting, under the names fit's runs use, to compare runs by
        logger.log_hyperparams(config_params(yaml.safe_load(text)))
    trainer.fit(module, datamodule=datamodule, ckpt_path=ckpt_path)
    model_dir = Path(trainer.default_root_dir) / "model"
    if trainer.is_global_zero and received_signal() is None:
        print(f"model directory: {shown_path(model_dir)} (python -m lit_ppo fit model={shown_path(model_dir)})",
              file=sys.stderr, flush=True)
    return model_dir
