"""The ``checkpoint`` section: how often a fit writes a periodic checkpoint and how many it keeps. The
trainer presets' ModelCheckpoint takes its arguments from here (``${checkpoint.*}``); ``last.ckpt`` is
written beside the periodic checkpoints, after the final iteration and when a signal stops the run."""

from __future__ import annotations

from dataclasses import dataclass

from lit_ppo.config.checks import check_fields, check_positive_int, fail

CHECKPOINT_CALLBACK = "lightning.pytorch.callbacks.ModelCheckpoint"
"""The callback of the trainer presets that the ``checkpoint`` section sets (``${checkpoint.*}``)."""
CALLBACK_ARGUMENTS = {"every_n_iterations": "every_n_train_steps", "keep": "save_top_k"}
"""``checkpoint.<field>`` -> the argument of ``CHECKPOINT_CALLBACK`` that the trainer presets set from it."""


def checkpoint_key(argument: str) -> str | None:
    """``checkpoint.<field>`` of ``CHECKPOINT_CALLBACK``'s ``argument`` (``save_top_k``: ``checkpoint.keep``);
    None for an argument that no field sets."""
    return next((f"checkpoint.{name}" for name, set_by in CALLBACK_ARGUMENTS.items() if set_by == argument), None)


@dataclass
class CheckpointConfig:
    """The run's checkpoints in ``<run dir>/checkpoints/``: a periodic one every few iterations, the
    newest few kept, and ``last.ckpt``."""

    every_n_iterations: int = 20
    """Write a checkpoint every this many iterations (``epoch=0-step=<iteration>.ckpt``, Lightning's
    ``every_n_train_steps``)."""
    keep: int = 3
    """Keep the newest this many periodic checkpoints, deleting the oldest as a new one is written
    (Lightning's ``save_top_k`` by iteration); -1 keeps every one, 0 none: ``last.ckpt`` is always kept."""

    def __post_init__(self) -> None:
        check_fields(self, "checkpoint")
        check_positive_int("checkpoint.every_n_iterations", self.every_n_iterations)
        if self.keep < -1:
            fail("checkpoint.keep", self.keep, "a number of checkpoints >= 0, or -1 to keep every one")

