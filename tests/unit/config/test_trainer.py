"""``lit_ppo.config.trainer``: the trainer section's keys, known without importing Lightning, are the installed
Lightning Trainer's arguments."""

from __future__ import annotations

import inspect

import lightning as L

from lit_ppo.config.trainer import TRAINER_KEYS


def test_the_trainer_keys_known_without_lightning_are_lightnings():
    assert list(TRAINER_KEYS) == list(inspect.signature(L.Trainer.__init__).parameters)[1:]
