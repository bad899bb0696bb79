"""Every name a user can see works when typed: the LightningCLI names ``--print_config`` shows
(``data.gconfig.n_samples``, ``model.actor.eps_clip``, ``data.engine``, ``trainer.logger.init_args.run_name``,
``seed_everything``) and the names of the MLflow params set the same value as the command line's own names,
over the presets; a name that only another way can set is refused in one line naming that way. ``validate``
/ ``test --ckpt_path`` refuse overrides of what the checkpoint's model was trained as."""

from __future__ import annotations

import pytest
import torch
import yaml

from lit_ppo.__main__ import main
from lit_ppo.errors import ConfigError
from lit_ppo.launch.compose import compose
from lit_ppo.launch.lightning_cli import LitPPOCLI
from lit_ppo.launch.run import evaluation_tree
from lit_ppo.run.resume import CONFIG_STATE_KEY
from lit_ppo.run.tracked_run import config_params
from tests.integration.conftest import FAST, run_cli

pytestmark = pytest.mark.usefixtures("no_model_loading")


def error_of(capsys, *args: str) -> str:
    """The one line ``args`` print, asserting exit code 2 and no traceback."""
    code = main(list(args))
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


def at(tree: dict, key: str):
    """The value at the dotted LightningCLI ``key`` of ``tree``."""
    for part in key.split("."):
        tree = tree[part]
    return tree


@pytest.mark.slow
def test_printed_names_take_effect_in_a_real_process(tmp_path):
    result = run_cli(["fit", "data.gconfig.n_samples=3", "data.eval.k=2", "model.actor.eps_clip=0.25",
                      "data.engine_kwargs.max_batch_size=5", "trainer.logger.init_args.run_name=probe",
                      "seed_everything=7", "--print_config"], tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    printed = yaml.safe_load(result.stdout)
    assert printed["data"]["gconfig"]["n_samples"] == 3  # the preset (data=arithmetic) says 16
    assert printed["data"]["eval"]["k"] == 2
    assert printed["model"]["actor"]["eps_clip"] == 0.25
    assert printed["data"]["engine_kwargs"] == {"max_batch_size": 5}
    assert printed["trainer"]["logger"]["init_args"]["run_name"] == "probe"
    assert printed["seed_everything"] == 7 and printed["data"]["seed"] == 7


@pytest.mark.parametrize("printed,typed,value", [
    ("data.gconfig.n_samples", "gconfig.n_samples", 8),
    ("data.gconfig.top_k", "gconfig.top_k", 5),
    ("data.eval.k", "eval.k", 3),
    ("data.engine", "rollout.engine", "vllm"),
    ("data.engine_kwargs.max_batch_size", "rollout.engine_kwargs.max_batch_size", 7),
    ("data.max_logp_gap", "rollout.max_logp_gap", 0.5),
    ("data.max_head_offpolicyness", "rollout.max_head_offpolicyness", 2),
    ("data.num_threads", "rollout.num_threads", 3),
    ("data.devices", "rollout.devices", [0]),
    ("model.actor.eps_clip", "actor.eps_clip", 0.3),
    ("model.actor.optimizer.lr", "actor.optimizer.lr", 0.01),
    ("model.actor.reward_norm.eps", "actor.reward_norm.eps", 0.5),
    ("model.critic.eps_clip", "critic.eps_clip", 0.4),
    ("model.model.lora_rank", "model.lora_rank", 4),
    ("model.model.dtype", "model.dtype", "bfloat16"),
    ("trainer.logger.init_args.run_name", "logger.init_args.run_name", "mine"),
    ("trainer.logger.init_args.on_error", "logger.init_args.on_error", "continue"),
    ("seed_everything", "seed", 5),
])
def test_a_printed_name_sets_what_the_typed_name_sets(printed, typed, value):
    text = str(value)
    base = ["algo=ppo"]  # a preset with a critic
    by_printed, by_typed = compose([*base, f"{printed}={text}"]), compose([*base, f"{typed}={text}"])
    assert at(by_printed, printed) == value
    assert by_printed == by_typed


def test_the_offpolicyness_under_its_printed_name_needs_the_decoupled_loss(capsys):
    assert "trains on samples up to 1 policy versions old, which needs the decoupled loss" in error_of(
        capsys, "fit", "logger=none", "data.max_head_offpolicyness=1")


@pytest.mark.parametrize("args,expected", [
    (["model.algo=ppo"], "model.algo=ppo cannot be set here: the algo preset sets it: use algo=ppo (one of cispo,"),
    (["model.algo=mine"], "model.algo=mine cannot be set here: the algo preset sets it: use algo=<option>"),
    (["trainer.logger=false"], "trainer.logger=false cannot be set here: the logger preset sets it: use logger=none "
     "(one of csv, mlflow, none, tensorboard, wandb)"),
    (["model.model=smollm2"], "model.model=smollm2 cannot be set here: the model preset sets it: use model=smollm2"),
    (["ckpt_path=runs/x/last.ckpt"], "ckpt_path is not a config key: give the flag --ckpt_path runs/x/last.ckpt"),
    (["logger=none", "logger.init_args.run_name=x"], "logger.init_args is given without a logger (logger=none)"),
    # a mistyped name is answered in the section as typed, never with itself
    (["model.model.lora_rnk=4"], "model.model.lora_rnk is not a key (did you mean model.model.lora_rank?)"),
    (["data.gconfig.n_sample=4"], "data.gconfig.n_sample is not a key (did you mean data.gconfig.n_samples?)"),
    (["actor.optimizer.lrr=1"], "actor.optimizer.lrr is not a key (did you mean actor.optimizer.lr?)"),
    (["model.actor.reward_norm.epss=1"],
     "model.actor.reward_norm.epss is not a key (did you mean model.actor.reward_norm.eps?)"),
    (["data.enginee=vllm"], "data.enginee is not a key (did you mean data.engine?)"),
])
def test_names_that_cannot_work_are_refused_naming_the_one_to_use(capsys, args, expected):
    assert error_of(capsys, "fit", *args).startswith(f"error: {expected}")


def test_suggestions_never_repeat_the_key():
    from lit_ppo.launch.compose import _suggest

    assert _suggest("model.model.lora_rank") == "" and _suggest("actor.eps_clip") == ""
    assert _suggest("model.model.lora_rnk") == " (did you mean model.model.lora_rank?)"


def changed(value) -> tuple[str, object]:
    """(Hydra text, value) of a value of the same kind as the parsed ``value`` that differs from it."""
    if isinstance(value, bool):
        return str(not value).lower(), not value
    if isinstance(value, int):
        return str(value + 1), value + 1
    if isinstance(value, float):
        return repr(value + 0.5), value + 0.5
    if isinstance(value, str):
        assert "'" not in value and "\\" not in value
        return f"'{value}x'", value + "x"
    if value is None:
        return "7", 7
    if isinstance(value, list):
        return ("[]", []) if value else ("[1]", [1])
    assert value == {}, value  # a mapping with keys is walked into
    return "{a: 1}", {"a": 1}


@pytest.fixture(scope="module")
def parsed_default(tmp_path_factory):
    """The parsed config of ``python -m lit_ppo fit``, as TrackedConfig hands it to config_params (the
    MLflow params), caught before anything is instantiated."""
    captured = {}

    def capture(self):
        captured["tree"] = self.config[self.subcommand].clone().as_dict()
        raise ConfigError("caught")

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(LitPPOCLI, "before_instantiate_classes", capture)
        patch.chdir(tmp_path_factory.mktemp("default"))
        assert main(["fit"]) == 2
    return captured["tree"]


def leaves(tree: dict, prefix: str = "") -> list[tuple[str, object]]:
    """(dotted LightningCLI key, value) of every leaf, a list or an empty mapping being one."""
    out = []
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            out += leaves(value, f"{prefix}{key}.")
        else:
            out.append((f"{prefix}{key}", value))
    return out


def round_trip(parsed: dict, names: dict[str, str]) -> None:
    """Each name of ``names`` (LightningCLI key -> name to type), typed with a changed value, sets that
    key in compose()'s tree; flags (``ckpt_path``) are refused naming the flag, preset groups naming the group."""
    overrides, expected = [], {}
    for key, value in leaves(parsed):
        name = names[key]
        text, new = changed(value)
        if key in ("ckpt_path", "weights_only"):
            with pytest.raises(ConfigError, match=rf"^{key} is not a config key: give the flag --{key} "):
                compose([f"{name}={text}"])
        elif key == "model.algo":
            if name == "algo":  # the preset group itself
                assert compose(["algo=ppo"])["model"]["algo"] == "ppo"
            else:
                with pytest.raises(ConfigError, match=r"^model\.algo=.* use algo="):
                    compose([f"{name}={text}"])
        else:
            overrides.append(f"{name}={text}")
            expected[key] = new
    tree = compose(overrides)
    wrong = {key: (at(tree, key), new) for key, new in expected.items() if at(tree, key) != new}
    assert not wrong, wrong


def test_every_mlflow_param_name_typed_back_sets_its_value(parsed_default):
    params = config_params(parsed_default)
    keys = [key for key, _ in leaves(parsed_default) if key != "config"]  # the command's own temporary file
    assert len(params) == len(keys)
    assert {"gconfig.n_samples", "rollout.engine", "rollout.max_head_offpolicyness", "actor.eps_clip",
            "model.lora_rank", "logger.init_args.run_name", "seed", "algo"} <= set(params)
    parsed = {k: v for k, v in parsed_default.items() if k != "config"}
    round_trip(parsed, dict(zip(keys, params)))


def test_every_printed_name_typed_back_sets_its_value(parsed_default):
    parsed = {k: v for k, v in parsed_default.items() if k != "config"}
    round_trip(parsed, {key: key for key, _ in leaves(parsed)})


# ---------------------------------------------------------------------------------------------
# validate / test --ckpt_path: the checkpoint's model as trained
# ---------------------------------------------------------------------------------------------

@pytest.fixture
def checkpoint(tmp_path):
    """A checkpoint recording the resolved config of a fit, as TrackedConfig stores it (no weights:
    nothing here gets as far as loading them)."""
    path = tmp_path / "last.ckpt"
    tree = compose([*FAST])
    torch.save({"callbacks": {"TrackedConfig": {CONFIG_STATE_KEY: yaml.safe_dump(tree)}}}, path)
    return path


@pytest.mark.parametrize("subcommand", ["validate", "test"])
@pytest.mark.parametrize("override", ["model.lora_rank=4", "model.model.lora_rank=4", "model.source=smollm2",
                                      "actor.eps_clip=0.3", "model.actor.kl_ctl=0.1", "critic.eps_clip=0.3",
                                      "algo=ppo", "rejection=icepop"])
def test_evaluating_a_checkpoint_refuses_model_overrides(capsys, checkpoint, subcommand, override):
    assert error_of(capsys, subcommand, "--ckpt_path", str(checkpoint), "eval.k=0", override) == (
        f"error: {override} cannot be given to {subcommand} --ckpt_path: it scores the checkpoint's model as "
        f"trained (algo, model.*, actor.*, critic.* come from the checkpoint); eval.*, gconfig.*, rollout.*, "
        f"data.* and trainer.* can change")


def test_a_checkpoint_without_a_recorded_config_refuses_them_too(capsys, tmp_path):
    """A lit_ppo checkpoint whose config is not in it (the overrides then compose fit's presets)."""
    from lit_ppo.training.record import RECORD_KEY, expected_record

    path = tmp_path / "own.ckpt"
    torch.save({RECORD_KEY: expected_record(compose(FAST))}, path)
    assert "error: actor.eps_clip=0.3 cannot be given to validate --ckpt_path" in error_of(
        capsys, "validate", "--ckpt_path", str(path), *FAST, "actor.eps_clip=0.3")


def test_evaluating_a_checkpoint_refuses_logger_settings(capsys, checkpoint):
    assert error_of(capsys, "validate", "--ckpt_path", str(checkpoint), "trainer.logger.init_args.run_name=x") == (
        "error: trainer.logger.init_args.run_name=x cannot be given to validate: it records nothing (no logger, run "
        "directory or MLflow run); the scores are printed")


def test_evaluation_overrides_under_either_name_apply(checkpoint):
    tree = evaluation_tree("validate", str(checkpoint), [
        "eval.k=0", "data.eval.max_problems=2", "data.gconfig.n_samples=2", "gconfig.max_new_tokens=3",
        "data.max_logp_gap=0.5", "rollout.engine_kwargs.dtype=bfloat16", "data.batch_size=2", "seed_everything=3"])
    data = tree["data"]
    assert (data["eval"]["k"], data["eval"]["max_problems"]) == (0, 2)
    assert (data["gconfig"]["n_samples"], data["gconfig"]["max_new_tokens"]) == (2, 3)
    assert (data["max_logp_gap"], data["engine_kwargs"], data["batch_size"]) == (0.5, {"dtype": "bfloat16"}, 2)
    assert tree["seed_everything"] == 3 and data["seed"] == 3  # as in fit, data.seed follows the seed
