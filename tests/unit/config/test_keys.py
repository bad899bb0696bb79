"""lit_ppo.config.keys: the command line's name of a key and LightningCLI's, both directions derived from
the one table of sections."""

import pytest

from lit_ppo.config.keys import LIGHTNING_SECTIONS, ROLLOUT_KEYS, SECTIONS, lightning_path, typed_key


@pytest.mark.parametrize("typed, lightning", [
    ("actor.eps_clip", "model.actor.eps_clip"), ("algo", "model.algo"), ("model.lora_rank", "model.model.lora_rank"),
    ("gconfig.n_samples", "data.gconfig.n_samples"), ("eval.k", "data.eval.k"), ("data.seed", "data.seed"),
    ("rollout.engine", "data.engine"), ("logger.init_args.run_name", "trainer.logger.init_args.run_name"),
    ("trainer.max_steps", "trainer.max_steps"), ("seed", "seed_everything"),
])
def test_both_names_of_a_key(typed, lightning):
    assert lightning_path(typed) == tuple(lightning.split("."))
    assert typed_key(lightning) == typed


def test_every_section_and_rollout_key_round_trips():
    keys = [f"{section}.field" for section in SECTIONS if section != "rollout"]
    keys += [f"rollout.{key}" for key in ROLLOUT_KEYS]
    assert [typed_key(".".join(lightning_path(key))) for key in keys] == keys


def test_keys_outside_the_sections():
    assert lightning_path("evaluation.k") is None and lightning_path("scheduler.nodes") is None
    assert typed_key("data.rollout_kwargs") == "data.rollout_kwargs"  # a data key, not one of rollout's
    assert LIGHTNING_SECTIONS == ("model", "data", "trainer", "seed_everything")
