"""The rollout data module (``lit_ppo.training.datamodule``): the engine it builds (autocast as the trainer's
precision; the policy's own weights in the synchronous loop, a copy otherwise) and the workflow it picks for
multi-turn tasks, whose settings it validates."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import lightning as L
import pytest
import torch

from lit_ppo.config import GenerationConfig
from lit_ppo.models import build_tiny, build_tiny_tokenizer
from lit_ppo.rollout.episodes.multi_turn import MultiTurnWorkflow
from lit_ppo.rollout.episodes.single_turn import SingleTurnWorkflow
from lit_ppo.training.datamodule import RolloutDataModule, _trainer_autocast
from tests.unit.fakes import ScriptedEngine
from tests.unit.rollout.engines.test_hf import tiny_model, tiny_tokenizer


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    model, tok = build_tiny(cache_dir=tmp_path_factory.mktemp("cache"))
    return model.eval(), tok


@pytest.fixture(scope="module")
def tok():
    return build_tiny_tokenizer()


def test_the_engine_autocasts_as_the_trainers_precision(tiny):
    for precision, expected in (("bf16-mixed", "bfloat16"), ("32-true", None), ("bf16-true", None)):
        trainer = L.Trainer(accelerator="cpu", precision=precision, logger=False, enable_checkpointing=False,
                            enable_progress_bar=False, enable_model_summary=False)
        assert _trainer_autocast(trainer) == expected, precision
    # The data module builds its engine with it; rollout.engine_kwargs.autocast overrides it.
    model, tok = tiny
    module = SimpleNamespace(policy=model, full_policy=lambda: model, tokenizer=tok, device=torch.device("cpu"),
                             version=0)
    trainer = L.Trainer(accelerator="cpu", precision="bf16-mixed", logger=False, enable_checkpointing=False)
    for engine_kwargs, expected in (({}, torch.bfloat16), ({"autocast": None}, None)):
        data = RolloutDataModule(engine_kwargs=engine_kwargs)
        data.trainer = trainer
        assert data._build_engine(module).autocast == expected


def test_the_synchronous_loop_shares_the_policys_weights_and_other_loops_copy_them():
    """The data module's choice: the synchronous HF engine samples from the policy itself; asynchronous
    rollouts, another dtype or device, and a gathered / merged policy (FSDP, LoRA) get a copy."""
    from types import SimpleNamespace

    import lightning as L

    from lit_ppo.training.datamodule import RolloutDataModule

    tok = tiny_tokenizer()
    policy = tiny_model(len(tok))
    trainer = L.Trainer(accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False)

    def engine(merged=False, **data_kwargs):
        module = SimpleNamespace(policy=policy, full_policy=lambda: copy.deepcopy(policy) if merged else policy,
                                 tokenizer=tok, device=torch.device("cpu"), version=0)
        data = RolloutDataModule(**data_kwargs)
        data.trainer = trainer
        return data._build_engine(module)

    shared = engine()
    assert shared.shares_weights and shared.model is policy
    for kwargs in (dict(max_head_offpolicyness=1), dict(engine_kwargs={"dtype": "float32"}), dict(merged=True)):
        copied = engine(**kwargs)
        assert not copied.shares_weights and copied.model is not policy, kwargs


# ---------------------------------------------------------------- the workflow for multi-turn tasks


def datamodule_workflow(tok, **kwargs):
    data = RolloutDataModule(gconfig=GenerationConfig(n_samples=2, max_new_tokens=8), **kwargs)
    data.trainer = SimpleNamespace(lightning_module=SimpleNamespace(tokenizer=tok, policy=None), global_rank=0,
                                   world_size=1)
    data.engine = ScriptedEngine([])
    data.train_dataloader()
    return data.workflow


def test_datamodule_picks_the_multi_turn_workflow_for_multi_turn_tasks(tok):
    workflow = datamodule_workflow(tok, task="calculator", task_kwargs={"num_train": 4, "num_test": 1},
                                   max_turns=5, turn_discount=0.9, system_prompt="s")
    assert isinstance(workflow, MultiTurnWorkflow)
    assert (workflow.max_turns, workflow.turn_discount, workflow.system_prompt) == (5, 0.9, "s")
    assert workflow.params.n == 2 and workflow.params.max_new_tokens == 8
    assert isinstance(datamodule_workflow(tok, task="arithmetic", task_kwargs={"num_train": 4}), SingleTurnWorkflow)


@pytest.mark.parametrize("kwargs, message", [
    ({"max_turns": 0}, "data.max_turns=0 is invalid: must be a positive integer"),
    ({"max_turns": "3"}, "data.max_turns='3' is invalid"),
    ({"turn_discount": 0}, r"data.turn_discount=0 is invalid: must be a number in \(0, 1\]"),
    ({"turn_discount": 1.01}, "data.turn_discount=1.01 is invalid"),
])
def test_datamodule_validates_the_multi_turn_settings(kwargs, message):
    with pytest.raises(ValueError, match=message):
        RolloutDataModule(task="calculator", task_kwargs={"num_train": 1, "num_test": 1}, **kwargs)


def test_the_data_sections_keys_types_and_defaults_are_the_data_modules():
    # The checks before a run know the data section without importing this module (Lightning).
    import inspect

    from lit_ppo.config import RolloutConfig, type_hints
    from lit_ppo.config.rollout import DATA_KEYS, DATA_SECTIONS, DATA_TYPES

    parameters = dict(inspect.signature(RolloutDataModule.__init__).parameters)
    parameters.pop("self")
    hints = type_hints(RolloutDataModule.__init__)
    assert sorted(DATA_KEYS) == sorted(parameters)
    assert DATA_TYPES == {name: hints[name] for name in parameters if name not in DATA_SECTIONS}
    defaults = RolloutConfig()
    assert {name: getattr(defaults, name) for name in parameters if hasattr(defaults, name)} == {
        name: {} if name == "engine_kwargs" else p.default for name, p in parameters.items() if hasattr(defaults, name)}
