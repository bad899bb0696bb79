"""The ``sft`` job's LightningCLI tree, from the same composed config as ``fit``'s: the ``model`` section
chooses the model, ``actor.optimizer`` its AdamW (``LitSFT``), ``data`` the examples and the ``sft`` section
how they are read and for how many passes (``SFTDataModule``), ``trainer`` the accelerator, devices,
precision, ``default_root_dir`` and tracking, ``checkpoint`` the checkpoints. It runs through fit's door
(``lit_ppo.launch.run.sft``): a run directory ``<root>/<experiment>/sft-<task>-<model>-<time>/`` holds
``config.yaml``, ``checkpoints/``, ``summary.txt`` and the final model directory ``model/``, which ``fit
model=<dir>`` starts from. This file imports nothing heavy, so that composing an sft config loads no torch."""

from __future__ import annotations

from dataclasses import asdict

from lit_ppo.config.sft import SFTConfig

SFT_DATA_KEYS = ("task", "task_kwargs", "system_prompt", "seed")
"""The data section's keys that the examples are read with (``SFTDataModule``'s besides ``sft``)."""
SFT_TRAINER = {"max_epochs": -1, "val_check_interval": None, "check_val_every_n_epoch": None,
               "num_sanity_val_steps": 0, "enable_progress_bar": True, "enable_model_summary": False,
               "use_distributed_sampler": False}
"""Trainer arguments of every sft run: one epoch holding the run's batches in their order, which the data
module counts out and shards between the ranks (``SFTDataModule.setup``); its progress is ``SFTProgress``."""
SFT_PROGRESS = {"class_path": "lit_ppo.training.sft.SFTProgress"}
"""The sft run's progress, as a fit's on stdout: its step, loss and learning rate, and each evaluation's loss."""
SFT_SUMMARY = {"class_path": "lit_ppo.training.sft.SFTSummary"}
"""The block that ends an sft run, as a fit's: on stdout and in the run directory's ``summary.txt``."""


def sft_tree(tree: dict, sft: SFTConfig, max_steps: int | None = None) -> dict:
    """The sft job's LightningCLI tree from fit's composed ``tree``, with the ``sft`` section and the
    ``trainer.max_steps`` given on the command line (None: ``sft.epochs`` decide) (``job_tree``)."""
    data = tree.get("data") or {}
    return job_tree(tree, "sft", {key: data[key] for key in SFT_DATA_KEYS if key in data}, {"sft": asdict(sft)},
                    [SFT_PROGRESS, SFT_SUMMARY], max_steps)


def job_tree(tree: dict, algo: str, data: dict, section: dict, reports: list[dict], max_steps: int | None) -> dict:
    """The LightningCLI tree of a job that trains the ``model`` section's model on examples of its own (sft's,
    rm's) from fit's composed ``tree``: the model and ``actor.optimizer`` sections, ``algo`` its name, the data
    section of ``data`` (what the job reads of fit's) and the job's own ``section``, and the trainer section with
    fit's keys but those of an RL iteration: ``max_steps`` (the presets' count iterations; None: the job's epochs
    decide), and of the callbacks the checkpoints only, then the job's ``reports`` (its progress and summary)."""
    model = tree.get("model") or {}
    trainer = dict(tree.get("trainer") or {})
    checkpoints = [c for c in trainer.get("callbacks") or [] if isinstance(c, dict)
                   and str(c.get("class_path", "")).endswith("ModelCheckpoint")]
    trainer.update(SFT_TRAINER, max_steps=-1 if max_steps is None else max_steps, callbacks=[*checkpoints, *reports])
    return {"model": {"model": model.get("model") or {},
                      "actor": {"optimizer": (model.get("actor") or {}).get("optimizer") or {}}, "algo": algo},
            "data": {**data, **section}, "trainer": trainer, "seed_everything": tree.get("seed_everything", 0)}
