"""The Python API: docs/python-api.md's examples run as written (a reward function and a lambda, a Task
instance), and its functions fail as the command line does: the same one line for a mistake, a clear one
for an object the process does not have or a run that would need other processes."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap

import pytest
import yaml

import lit_ppo
from lit_ppo.errors import ConfigError, RunStopped
from lit_ppo.tasks import build_task
from lit_ppo.tasks.base import Problem
from tests.integration.conftest import REPO, run_cli, run_dir

DOC = (REPO / "docs" / "python-api.md").read_text()
EXAMPLES = re.findall(r"```python\n(.*?)```", DOC, re.S)


class Doubling:
    name = "doubling"

    def __init__(self, n: int = 10):
        self.rows = [Problem(prompt=f"2*{i}=", answer=str(2 * i % 10)) for i in range(n)]

    def problems(self, split):
        return self.rows

    def reward(self, problem, completion):
        return float(completion.strip() == problem.answer)

    def allowed_completion_tokens(self, tokenizer):
        return None


def test_the_first_example_runs_as_written(tmp_path):
    (tmp_path / "example.py").write_text(EXAMPLES[0])
    result = subprocess.run([sys.executable, "example.py"], cwd=tmp_path, capture_output=True, text=True, timeout=600,
                            env={**__import__("os").environ, "LIT_PPO_CACHE": str(tmp_path / "cache")})
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()
    assert "0.2 ['python:__main__.correct', 'python:__main__.<lambda>']" in lines  # grpo's eps_clip, the references
    directory = run_dir(tmp_path)
    printed = next(line for line in lines if line.startswith(str(directory)))
    reward, accuracy = map(float, printed.split()[1:])
    assert 0 <= reward <= 1 and 0 <= accuracy <= 1
    scores = lines[-1].split()
    assert len(scores) == 2 and all(0 <= float(s) <= 1 for s in scores)  # eval/accuracy, eval/pass_at_2
    assert (tmp_path / "my-policy" / "config.json").is_file() and (directory / "model" / "model.safetensors").is_file()
    recorded = yaml.safe_load((directory / "config.yaml").read_text())
    assert recorded["data"]["task_kwargs"]["reward_fns"] == ["python:__main__.correct", "python:__main__.<lambda>"]
    assert recorded["data"]["task_kwargs"]["reward_weights"] == [1.0, 0.5] and recorded["trainer"]["max_steps"] == 20
    assert directory.name.startswith("grpo-dataset-tiny-")
    # The recorded config names objects of that process: replayed elsewhere, one line says what to do.
    replay = run_cli(["fit", "--config", str(directory / "config.yaml")], tmp_path)
    assert replay.returncode == 2
    assert replay.stderr.strip().splitlines()[-1] == (
        "error: data.task_kwargs.reward_fns[0]='python:__main__.correct' was a Python object of the process that "
        "composed the config: give the object again (values={'data.task_kwargs.reward_fns': ...} of lit_ppo.compose, "
        "lit_ppo.validate or lit_ppo.test) or a dotted path module.function")
    # The summary's command scores the checkpoint as printed, from another process, the objects given again.
    checkpoint = (directory / "checkpoints" / "last.ckpt").relative_to(tmp_path)
    given = "{'data.task_kwargs.reward_fns': [correct, <lambda>]}"
    assert f"  test scores    lit_ppo.validate({str(checkpoint)!r}, values={given})" in lines
    values = given.replace("<lambda>", "lambda prompts, completions, **columns: [0.0] * len(completions)")
    script = EXAMPLES[0].split("config = lit_ppo.compose(")[0].split("rng = ")[0] + textwrap.dedent(f"""
        def correct(prompts, completions, answer, **columns):
            return [float(c.strip() == a) for c, a in zip(completions, answer)]


        scores = lit_ppo.validate({str(checkpoint)!r}, values={values})
        print(scores["eval/accuracy"])
        """)
    (tmp_path / "score.py").write_text(script)
    scored = subprocess.run([sys.executable, "score.py"], cwd=tmp_path, capture_output=True, text=True, timeout=600,
                            env={**__import__("os").environ, "LIT_PPO_CACHE": str(tmp_path / "cache")})
    assert scored.returncode == 0, scored.stderr[-3000:]
    assert float(scored.stdout.splitlines()[-1]) == pytest.approx(float(scores[0]))  # example's validate, same model


def test_the_readmes_example_runs_in_this_process(tmp_path, monkeypatch):
    code = re.search(r"^```python\n(import lit_ppo\n.*?)```", (REPO / "README.md").read_text(), re.S | re.M).group(1)
    shrunk = code.replace('"trainer.max_steps": 20',
                          '"trainer.max_steps": 1, "data.batch_size": 2, "gconfig.n_samples": 2, '
                          '"gconfig.max_new_tokens": 4, "eval.max_problems": 2').replace(
        '"algo=grpo",', '"algo=grpo", "logger=none",')
    assert shrunk != code
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("LIT_PPO_CACHE", str(tmp_path / "cache"))
    for split in ("train", "test"):
        (tmp_path / f"{split}.jsonl").write_text("".join(f'{{"prompt": "{i}+1=", "answer": "{(i + 1) % 10}"}}\n'
                                                         for i in range(8)))
    namespace = {"__name__": "__main__"}
    exec(compile(shrunk, "README.md", "exec"), namespace)
    result, scores = namespace["result"], namespace["scores"]
    assert result.checkpoint.is_file() and result.model_dir is not None and "rollout/reward_mean" in result.metrics
    assert set(scores) >= {"eval/accuracy", "eval/reward_mean"} and 0 <= scores["eval/accuracy"] <= 1


def test_the_task_example_runs_in_this_process(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("LIT_PPO_CACHE", str(tmp_path / "cache"))
    exec(compile(EXAMPLES[1], "docs/python-api.md", "exec"), {"__name__": "__main__"})
    reward = float(capsys.readouterr().out.strip().splitlines()[-1])
    assert 0 <= reward <= 1
    directory = run_dir(tmp_path)
    assert directory.name.startswith("grpo-Doubling-tiny-")  # named by the class, not the reference
    assert (directory / "checkpoints" / "last.ckpt").is_file() and (directory / "model" / "config.json").is_file()


def test_a_config_is_read_and_set_by_the_command_lines_keys():
    config = lit_ppo.compose("algo=dapo", "actor.eps_clip=0.3", values={"gconfig.n_samples": 4, "seed": 7})
    assert config["actor.eps_clip"] == 0.3 and config["actor.eps_clip_higher"] == 0.28  # dapo's
    assert config["gconfig.n_samples"] == 4 and config.tree["data"]["gconfig"]["n_samples"] == 4
    assert config["seed"] == 7 and config.tree["data"]["seed"] == 7  # data.seed follows seed
    assert config["actor.kl_ctl"] == 0.0  # not in the preset: the dataclass default
    config["actor.eps_clip"] = 0.25
    assert yaml.safe_load(config.to_yaml())["model"]["actor"]["eps_clip"] == 0.25
    with pytest.raises(KeyError):
        config["actor.no_such_key"]


def test_values_keep_their_python_types():
    path = "/data/my 'own' set=1,2.jsonl"
    config = lit_ppo.compose("data=dataset", values={
        "data.task_kwargs.train_path": path, "data.system_prompt": "true", "actor.optimizer.lr": 1e-6,
        "gconfig.temperature": 0.7, "actor.adv_norm": None, "data.task_kwargs.completion_tokens": [0, 1]})
    assert config["data.task_kwargs.train_path"] == path and config["data.system_prompt"] == "true"
    assert config["actor.optimizer.lr"] == 1e-6 and config["actor.adv_norm"] is None
    assert config["data.task_kwargs.completion_tokens"] == [0, 1]
    assert config["actor.temperature"] == 0.7  # the trainer's follows the sampler's, as on the command line


@pytest.mark.parametrize("overrides,values,line", [
    (("algo=GRPO",), {}, "algo=GRPO is invalid (did you mean algo=grpo?): must be one of cispo, clip_cov, dapo, "
                         "dapo_dynamic_bs, dppo, drgrpo, gdpo, gmpo, gpg, grpo, gspo, icepop, kdrl, kl_cov, kpop, "
                         "liteppo, m2po, opd, ppo, reinforce_plus_plus, reinforce_plus_plus_baseline, rloo, sapo"),
    ((), {"actor.eps_clip": -1}, "actor.eps_clip=-1 is invalid: must be a finite number >= 0.0"),
    ((), {"actor.eps_clipp": 0.3}, "actor.eps_clipp is not a key (did you mean actor.eps_clip?)"),
    ((), {"logger": None}, "logger is a preset group, not a value: give logger=<option> among the overrides (one "
                           "of csv, mlflow, none, tensorboard, wandb)"),
    (("scheduler=slurm",), {}, "scheduler=slurm|ray submits a job: run it from the command line (python -m lit_ppo "
                               "fit ... scheduler=...); lit_ppo.fit trains in this process"),
])
def test_mistakes_are_the_command_lines_lines(overrides, values, line):
    with pytest.raises(ConfigError) as error:
        lit_ppo.compose(*overrides, values=values)
    assert str(error.value) == line


@pytest.mark.parametrize("job", ["sft", "rm"])
def test_sft_and_rm_compose_the_tree_of_their_command_and_refuse_another_jobs_config(job):
    from dataclasses import replace

    from lit_ppo.launch.compose import compose_run
    from lit_ppo.launch.jobs import JOBS

    # The tree of `<job> data=dataset ... <job>.epochs=3 trainer.max_steps=5`, as the command line makes it.
    fit_tree = compose_run(["data=dataset", "data.task_kwargs.train_path=rows.jsonl", "trainer.max_steps=5"])[0]
    section_class, job_tree = JOBS[job]
    expected = job_tree(fit_tree, replace(section_class(), epochs=3, batch_size=2), 5)
    config = lit_ppo.compose("data=dataset", f"{job}.epochs=3", "trainer.max_steps=5", job=job,
                             values={"data.task_kwargs.train_path": "rows.jsonl", f"{job}.batch_size": 2})
    assert config.tree == expected and config.tree["model"]["algo"] == job
    with pytest.raises(ConfigError) as error:
        lit_ppo.fit(config)
    assert str(error.value) == (f"lit_ppo.fit was given the config of {job}: compose it with lit_ppo.compose(...), "
                                f"or run it with lit_ppo.{job}")
    with pytest.raises(ConfigError) as error:
        getattr(lit_ppo, job)(lit_ppo.compose())
    assert str(error.value) == (f"lit_ppo.{job} was given the config of fit: compose it with lit_ppo.compose(..., "
                                f"job={job!r})")
    with pytest.raises(ConfigError, match=rf"^{job}\.epoch is not a key \(did you mean {job}\.epochs\?\)"):
        lit_ppo.compose(job=job, values={f"{job}.epoch": 2})
    with pytest.raises(ConfigError, match=r"^job='ppo' is not a job: one of fit, sft, rm$"):
        lit_ppo.compose(job="ppo")


def test_python_objects_train_in_one_process():
    config = lit_ppo.compose("trainer.devices=2", "trainer.strategy=ddp", values={"data.task": Doubling()})
    with pytest.raises(ConfigError) as error:
        lit_ppo.fit(config)
    assert str(error.value) == (
        "data.task is a Python object of this process: a run on more than one process (trainer.devices=2, "
        "trainer.num_nodes=1) needs a dotted path module.name that every rank imports")


def test_a_task_instance_takes_no_task_kwargs():
    from lit_ppo.utils.imports import object_reference

    task = Doubling()
    reference = object_reference(task)
    assert reference.startswith(f"python:{__name__}.Doubling")  # the object's module and class
    assert reference == object_reference(task)  # the same object, the same name
    other = object_reference(Doubling())  # another object of that name: numbered
    assert other != reference and re.fullmatch(rf"python:{re.escape(__name__)}\.Doubling#\d+", other)
    assert build_task(reference) is task
    with pytest.raises(ValueError, match=r"is a Task instance, constructed already: data.task_kwargs \(n\)"):
        build_task(reference, n=3)
    assert len(build_task(object_reference(Doubling), n=3).problems("train")) == 3  # a class is configured
    with pytest.raises(ValueError, match="was a Python object of the process that composed the config"):
        build_task("python:__main__.Gone")


def test_import_lit_ppo_loads_no_torch():
    code = textwrap.dedent("""
        import sys, lit_ppo
        assert {"compose", "fit", "validate", "test", "export", "RunConfig", "FitResult"} <= set(dir(lit_ppo))
        sys.exit(any(m.split('.')[0] in ('torch', 'lightning') for m in sys.modules))
    """)
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)
    assert lit_ppo.fit is lit_ppo.api.fit  # on first use, from lit_ppo.api


def test_a_failed_run_raises_run_stopped_of_one_line(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("LIT_PPO_CACHE", str(tmp_path / "cache"))
    (tmp_path / "train.jsonl").write_text("".join(f'{{"prompt": "{i}=", "answer": "{i}"}}\n' for i in range(4)))

    def broken(prompts, completions, **columns):
        raise ValueError("no reward today")

    config = lit_ppo.compose("data=dataset", "data.task_kwargs.train_path=train.jsonl", "logger=none",
                             "data.batch_size=2", "gconfig.n_samples=2", "gconfig.max_new_tokens=2",
                             values={"data.task_kwargs.reward_fns": [broken], "trainer.max_steps": 2})
    with pytest.raises(RunStopped) as error:
        lit_ppo.fit(config)
    assert str(error.value).startswith(f"reward function 'python:{__name__}.test_a_failed_run_raises_run_stopped_of_"
                                       f"one_line.<locals>.broken' raised ValueError: no reward today for prompt ")
