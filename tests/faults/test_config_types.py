"""Every field of every config section is checked against its declared type before any model loads:
a wrong-typed value (a string for a boolean, a fraction for an integer, a word for a number) is one line,
exit code 2, naming the key as typed and what its type allows; the Python API refuses it the same way."""

from __future__ import annotations

import dataclasses
import inspect
import typing

import pytest

import lit_ppo.config
from lit_ppo.__main__ import main
from lit_ppo.config import ModelConfig
from lit_ppo.config.keys import ROLLOUT_KEYS, typed_key
from lit_ppo.config.sft import SFTConfig
from lit_ppo.errors import ConfigError
from lit_ppo.launch.check import check_config
from lit_ppo.launch.compose import compose
from lit_ppo.schedulers import SCHEDULERS
from lit_ppo.training.datamodule import RolloutDataModule
from tests.integration.conftest import FAST, run_cli

pytestmark = pytest.mark.usefixtures("no_model_loading")

SECTIONS = {"SFTConfig": "sft.", "NormConfig": "", "RejectionSamplingConfig": "rejection_sampling.",
            "OptimizerConfig": "optimizer.", "PPOActorConfig": "", "PPOCriticConfig": "critic.",
            "GenerationConfig": "gconfig.", "EvalConfig": "eval.", "ModelConfig": "model.", "SlurmConfig": "scheduler.",
            "RayConfig": "scheduler.", "RolloutConfig": "data.", "TrustRegionMaskConfig": "trust_region_mask.",
            "ClipCovConfig": "clip_cov.", "KLCovConfig": "kl_cov."}
"""Config dataclass -> the prefix its own errors give a field (the CLI adds ``actor.`` to the actor's); a key
of the rollout group is named as typed, ``rollout.<key>`` (``typed_key``)."""
CONFIGS = sorted({cls for _, cls in inspect.getmembers(lit_ppo.config, dataclasses.is_dataclass)
                  if cls.__module__.startswith("lit_ppo.config.")} | {ModelConfig, SFTConfig}
                 | {c for c in SCHEDULERS.values() if c},
                 key=lambda cls: cls.__name__)
"""Every config dataclass: those of lit_ppo.config (a new one is picked up), the model's, sft's and the schedulers'."""


def error_of(capsys, *args: str) -> str:
    """The one line ``fit *args`` prints, asserting exit code 2 and no traceback."""
    code = main(["fit", *args])
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


def accepts_strings(hint) -> bool:
    return hint is str or str in typing.get_args(hint)


def wrong_value(hint):
    """A value YAML or Hydra can produce that ``hint`` does not allow."""
    return [1.5] if accepts_strings(hint) else "maybe"


@pytest.mark.slow
def test_a_string_for_a_boolean_is_refused_in_a_real_process(tmp_path):
    result = run_cli(["fit", *FAST, "actor.use_decoupled_loss=maybe"], tmp_path, timeout=300)
    assert result.returncode == 2, result.stderr[-3000:]
    assert result.stderr.strip().splitlines()[-1] == (
        "error: actor.use_decoupled_loss='maybe' is invalid: must be true or false")
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "cache").exists()  # no model was built


@pytest.mark.parametrize("args,expected", [
    # actor, its optimizer and its nested configs
    (["actor.use_decoupled_loss=maybe"], "actor.use_decoupled_loss='maybe' is invalid: must be true or false"),
    (["actor.use_sapo_loss=yes"], "actor.use_sapo_loss='yes' is invalid: must be true or false"),
    (["actor.recompute_logprob=1"], "actor.recompute_logprob=1 is invalid: must be true or false"),
    (["actor.mask_no_eos_with_zero=null"], "actor.mask_no_eos_with_zero=None is invalid: must be true or false"),
    (["actor.overlong_tokens=1.5"], "actor.overlong_tokens=1.5 is invalid: must be an integer or null"),
    (["actor.gae_lambda_kwargs=x"], "actor.gae_lambda_kwargs='x' is invalid: must be a mapping"),
    (["actor.reward_norm.mean_leave1out=maybe"],
     "actor.reward_norm.mean_leave1out='maybe' is invalid: must be true or false"),
    (["actor.adv_norm.group_size=2.5"], "actor.adv_norm.group_size=2.5 is invalid: must be an integer"),
    (["actor.optimizer.warmup_steps=1.5"], "actor.optimizer.warmup_steps=1.5 is invalid: must be an integer"),
    (["actor.optimizer=adam"], "actor.optimizer='adam' is invalid: must be a mapping of OptimizerConfig fields"),
    (["rejection=icepop", "actor.rejection_sampling.upper=high"],
     "actor.rejection_sampling.upper='high' is invalid: must be a number"),
    (["model.actor.use_sapo_loss=yes"], "actor.use_sapo_loss='yes' is invalid: must be true or false"),
    # critic
    (["algo=ppo", "critic.ppo_n_minibatches=2.5"], "critic.ppo_n_minibatches=2.5 is invalid: must be an integer"),
    (["algo=ppo", "critic.optimizer.lr=fast"], "critic.optimizer.lr='fast' is invalid: must be a number"),
    # model
    (["model.gradient_checkpointing=nah"], "model.gradient_checkpointing='nah' is invalid: must be true or false"),
    (["model.lora_target_modules=[1,2]"],
     "model.lora_target_modules=[1, 2] is invalid: must be a string or a list of strings"),
    (["model.cache_dir=[a]"], "model.cache_dir=['a'] is invalid: must be a string or null"),
    # gconfig, eval
    (["gconfig.restrict_to_task_tokens=maybe"],
     "gconfig.restrict_to_task_tokens='maybe' is invalid: must be true or false"),
    (["gconfig.stop_token_ids=[a]"], "gconfig.stop_token_ids=['a'] is invalid: must be a list of integers"),
    (["eval.k=2.5"], "eval.k=2.5 is invalid: must be an integer"),
    (["eval.success_threshold=high"], "eval.success_threshold='high' is invalid: must be a number"),
    # data and rollout (RolloutDataModule's arguments)
    (["data.dynamic_bs=maybe"], "data.dynamic_bs='maybe' is invalid: must be true or false"),
    (["data.system_prompt=[a,b]"], "data.system_prompt=['a', 'b'] is invalid: must be a string or null"),
    (["data.seed=1.5"], "data.seed=1.5 is invalid: must be an integer in [0, 4294967295]"),
    (["data.turn_discount=half"], "data.turn_discount='half' is invalid: must be a number"),
    (["rollout.max_logp_gap=big"], "rollout.max_logp_gap='big' is invalid: must be a number, 'auto' or null"),
    (["data.task_kwargs=x"], "data.task_kwargs='x' is invalid: must be a mapping or null"),
    (["rollout.engine_kwargs=[1]"], "rollout.engine_kwargs=[1] is invalid: must be a mapping"),
    # schedulers
    (["scheduler=slurm", "scheduler.extra_sbatch=--exclusive"],
     "scheduler.extra_sbatch='--exclusive' is invalid: must be a list of strings"),
    (["scheduler=slurm", "scheduler.extra_sbatch={a: 1}"], "scheduler.extra_sbatch={a: 1} is invalid: must be a list"),
    (["scheduler=slurm", "scheduler.dry_run=1"], "scheduler.dry_run=1 is invalid: must be true or false"),
    (["scheduler=ray", "scheduler.num_workers=two"], "scheduler.num_workers='two' is invalid: must be an integer"),
])
def test_wrong_types_are_one_line_naming_the_key(capsys, args, expected):
    assert error_of(capsys, "logger=none", *args) == f"error: {expected}"


def test_a_config_file_is_checked_the_same_way(capsys, tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("model:\n  actor: {use_decoupled_loss: maybe}\n")
    assert error_of(capsys, "--config", str(path)) == (
        "error: actor.use_decoupled_loss='maybe' is invalid: must be true or false")


@pytest.mark.parametrize("cls", CONFIGS, ids=lambda cls: cls.__name__)
def test_every_field_of_every_config_refuses_a_wrong_type(cls):
    """A wrong-typed value for each field in turn (a field added later is walked too): a ValueError
    naming the field and the value."""
    hints = typing.get_type_hints(cls)
    assert cls.__name__ in SECTIONS, f"{cls.__name__}: add the prefix of its errors to SECTIONS"
    for f in dataclasses.fields(cls):
        value = wrong_value(hints[f.name])
        with pytest.raises(ValueError) as error:
            cls(**{f.name: value})
        key = typed_key(f"{SECTIONS[cls.__name__]}{f.name}")
        assert str(error.value).startswith(f"{key}={value!r} is invalid: must be "), (f.name, str(error.value))


@pytest.mark.parametrize("cls", [c for c in CONFIGS if any(
    typing.get_type_hints(c)[f.name] is bool for f in dataclasses.fields(c))], ids=lambda cls: cls.__name__)
def test_booleans_take_only_true_or_false(cls):
    for f in dataclasses.fields(cls):
        if typing.get_type_hints(cls)[f.name] is bool:
            for value in (1, 0, "true", None):
                with pytest.raises(ValueError, match=r"is invalid: must be true or false$"):
                    cls(**{f.name: value})


def test_numbers_take_integers_and_integers_take_no_booleans():
    from lit_ppo.config import GenerationConfig, OptimizerConfig

    assert OptimizerConfig(lr=1).lr == 1  # a float field takes an integer
    with pytest.raises(ValueError, match=r"^gconfig\.n_samples=True is invalid: must be an integer$"):
        GenerationConfig(n_samples=True)


def test_every_data_argument_refuses_a_wrong_type():
    """RolloutDataModule's arguments (data.*, rollout.*), each wrong in turn, through the CLI's check."""
    default = compose(["logger=none"])
    hints = typing.get_type_hints(RolloutDataModule.__init__)
    for name in inspect.signature(RolloutDataModule.__init__).parameters:
        if name in ("self", "gconfig", "eval"):  # config sections of their own, walked above
            continue
        tree = {**default, "data": {**default["data"]}}
        value = wrong_value(hints[name])
        tree["data"][name] = value
        with pytest.raises(ConfigError) as error:
            check_config(tree)
        key = f"rollout.{name}" if name in ROLLOUT_KEYS else f"data.{name}"
        assert str(error.value).startswith(f"{key}={value!r} is invalid: must be "), str(error.value)
