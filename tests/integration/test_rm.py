"""``python -m lit_ppo rm`` through the command line: the tiny model's reward model learns a preference from pairs
(completions holding an odd digit win) to at least 95% held-out pair accuracy; its ``model/`` loads with plain
transformers and scores as the run measured it; ``fit`` trains against it through ``reward_fns``, which normalises
with the statistics it records; every bad pair is one line before the run directory exists; a checkpoint of
another job is refused; SIGTERM ends the step and the printed resume ends with the weights of a run never
stopped."""

from __future__ import annotations

import json
import os
import random
import re
import signal
import sqlite3
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from tests.integration.conftest import reap, run_cli

pytestmark = pytest.mark.slow

RM = ["rm", "logger=none", "data=dataset", "data.task_kwargs.train_path=pairs.jsonl",
      "data.task_kwargs.test_fraction=0.2", "rm.epochs=2", "rm.batch_size=8"]
"""80 training pairs of 100, 8 a step: 10 steps an epoch, 20 in all."""


def write_pairs(path, n: int = 100) -> None:
    """Pairs of two-digit completions of ``a+b=``: the chosen one holds an odd digit, the rejected one none."""
    rng = random.Random(0)
    odd, even = "13579", "02468"
    rows = [{"prompt": f"{rng.randrange(10)}+{rng.randrange(10)}=",
             "chosen": "".join(rng.sample([rng.choice(odd), rng.choice(even)], 2)),
             "rejected": rng.choice(even) + rng.choice(even)} for _ in range(n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


@pytest.fixture(scope="module")
def rm_run(tmp_path_factory):
    """One tiny rm run, in a real process: (working directory, CompletedProcess, run directory)."""
    cwd = tmp_path_factory.mktemp("rm")
    write_pairs(cwd / "pairs.jsonl")
    result = run_cli(RM, cwd)
    assert result.returncode == 0, result.stderr[-3000:]
    (run,) = (cwd / "runs").glob("*/rm-dataset-tiny-*")
    return cwd, result, run


def plain_rewards(model, tokenizer, prompts: list[str], completions: list[str]) -> torch.Tensor:
    """The logits of plain transformers for each completion, the conversation through the directory's own chat
    template, the texts right-padded with the pad token the directory's config names."""
    texts = [tokenizer.apply_chat_template([{"role": "user", "content": prompt},
                                            {"role": "assistant", "content": completion}], tokenize=False)
             for prompt, completion in zip(prompts, completions)]
    tokenizer.padding_side = "right"
    with torch.no_grad():
        return model(**tokenizer(texts, add_special_tokens=False, padding=True, return_tensors="pt")).logits[:, 0]


def test_the_reward_model_learns_the_preference_and_transformers_scores_it_as_the_run_measured(rm_run):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from lit_ppo.config.rm import RMConfig
    from lit_ppo.training.rm_examples import preference_pairs

    cwd, result, run = rm_run
    accuracies = [float(v) for v in re.findall(r"^rm epoch \d val_accuracy ([\d.]+) ", result.stdout, re.M)]
    assert len(accuracies) == 2 and accuracies[-1] >= 0.95, result.stdout  # 20 held-out pairs, never trained on
    assert (run / "config.yaml").is_file() and (run / "checkpoints" / "last.ckpt").is_file()
    # model/ holds the trained reward model: what the checkpoint holds.
    state = torch.load(run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)["state_dict"]
    exported = load_file(run / "model" / "model.safetensors")
    assert set(exported) == {name.removeprefix("reward_model.") for name in state}
    for name, value in exported.items():
        torch.testing.assert_close(value, state[f"reward_model.{name}"], rtol=0, atol=0)
    # Plain transformers loads it, one label, and scores the held-out pairs as the run's last evaluation did.
    model = AutoModelForSequenceClassification.from_pretrained(run / "model").eval()
    tokenizer = AutoTokenizer.from_pretrained(run / "model")
    assert model.config.num_labels == 1 and model.config.architectures == ["LlamaForSequenceClassification"]
    pairs = preference_pairs("dataset", {"train_path": str(cwd / "pairs.jsonl"), "test_fraction": 0.2}, RMConfig())
    test = pairs["test"]
    chosen = plain_rewards(model, tokenizer, [p.prompt for p in test], [p.chosen for p in test])
    rejected = plain_rewards(model, tokenizer, [p.prompt for p in test], [p.rejected for p in test])
    last = re.findall(r"^rm epoch 2 val_accuracy ([\d.]+) val_margin (\S+) ", result.stdout, re.M)[0]
    assert (chosen > rejected).float().mean().item() == pytest.approx(float(last[0]), abs=1e-4)
    assert (chosen - rejected).mean().item() == pytest.approx(float(last[1]), rel=1e-3)
    # It records the mean and spread of its rewards over both sides of the 80 training pairs.
    train = pairs["train"]
    both = torch.cat([plain_rewards(model, tokenizer, [p.prompt for p in train], [getattr(p, side) for p in train])
                      for side in ("chosen", "rejected")])
    record = json.loads((run / "model" / "lit_ppo_model.json").read_text())
    assert record["base_model"] == "tiny" and record["reward_statistics"]["pairs"] == 80
    assert record["reward_statistics"]["mean"] == pytest.approx(both.mean().item(), rel=1e-4, abs=1e-5)
    assert record["reward_statistics"]["std"] == pytest.approx(both.std(unbiased=False).item(), rel=1e-4)


def test_reward_fns_takes_the_directory_unchanged_and_normalises_with_its_statistics(rm_run):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from lit_ppo.tasks import build_task

    cwd, _, run = rm_run
    prompts = ["2+3=", "7+1="]
    completions = ["35", "48"]
    (cwd / "prompts.jsonl").write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts))
    task = build_task("dataset", train_path=str(cwd / "prompts.jsonl"), reward_fns=[str(run / "model")])
    scored = [task.reward(problem, c) for problem, c in zip(task.problems("train"), completions)]
    model = AutoModelForSequenceClassification.from_pretrained(run / "model").eval()
    logits = plain_rewards(model, AutoTokenizer.from_pretrained(run / "model"), prompts, completions)
    statistics = json.loads((run / "model" / "lit_ppo_model.json").read_text())["reward_statistics"]
    expected = (logits - statistics["mean"]) / statistics["std"]
    torch.testing.assert_close(torch.tensor(scored), expected, rtol=1e-5, atol=1e-5)
    assert scored[0] > scored[1]  # the odd digit wins


def summary_rows(text: str) -> dict[str, str]:
    lines = text.splitlines()
    assert lines[0] == "run summary", text
    return {line[2:17].strip(): line[17:] for line in lines[1:]}


def test_rm_reports_as_fit_does_and_fit_trains_against_its_model(rm_run, cli_here):
    cwd, result, run = rm_run
    steps = re.findall(r"^rm step (\d+)/20 loss [\d.e-]+ accuracy [\d.]+ lr 0\.001 eta", result.stdout, re.M)
    assert steps == [str(i) for i in range(2, 21, 2)], result.stdout
    summary = result.stdout[result.stdout.index("run summary\n"):]
    assert (run / "summary.txt").read_text() == summary
    rows = summary_rows(summary)
    assert list(rows) == ["steps", "loss", "val_accuracy", "run directory", "checkpoint", "model", "rewards",
                          "fit against it"]
    model = run.relative_to(cwd) / "model"
    assert rows["fit against it"] == (f"python -m lit_ppo fit data=dataset data.task_kwargs.train_path=<prompts> "
                                      f"'data.task_kwargs.reward_fns=[{model}]'")
    # fit, as offered, on prompts of the pairs' kind: the reward model is its reward, logged under its name.
    rows_in = [{"prompt": f"{a}+{b}="} for a in range(10) for b in range(10)]
    (cli_here.cwd / "prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows_in))
    fitted = cli_here("fit", "logger=csv", "algo=grpo", "data=dataset", "data.task_kwargs.train_path=prompts.jsonl",
                      f"data.task_kwargs.reward_fns=[{run / 'model'}]", "data.batch_size=4", "gconfig.n_samples=4",
                      "gconfig.max_new_tokens=2", "trainer.max_steps=3")
    assert fitted.returncode == 0, fitted.stderr[-3000:]
    assert re.search(r"^  rewards        model -?[\d.]+ -> -?[\d.]+$", fitted.stdout, re.M), fitted.stdout
    (metrics,) = cli_here.cwd.glob("runs/*/*/csv/**/metrics.csv")
    header = metrics.read_text().splitlines()[0].split(",")
    assert "rollout/rewards/model/mean" in header


@pytest.mark.parametrize("row, line", [
    ({"prompt": "1+1=", "chosen": "3"}, "pairs.jsonl line 2 has no column 'rejected'"),
    ({"prompt": "1+1=", "chosen": "3", "rejected": ""}, "pairs.jsonl line 2: its rejected completion is empty"),
    ({"prompt": "1+1=", "chosen": "3", "rejected": "3"},
     "pairs.jsonl line 2: its chosen and rejected completions are identical ('3')"),
    ({"prompt": "1+1=", "chosen": "3", "rejected": "2" * 200},
     "pairs.jsonl line 2: its rejected side is 207 tokens, more than rm.max_length=64"),
    ({"chosen": [{"role": "user", "content": "1+1="}, {"role": "assistant", "content": "3"}],
      "rejected": [{"role": "user", "content": "1+2="}, {"role": "assistant", "content": "2"}]},
     "pairs.jsonl line 2: the prompt differs between the sides"),
])
def test_a_bad_pair_is_one_line_naming_its_line_before_the_run_directory(cli_here, row, line):
    rows = [{"prompt": "1+2=", "chosen": "3", "rejected": "4"}, row]
    (cli_here.cwd / "pairs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    result = cli_here("rm", "logger=none", "data=dataset", "data.task_kwargs.train_path=pairs.jsonl",
                      "rm.max_length=64")
    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stderr.strip().splitlines()[-1].startswith(f"error: {line}"), result.stderr
    assert not (cli_here.cwd / "runs").exists()


def test_fit_and_validate_refuse_an_rm_checkpoint_in_one_line(rm_run, cli_here):
    _, _, run = rm_run
    ckpt = run / "checkpoints" / "last.ckpt"
    fitted = cli_here("fit", "logger=none", "--ckpt_path", str(ckpt))
    assert fitted.returncode == 2
    assert fitted.stderr.strip().splitlines()[-1] == (
        f"error: --ckpt_path {ckpt}: was written by rm, not by fit: fit resumes only its own checkpoints (the "
        f"optimizer, schedule and data position are the job's); its reward model is a reward for fit: python -m "
        f"lit_ppo export --ckpt_path {ckpt} --output DIR, then python -m lit_ppo fit "
        f"'data.task_kwargs.reward_fns=[DIR]'")
    scored = cli_here("validate", "--ckpt_path", str(ckpt))
    assert scored.returncode == 2
    assert scored.stderr.strip().splitlines()[-1].startswith(
        f"error: --ckpt_path {ckpt}: was written by rm, a reward model's run, which has no policy to score")
    assert not (cli_here.cwd / "runs").exists()


def test_sigterm_ends_the_step_exits_143_and_the_printed_resume_ends_as_the_run_never_stopped(rm_run, tmp_path):
    _, _, whole = rm_run
    write_pairs(tmp_path / "pairs.jsonl")
    env = {**os.environ, "LIT_PPO_CACHE": str(tmp_path / "cache")}
    proc = subprocess.Popen([sys.executable, "-m", "lit_ppo", *RM], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        seen = ""
        while "rm step 6/20" not in seen:
            line = proc.stdout.readline()
            assert line, seen[-3000:]
            seen += line
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=300)
    finally:
        reap(proc)
    assert proc.returncode == 143 and "Traceback" not in out, out[-3000:]
    (ckpt,) = tmp_path.glob("runs/*/*/checkpoints/last.ckpt")
    step = torch.load(ckpt, map_location="cpu", weights_only=True)["global_step"]
    assert 6 <= step < 20
    offered = summary_rows(out[out.index("run summary\n"):])["resume"]
    assert offered == f"python -m lit_ppo rm --ckpt_path {ckpt.relative_to(tmp_path)}"
    done = subprocess.run([sys.executable, *offered.split()[1:]], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "rm step 20/20" in done.stdout
    resumed = torch.load(ckpt, map_location="cpu", weights_only=True)
    assert resumed["global_step"] == 20
    uninterrupted = torch.load(whole / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    for name, value in uninterrupted["state_dict"].items():
        torch.testing.assert_close(resumed["state_dict"][name], value, rtol=0, atol=0)


def test_export_of_an_rm_checkpoint_is_the_runs_model_directory(rm_run, cli_here, monkeypatch):
    cwd, _, run = rm_run
    ckpt = run / "checkpoints" / "last.ckpt"
    out = cli_here.cwd / "exported"
    # From the directory the run started in, where its config's relative data path points.
    exported = run_cli(["export", "--ckpt_path", str(ckpt), "--output", str(out)], cwd)
    assert exported.returncode == 0, exported.stderr[-3000:]
    # The same sequence classifier as the run's model/, weight for weight, with the same record.
    final, written = load_file(run / "model" / "model.safetensors"), load_file(out / "model.safetensors")
    assert set(written) == set(final)
    for name, value in final.items():
        torch.testing.assert_close(written[name], value, rtol=0, atol=0)
    assert json.loads((out / "config.json").read_text())["architectures"] == ["LlamaForSequenceClassification"]
    record, expected = (json.loads((d / "lit_ppo_model.json").read_text()) for d in (out, run / "model"))
    assert record["base_model"] == "tiny" and record["reward_statistics"]["pairs"] == 80
    for name in ("mean", "std"):
        assert record["reward_statistics"][name] == pytest.approx(expected["reward_statistics"][name], rel=1e-5)
    # Refused before any model loads, in one line: an adapter alone (the head is no part of one), and an export
    # from elsewhere, where the training pairs that its statistics are over cannot be read.
    from lit_ppo.errors import ConfigError
    from lit_ppo.run.export import export

    with pytest.raises(ConfigError) as adapter:
        export(ckpt, None, adapter=cli_here.cwd / "adapter")
    assert str(adapter.value).startswith(f"--adapter: --ckpt_path {ckpt} holds a reward model (rm), whose new scalar "
                                         f"head trains beside the adapters")
    with pytest.raises(ConfigError) as elsewhere:
        monkeypatch.chdir(cli_here.cwd)  # not the run's working directory
        export(ckpt, cli_here.cwd / "again")
    assert str(elsewhere.value) == (
        f"--ckpt_path {ckpt}: the training pairs, over which the reward model directory records its rewards' mean "
        f"and std, cannot be read: data.task_kwargs.train_path='pairs.jsonl': no such file or directory (a relative "
        f"path is read from the working directory: export from the one the run started in)")
    assert not (cli_here.cwd / "again").exists()


def logits_of(model, tokenizer, pairs) -> tuple[torch.Tensor, torch.Tensor]:
    """Plain transformers' rewards of the chosen and of the rejected sides of ``pairs``."""
    prompts = [p.prompt for p in pairs]
    return (plain_rewards(model, tokenizer, prompts, [p.chosen for p in pairs]),
            plain_rewards(model, tokenizer, prompts, [p.rejected for p in pairs]))


def test_the_python_api_trains_a_lora_reward_model_with_centering_on_a_dataset_tracked_in_mlflow(tmp_path,
                                                                                                   monkeypatch,
                                                                                                   capsys):
    import datasets
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    import lit_ppo
    from lit_ppo.config import ModelConfig
    from lit_ppo.config.rm import RMConfig
    from lit_ppo.errors import ConfigError
    from lit_ppo.models import load_policy
    from lit_ppo.models.lora import add_lora
    from lit_ppo.models.reward_model import reward_model_from, rewards
    from lit_ppo.run.compare import compare
    from lit_ppo.training.rm import reward_model_lora
    from lit_ppo.training.rm_examples import preference_pairs, tokenize_pair

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("LIT_PPO_CACHE", str(tmp_path / "cache"))
    for key in ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME", "LIT_PPO_RUN_DIR"):
        monkeypatch.delenv(key, raising=False)
    write_pairs(tmp_path / "pairs.jsonl", 20)
    rows = [json.loads(line) for line in (tmp_path / "pairs.jsonl").read_text().splitlines()]
    # 16 training pairs, 4 a step: 4 steps, a checkpoint every 2; the default logger, MLflow in ./mlflow.db.
    config = lit_ppo.compose("data=dataset", "model.lora_rank=4", "checkpoint.every_n_iterations=2", job="rm",
                             values={"data.task_kwargs.train_path": datasets.Dataset.from_list(rows),
                                     "data.task_kwargs.test_fraction": 0.2, "rm.batch_size": 4,
                                     "rm.center_rewards_coefficient": 0.5})
    with pytest.raises(ConfigError, match=r"^lit_ppo\.fit was given the config of rm: compose it with "):
        lit_ppo.fit(config)
    result = lit_ppo.rm(config)
    assert result.stopped_by is None and result.model_dir == result.run_dir / "model"
    ckpt = torch.load(result.checkpoint, map_location="cpu", weights_only=True)
    assert ckpt["global_step"] == 4
    state = {name.removeprefix("reward_model."): value for name, value in ckpt["state_dict"].items()}

    # LoRA: the optimizer holds the adapters and the new head, nothing else; the body is the base model's.
    adapters = [name for name in state if ".lora_" in name]
    assert adapters and all(".lora_A." in n or ".lora_B." in n for n in adapters)
    assert "score.weight" in state and not [n for n in adapters if n.startswith("score.")]  # the head: whole
    optimized = sum(len(group["params"]) for group in ckpt["optimizer_states"][0]["param_groups"])
    assert optimized == len(adapters) + 1  # + score.weight
    base = load_policy(ModelConfig())[0].state_dict()
    frozen = [name for name in state if ".lora_" not in name and not name.startswith("score.")]
    for name in frozen:
        torch.testing.assert_close(state[name], base[name.replace(".base_layer", "")], rtol=0, atol=0)
    assert all(state[n].abs().sum() > 0 for n in adapters if ".lora_B." in n)  # initialised at 0, trained

    # The exported directory is the merged model: W + (alpha / r) * B @ A, no adapter left.
    merged = load_file(result.model_dir / "model.safetensors")
    assert not [name for name in merged if "lora" in name]
    for name in [n for n in state if n.endswith(".base_layer.weight")]:
        layer = name.removesuffix(".base_layer.weight")
        lora_a, lora_b = (state[f"{layer}.lora_{part}.default.weight"] for part in "AB")
        expected = state[name] + 16 / 4 * lora_b @ lora_a  # model.lora_alpha / model.lora_rank
        torch.testing.assert_close(merged[f"{layer}.weight"], expected, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(merged["score.weight"], state["score.weight"], rtol=0, atol=0)

    # Plain transformers scores the held-out pairs as the run's evaluation did, and the loss it logged is the
    # Bradley-Terry loss plus the centering term, 0.5 * mean((r_chosen + r_rejected)^2), computed here by hand.
    model = AutoModelForSequenceClassification.from_pretrained(result.model_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(result.model_dir)
    pairs = preference_pairs("dataset", config.tree["data"]["task_kwargs"], RMConfig())
    chosen, rejected = logits_of(model, tokenizer, pairs["test"])
    assert (chosen > rejected).float().mean().item() == pytest.approx(result.metrics["rm/val_accuracy"], abs=1e-6)
    assert (chosen - rejected).mean().item() == pytest.approx(result.metrics["rm/val_margin"], rel=1e-4, abs=1e-6)
    bradley_terry = -torch.nn.functional.logsigmoid(chosen - rejected).mean().item()
    centering = 0.5 * (chosen + rejected).square().mean().item()
    assert centering > 1e-3  # the term is there to see: without it the loss below would not match
    assert result.metrics["rm/val_loss"] == pytest.approx(bradley_terry + centering, rel=1e-4)

    # The checkpoint of step 2, mid-run, exports its own reward model: transformers loads it and scores as that
    # checkpoint's model (its adapters unmerged, built as the run builds it) does, with its reward statistics.
    mid = result.run_dir / "checkpoints" / "epoch=0-step=2.ckpt"
    (out,) = lit_ppo.export(mid, tmp_path / "step2")
    exported = AutoModelForSequenceClassification.from_pretrained(out).eval()
    assert not torch.equal(load_file(out / "model.safetensors")["score.weight"], merged["score.weight"])
    cfg = ModelConfig(lora_rank=4)
    policy, own_tokenizer = load_policy(cfg)
    at_step_2 = add_lora(reward_model_from(policy, own_tokenizer), reward_model_lora(cfg))
    at_step_2.load_state_dict({name.removeprefix("reward_model."): value for name, value in torch.load(
        mid, map_location="cpu", weights_only=True)["state_dict"].items()})
    test = [tokenize_pair(own_tokenizer, pair, 1024) for pair in pairs["test"]]
    with torch.no_grad():
        for side in ("chosen_ids", "rejected_ids"):
            ids = [getattr(example, side) for example in test]
            for row in ids:  # one row at a time: no padding to agree on
                own = rewards(at_step_2.eval(), torch.tensor([row]), torch.ones(1, len(row), dtype=torch.long))
                plain = exported(input_ids=torch.tensor([row])).logits[:, 0]
                torch.testing.assert_close(plain, own, rtol=1e-4, atol=1e-5)
    train_chosen, train_rejected = logits_of(exported, AutoTokenizer.from_pretrained(out), pairs["train"])
    both = torch.cat([train_chosen, train_rejected])
    statistics = json.loads((out / "lit_ppo_model.json").read_text())["reward_statistics"]
    assert statistics["pairs"] == 16
    assert statistics["mean"] == pytest.approx(both.mean().item(), rel=1e-4, abs=1e-5)
    assert statistics["std"] == pytest.approx(both.std(unbiased=False).item(), rel=1e-4)

    # MLflow holds rm's metrics at its optimizer steps and its keys as the command line types them.
    db = tmp_path / "mlflow.db"
    with sqlite3.connect(db) as con:
        steps: dict[str, list[int]] = {}
        for key, step in con.execute("SELECT key, step FROM metrics ORDER BY step"):
            steps.setdefault(key, []).append(step)
        params = dict(con.execute("SELECT key, value FROM params"))
        tags = dict(con.execute("SELECT key, value FROM tags"))
    assert steps["rm/loss"] == [1, 2, 3, 4] and steps["rm/accuracy"] == [1, 2, 3, 4]
    assert all(steps[f"rm/val_{name}"] == [4] for name in ("loss", "accuracy", "margin", "reward_mean", "reward_std"))
    assert params["rm.center_rewards_coefficient"] == "0.5" and params["model.lora_rank"] == "4"
    assert tags["algo"] == "rm"
    # compare draws it by one of its metrics; by the default, a fit's reward, it says what the run logged.
    capsys.readouterr()
    compare(metric="rm/val_accuracy", output=str(tmp_path / "rm.png"), uri=f"sqlite:///{db}")
    assert (tmp_path / "rm.png").is_file()
    row = capsys.readouterr().out.splitlines()[2].split()
    assert row[:5] == [result.run_dir.name, row[1], "rm", "4", "-"]  # its steps, and no reward of a fit
    with pytest.raises(ConfigError, match=r"^--metric rollout/reward_mean: no selected run logged it; logged: .*"
                                          r"rm/val_accuracy"):
        compare(output=str(tmp_path / "fit.png"), uri=f"sqlite:///{db}")
