"""``lit_ppo.launch.sft.sft_tree``: the sft job's LightningCLI tree from fit's composed one."""

from __future__ import annotations

from dataclasses import asdict

from lit_ppo.config.sft import SFTConfig
from lit_ppo.launch.compose import compose
from lit_ppo.launch.sft import SFT_PROGRESS, SFT_SUMMARY, SFT_TRAINER, sft_tree


def test_the_tree_takes_fits_model_optimizer_data_and_trainer_but_an_iterations_keys():
    fit = compose(["data=dataset", "data.task_kwargs.train_path=sums.jsonl", "actor.optimizer.lr=3e-3", "seed=4"])
    tree = sft_tree(fit, SFTConfig(epochs=3))
    assert tree["model"] == {"model": fit["model"]["model"], "actor": {"optimizer": fit["model"]["actor"]["optimizer"]},
                             "algo": "sft"}
    assert tree["data"] == {"task": "dataset", "task_kwargs": fit["data"]["task_kwargs"], "seed": 4,
                            "sft": asdict(SFTConfig(epochs=3))}
    assert tree["seed_everything"] == 4
    trainer = tree["trainer"]
    assert trainer["max_steps"] == -1  # sft.epochs decide, not the presets' iterations
    assert {k: trainer[k] for k in SFT_TRAINER} == SFT_TRAINER
    assert [c["class_path"] for c in trainer["callbacks"]] == ["lightning.pytorch.callbacks.ModelCheckpoint",
                                                               SFT_PROGRESS["class_path"], SFT_SUMMARY["class_path"]]
    assert trainer["accelerator"] == fit["trainer"]["accelerator"] and trainer["logger"] == fit["trainer"]["logger"]


def test_a_max_steps_given_on_the_command_line_counts():
    assert sft_tree(compose([]), SFTConfig(), 5)["trainer"]["max_steps"] == 5
