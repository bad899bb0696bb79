"""``RolloutConfig`` (``lit_ppo.config.rollout``): its values normalised, the first bad key named, and the
settings of rollout=hf's engine checked before any model loads."""

from __future__ import annotations

import pytest

from lit_ppo.config import RolloutConfig
from lit_ppo.launch.compose import compose
from lit_ppo.training.datamodule import RolloutDataModule


def test_rollout_config_normalises_its_values_and_names_the_first_bad_key():
    cfg = RolloutConfig(engine_kwargs=None, max_logp_gap=1, devices=None)
    assert (cfg.engine_kwargs, cfg.max_logp_gap, type(cfg.max_logp_gap)) == ({}, 1.0, float)
    # The values are checked in the order of the data module's arguments: the engine first.
    with pytest.raises(ValueError, match=r"^data.engine='sglang' is invalid: must be one of 'hf', 'vllm'$"):
        RolloutConfig(engine="sglang", batch_size=0)
    with pytest.raises(ValueError, match=r"^data.turn_discount=0 is invalid: must be a number in \(0, 1\]$"):
        RolloutConfig(turn_discount=0)
    with pytest.raises(ValueError, match=r"^rollout.max_logp_gap=0 is invalid: must be a positive number, 'auto' "
                                         r"or null$"):
        RolloutConfig(max_logp_gap=0)
    with pytest.raises(ValueError, match=r"^rollout.engine_kwargs=\[1\] is invalid: must be a mapping or null$"):
        RolloutConfig(engine_kwargs=[1])  # each field's type first, named as the command line types it
    with pytest.raises(ValueError, match=r"^rollout.num_threads=0 is invalid: must be a positive integer or null$"):
        RolloutConfig(max_head_offpolicyness=1, num_threads=0)
    with pytest.raises(ValueError, match=r"^rollout.devices needs rollout=hf: the vllm engine shares its rank's "):
        RolloutConfig(engine="vllm", devices=[0])
    RolloutConfig(engine="vllm", engine_kwargs={"gpu_memory_utilization": 0.3})  # vLLM checks its own settings


def test_engine_precision_settings_are_validated_before_any_model_loads():
    with pytest.raises(ValueError, match=r"^rollout.engine_kwargs.dtype='bf16' is invalid: must be one of 'auto', "):
        RolloutDataModule(engine_kwargs={"dtype": "bf16"})
    with pytest.raises(ValueError, match=r"^rollout.engine_kwargs.autocast='float32' is invalid"):
        RolloutDataModule(engine_kwargs={"autocast": "float32"})
    with pytest.raises(ValueError, match=r"^rollout.engine_kwargs.dtyp is not a setting of rollout=hf; allowed: "
                                         r"autocast, dtype, max_batch_size$"):
        RolloutDataModule(engine_kwargs={"dtyp": "bfloat16"})
    with pytest.raises(ValueError, match=r"^rollout.engine_kwargs.max_batch_size=0 is invalid"):
        RolloutDataModule(engine_kwargs={"max_batch_size": 0})
    assert compose(["rollout.engine_kwargs.dtype=bfloat16"])["data"]["engine_kwargs"] == {"dtype": "bfloat16"}
    RolloutDataModule(engine_kwargs={"dtype": "bfloat16", "autocast": "bfloat16", "max_batch_size": 8})
    RolloutDataModule(engine="vllm", engine_kwargs={"dtype": "half"})  # vLLM's own values: vLLM checks them


@pytest.mark.parametrize("kwargs, message", [
    ({"max_turns": 0}, "^data.max_turns=0 is invalid: must be a positive integer$"),
    ({"max_turns": 2.0}, "^data.max_turns=2.0 is invalid"),
    ({"max_turns": True}, "^data.max_turns=True is invalid"),
    ({"turn_discount": 0.0}, r"^data.turn_discount=0.0 is invalid: must be a number in \(0, 1\]$"),
    ({"turn_discount": 1.5}, "^data.turn_discount=1.5 is invalid"),
    ({"turn_discount": True}, "^data.turn_discount=True is invalid"),
])
def test_the_turn_settings_the_workflows_take_are_checked(kwargs, message):
    with pytest.raises(ValueError, match=message):
        RolloutConfig(**kwargs)
