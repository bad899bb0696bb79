"""Trainer presets: the same `trainer=ddp` / `trainer=fsdp` command suits a CPU machine (2 gloo
processes, fp32) and a GPU machine (every visible GPU, NCCL, bf16-mixed); `trainer=gpu` is one GPU."""

from __future__ import annotations

import pytest
import torch

from lit_ppo.cli.compose import compose

FSDP_STRATEGY = {"class_path": "lit_ppo.training.fsdp.FSDP2Strategy"}


def trainer_of(option: str) -> dict:
    return compose([f"trainer={option}"])["trainer"]


@pytest.mark.parametrize("option, strategy", [("ddp", "ddp"), ("fsdp", FSDP_STRATEGY)])
def test_multi_process_presets_on_cpu_are_two_gloo_ranks_in_fp32(monkeypatch, option, strategy):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    trainer = trainer_of(option)
    assert (trainer["accelerator"], trainer["devices"], trainer["precision"]) == ("cpu", 2, "32-true")
    assert trainer["strategy"] == strategy


@pytest.mark.parametrize("option, strategy", [("ddp", "ddp"), ("fsdp", FSDP_STRATEGY)])
def test_multi_process_presets_on_gpu_take_every_visible_gpu_in_bf16(monkeypatch, option, strategy):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    trainer = trainer_of(option)
    assert (trainer["accelerator"], trainer["devices"], trainer["precision"]) == ("gpu", "auto", "bf16-mixed")
    assert trainer["strategy"] == strategy


def test_gpu_preset_is_one_gpu_in_bf16_mixed():
    trainer = trainer_of("gpu")
    assert (trainer["accelerator"], trainer["devices"], trainer["precision"]) == ("gpu", 1, "bf16-mixed")


def test_a_key_override_beats_the_machine_default(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    trainer = compose(["trainer=fsdp", "trainer.devices=4", "trainer.precision=32-true"])["trainer"]
    assert (trainer["devices"], trainer["precision"]) == (4, "32-true")
