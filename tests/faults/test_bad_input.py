"""Every bad input is refused before any model loads: exit code 2, one line, no traceback, naming the key
the user typed and what is allowed (config fields, group options, Lightning's own arguments, --config
files, malformed overrides, --ckpt_path)."""

from __future__ import annotations

import pytest

import lit_ppo.launch.run as launch_run
from lit_ppo.__main__ import main
from lit_ppo.cli.fit import main as fit_main
from lit_ppo.errors import ConfigError
from tests.integration.conftest import run_cli

pytestmark = pytest.mark.usefixtures("no_model_loading")


def error_of(capsys, *args: str) -> str:
    """The one line ``fit *args`` prints to stderr, asserting exit code 2 and no traceback."""
    code = main(["fit", *args])
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert len(err.splitlines()) == 1, err
    assert "Traceback" not in err
    return err


@pytest.mark.parametrize("args,expected", [
    (["algo=nope"],
     "algo=nope is invalid: must be one of cispo, clip_cov, dapo, dapo_dynamic_bs, dppo, drgrpo, gdpo, gmpo, gpg"),
    (["actor.eps_clp=0.3"], "actor.eps_clp is not a key (did you mean actor.eps_clip?)"),
    (["+actor.eps_clp=0.3"], "actor.eps_clp is not a key (did you mean actor.eps_clip?)"),
    (["actor.eps_clip=abc"], "actor.eps_clip='abc' is invalid: must be a number"),
    (["algo=sapo", "actor.use_decoupled_loss=true"], "use_decoupled_loss=True is invalid: must be false with SAPO"),
    (["rejection=kpop", "actor.rejection_sampling.action=clamp"],
     "action='clamp' is invalid: must be 'mask' for metric 'binary_kl'"),
    (["actor.gae_timestep_unit=episode"], "gae_timestep_unit='episode' is invalid: must be one of 'token', 'turn'"),
    (["+actor.gae_lambda=no.such.module.fn"], "gae_lambda='no.such.module.fn' cannot be imported"),
    (["gconfig.temperature=0.7", "actor.temperature=1.0"], "actor.temperature=1.0 must equal gconfig.temperature=0.7"),
    (["data.batch_size=0"], "data.batch_size=0 is invalid: must be a positive integer"),
    (["rollout.max_head_offpolicyness=2"], "rollout.max_head_offpolicyness=2 trains on samples up to 2 policy versions "
     "old, which needs the decoupled loss: set actor.use_decoupled_loss=true"),
    (["algo=icepop", "rollout.max_head_offpolicyness=-1"],
     "rollout.max_head_offpolicyness=-1 is invalid: must be an integer >= 0 (0: synchronous)"),
    (["algo=icepop", "rollout.num_threads=0"], "rollout.num_threads=0 is invalid: must be a positive integer or null"),
    (["rollout.devices=[0]"], "rollout.devices=[0]: this machine has 0 CUDA device(s)"),
    (["rollout=vllm", "rollout.devices=[0]"],
     "rollout.devices needs rollout=hf: the vllm engine shares its rank's device"),
    (["rollout.max_head_offpolicynes=1"], "rollout.max_head_offpolicynes is not a key (did you mean "
     "rollout.max_head_offpolicyness?)"),
    (["+data.bach_size=3"], "data.bach_size is not a key (did you mean data.batch_size?)"),
    (["trainer.max_stpes=3"], "did you mean trainer.max_steps"),
    # Case ignored, and a key without its section finds the keys that end in it.
    (["algo=GRPO"], "algo=GRPO is invalid (did you mean algo=grpo?): must be one of cispo, clip_cov, dapo, "),
    (["model=SmolLM2"], "model=SmolLM2 is invalid (did you mean model=smollm2?): must be one of smollm2, tiny or a "),
    (["actor.EPS_clip=0.3"], "actor.EPS_clip is not a key (did you mean actor.eps_clip?)"),
    (["lr=1e-5"], "lr is not a key (did you mean actor.optimizer.lr or critic.optimizer.lr?)"),
    (["n_samples=4"], "n_samples is not a key (did you mean gconfig.n_samples?)"),
    (["data.task_kwargs.Seed=1"], "data.task_kwargs.Seed is not a key of task 'arithmetic' (did you mean "
     "data.task_kwargs.seed?)"),
    (["model=nope"], "model=nope is invalid: must be one of smollm2, tiny"),
    (["checkpoint.keep=-2"],
     "checkpoint.keep=-2 is invalid: must be a number of checkpoints >= 0, or -1 to keep every one"),
    (["checkpoint.every_n_iterations=0"], "checkpoint.every_n_iterations=0 is invalid: must be a positive integer"),
    (["+checkpoint.kep=1"], "checkpoint.kep is not a key (did you mean checkpoint.keep?)"),
    (["samples.every_n_iterations=-1"],
     "samples.every_n_iterations=-1 is invalid: must be a number of iterations >= 0 (0: none)"),
    (["samples.count=0"], "samples.count=0 is invalid: must be a positive integer"),
    (["+samples.cont=1"], "samples.cont is not a key (did you mean samples.count?)"),
    (["num_completions_to_print=4"], "num_completions_to_print is not a key: TRL's num_completions_to_print is "
                                     "samples.count"),
])
def test_config_errors_are_one_line(capsys, args, expected):
    assert expected in error_of(capsys, *args)


def test_the_trainer_temperature_follows_the_sampler():
    from lit_ppo.launch.compose import compose

    tree = compose(["gconfig.temperature=0.7"])
    assert tree["model"]["actor"]["temperature"] == tree["data"]["gconfig"]["temperature"] == 0.7
    assert compose([])["model"]["actor"]["temperature"] == 1.0  # the presets' sampling temperature


def test_bad_yaml_config_value(capsys, tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("model:\n  actor:\n    reward_norm: {mean_level: tokens}\n")
    assert "mean_level='tokens' is invalid: must be one of 'batch', 'group', None" in error_of(
        capsys, "--config", str(path))


def test_yaml_plus_overrides_is_refused(capsys, tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("{}\n")
    assert "not both" in error_of(capsys, "--config", str(path), "algo=grpo")


def test_fields_the_presets_do_not_set_need_no_plus():
    from lit_ppo.launch.compose import compose

    tree = compose(["algo=grpo", "actor.eps_clip_higher=0.28", "+actor.use_sapo_loss=true", "data.dynamic_bs=true"])
    assert tree["model"]["actor"]["eps_clip_higher"] == 0.28 and tree["model"]["actor"]["use_sapo_loss"] is True
    assert tree["data"]["dynamic_bs"] is True


def test_unknown_subcommand(capsys):
    assert main(["train"]) == 2
    assert "unknown subcommand 'train'" in capsys.readouterr().err


@pytest.mark.slow
def test_real_process_exit_code_and_no_traceback(tmp_path):
    result = run_cli(["fit", "algo=grpo", "actor.eps_clip=-1"], tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == ("error: actor.eps_clip=-1 is invalid: "
                                                      "must be a finite number >= 0.0")
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "cache").exists()  # nothing was built


def test_check_config_is_used_by_run(monkeypatch):
    calls = []

    def check_config(tree, subcommand):
        calls.append(tree)
        raise ConfigError("stop")

    monkeypatch.setattr(launch_run, "check_config", check_config)
    assert fit_main(["fit", "algo=grpo"]) == 2
    assert calls and calls[0]["model"]["algo"] == "grpo"


@pytest.mark.parametrize("args,expected", [
    # a wrong option of any group names that group, not another one on the line
    (["rollout=sglang"], "error: rollout=sglang is invalid: must be one of hf, vllm"),
    (["trainer=tpu"], "error: trainer=tpu is invalid (did you mean trainer=gpu?): must be one of cpu, ddp, fsdp, gpu"),
    (["algo=grpo", "rejection=popice"],
     "error: rejection=popice is invalid (did you mean rejection=kpop?): must be one of geo_mask, icepop, kpop, none"),
    (["data=gsm8k"], "error: data.task_kwargs.train_path is required: give data.task_kwargs.train_path=<value>"),
    (["data=gsm8k", "data.task_kwargs.train_path=nope.jsonl"],
     "error: data.task_kwargs.train_path='nope.jsonl': no such file"),
    # Lightning's own arguments
    (["trainer.max_steps=abc"], "error: trainer.max_steps='abc' is invalid: must be a positive integer"),
    (["trainer.max_steps=0"],
     "error: trainer.max_steps=0 is invalid: must be a positive integer (RL iterations) or -1"),
    (["trainer.devices=0"],
     "error: trainer.devices=0 is invalid here: `Trainer(devices=0)` value is not a valid input"),
    (["trainer.accelerator=quantum"],
     "error: trainer.accelerator=quantum is invalid: must be one of auto, cpu, cuda, gpu"),
    (["trainer.strategy=nope"],
     "error: trainer.strategy='nope' is invalid here: You selected an invalid strategy name"),
    (["trainer.precision=17"],
     "error: trainer.precision=17 is invalid here: Precision 17 is invalid. Allowed precision"),
    (["trainer.num_nodes=0"], "error: trainer.num_nodes=0 is invalid here: `num_nodes` must be a positive integer"),
    (["trainer.enable_progress_bar=maybe"],
     "error: trainer.enable_progress_bar=maybe is invalid: expected bool or null"),
    (["trainer.callbacks.0.init_args.every_n_train_step=3"],
     "error: trainer.callbacks.0.init_args.every_n_train_step is not an argument of ModelCheckpoint "
     "(did you mean every_n_train_steps?)"),
    (["trainer.callbacks.0.init_args.every_n_train_steps=abc"],
     "error: trainer.callbacks (ModelCheckpoint) every_n_train_steps=abc is invalid: expected int or null"),
    (["trainer.callbacks.1.init_args.every_n_steps=-1"],
     "error: trainer.callbacks.1 (CompletionSamples) is invalid: CompletionSamples(every_n_steps=-1, num_samples=8)"),
    (["trainer.callbacks.0.class_path=no.such.Callback"],
     "error: trainer.callbacks.0.class_path='no.such.Callback' cannot be imported"),
    # malformed overrides
    (["=3"], "error: override '=3' is malformed: expected key=value with a dotted key"),
    (["actor..eps_clip=3"], "error: override 'actor..eps_clip=3' is malformed"),
    (["data.system_prompt=You", "are", "a", "tutor"],
     "error: 'are' is neither key=value nor a --flag (it follows 'data.system_prompt=You': quote a value that has "
     "spaces"),
    (["actor.eps_clip=(0.2"], "does not parse (extraneous input '(' "),
    (["data.system_prompt=a, b"], "is ambiguous: quote the value (key='a, b') or give a list (key=[a,b])"),
    # --ckpt_path
    (["--ckpt_path", "nope.ckpt"], "error: --ckpt_path nope.ckpt: no such file"),
    (["--ckpt_path"], "error: --ckpt_path needs a value"),
])
def test_bad_input_is_one_line_naming_the_key(capsys, args, expected):
    assert expected in error_of(capsys, *args)


def test_accelerator_not_on_this_machine(capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    for args in (["trainer.accelerator=gpu"], ["trainer=gpu"]):
        assert "error: trainer.accelerator=gpu is not available on this machine: available: auto, cpu" in error_of(
            capsys, *args)


def test_ckpt_path_that_is_a_directory(capsys, tmp_path):
    assert f"--ckpt_path {tmp_path}" in error_of(capsys, "--ckpt_path", str(tmp_path))


@pytest.mark.parametrize("text,expected", [
    ("", "is empty: expected a mapping with keys model, data, trainer"),
    ("# nothing but a comment\n", "is empty"),
    ("- model\n- data\n", "holds a list, expected a mapping with keys model, data, trainer"),
    ("model:\n  actor: {eps_clip: 0.2\n", "line 3, column 1: "),
    ("model:\n\tactor: {}\n", "line 2, column 1: "),
])
def test_malformed_config_files_name_file_line_and_column(capsys, tmp_path, text, expected):
    path = tmp_path / "run.yaml"
    path.write_text(text)
    err = error_of(capsys, "--config", str(path))
    assert err.startswith(f"error: --config {path}") and expected in err


def test_config_file_that_is_missing_or_a_directory(capsys, tmp_path):
    missing = tmp_path / "x.yaml"
    assert f"error: --config {missing}: no such file" == error_of(capsys, "--config", str(missing))
    assert "is a directory" in error_of(capsys, "--config", str(tmp_path))


def test_a_value_with_spaces_quoted_as_one_argument_is_accepted():
    from lit_ppo.launch.compose import compose

    tree = compose(["data.system_prompt=You are a patient tutor"])
    assert tree["data"]["system_prompt"] == "You are a patient tutor"


def test_flag_values_may_contain_equals_signs():
    from lit_ppo.utils.flags import split_arguments

    overrides, flags = split_arguments(["algo=grpo", "--ckpt_path", "runs/x/epoch=0-step=2.ckpt", "--print_config"])
    assert overrides == ["algo=grpo"] and flags == ["--ckpt_path", "runs/x/epoch=0-step=2.ckpt", "--print_config"]


def test_a_stop_signal_of_an_earlier_command_does_not_reach_the_next(capsys):
    """In one process (a notebook, a test run), a command that a signal stopped leaves no stop for the next."""
    import signal

    from lit_ppo.utils.stop_requests import record_signal

    record_signal(signal.SIGTERM)
    with pytest.raises(SystemExit) as exit_info:  # --print_config's own exit, not "stopped by SIGTERM"
        main(["fit", "--print_config"])
    assert exit_info.value.code in (0, None)
    assert "seed_everything: 0" in capsys.readouterr().out


@pytest.mark.parametrize("job", ["fit", "sft", "rm"])
def test_a_bad_choice_of_float32_cpu_kernels_is_one_line_before_the_run(capsys, monkeypatch, tmp_path, job):
    from lit_ppo.models import cpu_matmul

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(cpu_matmul.ENV, "fast")
    cpu_matmul.onednn_chosen.cache_clear()
    try:
        code = main([job])
    finally:
        cpu_matmul.onednn_chosen.cache_clear()
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert err == "error: LIT_PPO_FLOAT32_MATMUL=fast is invalid: must be one of onednn, mkl", err
    assert not (tmp_path / "runs").exists()
