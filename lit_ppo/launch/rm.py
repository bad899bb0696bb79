"""The ``rm`` job's LightningCLI tree, from the same composed config as ``fit``'s, as sft's is
(``lit_ppo.launch.sft``): the ``model`` section chooses the causal LM whose body the reward model takes,
``actor.optimizer`` its AdamW (``LitRM``), ``data`` the preference pairs and the ``rm`` section how they are read,
for how many passes and with which loss options (``RMDataModule``), ``trainer`` the accelerator, devices,
precision, ``default_root_dir`` and tracking, ``checkpoint`` the checkpoints. It runs through fit's door
(``lit_ppo.launch.run.rm``): a run directory ``<root>/<experiment>/rm-<task>-<model>-<time>/`` holds
``config.yaml``, ``checkpoints/``, ``summary.txt`` and the reward model directory ``model/``, which
``data.task_kwargs.reward_fns`` takes. This file imports nothing heavy, so that composing an rm config loads no
torch."""

from __future__ import annotations

from dataclasses import asdict

from lit_ppo.config.rm import RM_ALGO, RMConfig
from lit_ppo.launch.sft import job_tree

RM_DATA_KEYS = ("task", "task_kwargs", "seed")
"""The data section's keys that the pairs are read with (``RMDataModule``'s besides ``rm``)."""
RM_PROGRESS = {"class_path": "lit_ppo.training.rm.RMProgress"}
"""The rm run's progress, as a fit's on stdout: its step, loss, pair accuracy and learning rate, and each
evaluation's pair accuracy, margin and loss."""
RM_SUMMARY = {"class_path": "lit_ppo.training.rm.RMSummary"}
"""The block that ends an rm run, as a fit's: on stdout and in the run directory's ``summary.txt``."""


def rm_tree(tree: dict, rm: RMConfig, max_steps: int | None = None) -> dict:
    """The rm job's LightningCLI tree from fit's composed ``tree``, with the ``rm`` section and the
    ``trainer.max_steps`` given on the command line (None: ``rm.epochs`` decide); its trainer is sft's
    (``job_tree``: one epoch of the run's batches in their order), with fit's checkpoint callbacks."""
    data = tree.get("data") or {}
    return job_tree(tree, RM_ALGO, {key: data[key] for key in RM_DATA_KEYS if key in data}, {"rm": asdict(rm)},
                    [RM_PROGRESS, RM_SUMMARY], max_steps)
