"""Bad input fails before any model loads: one line naming the key and what is allowed, exit code 2."""

from __future__ import annotations

import pytest

import lit_ppo.cli as cli_module
from lit_ppo.__main__ import main


@pytest.fixture(autouse=True)
def no_model_loading(monkeypatch):
    """Any attempt to build the model fails the test: errors must come first."""
    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the config error was reported")

    monkeypatch.setattr("lit_ppo.module.load_causal_lm", refuse)


def error_of(capsys, *args: str) -> str:
    code = main(["fit", *args])
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert len(err.splitlines()) == 1, err
    assert "Traceback" not in err
    return err


@pytest.mark.parametrize("args,expected", [
    (["algo=nope"], "algo=nope is invalid: must be one of dapo, dapo_dynamic_bs, drgrpo, grpo, gspo, icepop, kpop"),
    (["actor.eps_clp=0.3"], "actor.eps_clp is not a key (did you mean actor.eps_clip?)"),
    (["+actor.eps_clp=0.3"], "actor.eps_clp is not a key (did you mean actor.eps_clip?)"),
    (["actor.eps_clip=abc"], "eps_clip='abc' is invalid: must be a finite number >= 0.0"),
    (["algo=sapo", "actor.use_decoupled_loss=true"], "use_decoupled_loss=True is invalid: must be false with SAPO"),
    (["rejection=kpop", "actor.rejection_sampling.action=clamp"], "action='clamp' is invalid: must be 'mask' for metric 'binary_kl'"),
    (["actor.gae_timestep_unit=episode"], "gae_timestep_unit='episode' is invalid: must be one of 'token', 'turn'"),
    (["+actor.gae_lambda=no.such.module.fn"], "gae_lambda='no.such.module.fn' cannot be imported"),
    (["gconfig.temperature=0.7"], "actor.temperature=1.0 must equal gconfig.temperature=0.7"),
    (["data.batch_size=0"], "data.batch_size=0 is invalid: must be a positive integer"),
    (["+data.bach_size=3"], "data.bach_size is not a key (did you mean data.batch_size?)"),
    (["trainer.max_stpes=3"], "did you mean trainer.max_steps"),
    (["model=nope"], "model=nope is invalid: must be one of smollm2, tiny"),
])
def test_config_errors_are_one_line(capsys, args, expected):
    assert expected in error_of(capsys, *args)


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
    from lit_ppo.cli import compose

    tree = compose(["algo=grpo", "actor.eps_clip_higher=0.28", "+actor.use_sapo_loss=true", "data.dynamic_bs=true"])
    assert tree["model"]["actor"]["eps_clip_higher"] == 0.28 and tree["model"]["actor"]["use_sapo_loss"] is True
    assert tree["data"]["dynamic_bs"] is True


def test_unknown_subcommand(capsys):
    assert main(["train"]) == 2
    assert "unknown subcommand 'train'" in capsys.readouterr().err


@pytest.mark.slow
def test_real_process_exit_code_and_no_traceback(cli):
    result = cli("fit", "algo=grpo", "actor.eps_clip=-1")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == "error: actor.eps_clip=-1 is invalid: must be a finite number >= 0.0"
    assert "Traceback" not in result.stderr
    assert not (cli.cwd / "cache").exists()  # nothing was built


def test_validate_is_used_by_run(monkeypatch):
    calls = []
    monkeypatch.setattr(cli_module, "validate", lambda tree: calls.append(tree) or (_ for _ in ()).throw(
        cli_module.ConfigError("stop")))
    assert cli_module.run(["fit", "algo=grpo"]) == 2
    assert calls and calls[0]["model"]["algo"] == "grpo"
