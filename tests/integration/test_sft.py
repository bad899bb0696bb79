"""``python -m lit_ppo sft`` through the command line: the tiny model fine-tuned on a file of prompts and
completions (its held-out loss falls), its run directory (config, last.ckpt, model/), ``fit model=<dir>``
starting from that model, ``export`` reading its checkpoint, and every bad input as one line before any
model loads."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from tests.integration.conftest import FAST, reap

pytestmark = pytest.mark.slow


def write_sums(path, n: int = 60) -> None:
    rows = [{"prompt": f"{a}+{b}=", "completion": str(a + b)} for a in range(10) for b in range(6)][:n]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


@pytest.fixture(scope="module")
def sft_run(tmp_path_factory):
    """One tiny sft run, in a real process: (working directory, CompletedProcess)."""
    from tests.integration.conftest import run_cli

    cwd = tmp_path_factory.mktemp("sft")
    write_sums(cwd / "sums.jsonl")
    result = run_cli(["sft", "logger=none", "data=dataset", "data.task_kwargs.train_path=sums.jsonl",
                      "data.task_kwargs.test_fraction=0.2", "sft.epochs=4", "actor.optimizer.lr=3e-3"], cwd)
    return cwd, result


def test_sft_learns_the_completions_and_leaves_a_model_that_fit_starts_from(sft_run, cli_here):
    cwd, result = sft_run
    assert result.returncode == 0, result.stderr[-3000:]
    losses = [float(v) for v in re.findall(r"^sft epoch \d val_loss ([\d.]+)$", result.stdout, re.M)]
    assert len(losses) == 4 and losses[-1] < 0.8 * losses[0], result.stdout  # held-out completions, not trained on
    (run,) = (cwd / "runs").glob("*/sft-dataset-tiny-*")
    assert (run / "config.yaml").is_file() and (run / "checkpoints" / "last.ckpt").is_file()
    assert not [line for line in result.stdout.splitlines() + result.stderr.splitlines() if "Loading weights" in line]
    # The model directory holds the trained policy: what the checkpoint holds.
    state = torch.load(run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)["state_dict"]
    exported = load_file(run / "model" / "model.safetensors")
    for name, value in exported.items():
        torch.testing.assert_close(value, state[f"policy.{name}"])
    cli_here.cwd.joinpath("runs").mkdir()
    started = cli_here("fit", f"model={run / 'model'}", *FAST, "trainer.max_steps=1")
    assert started.returncode == 0, started.stderr[-3000:]


def summary_rows(text: str) -> dict[str, str]:
    """The rows of a run summary block (``  <label padded to 15><value>``), by label."""
    lines = text.splitlines()
    assert lines[0] == "run summary", text
    return {line[2:17].strip(): line[17:] for line in lines[1:]}


def test_sft_reports_as_fit_does_progress_on_stdout_and_a_summary_in_summary_txt(sft_run):
    cwd, result = sft_run
    (run,) = (cwd / "runs").glob("*/sft-dataset-tiny-*")
    # 48 training examples (60 rows less the fifth held out), 8 a step: 6 steps an epoch, 24 in 4 epochs. Stdout
    # is no terminal: a plain line every tenth of the run (every 2 steps), as fit's every iteration.
    steps = re.findall(r"^sft step (\d+)/24 loss [\d.]+ lr 0\.003 eta \d:\d\d:\d\d$", result.stdout, re.M)
    assert steps == [str(i) for i in range(2, 25, 2)], result.stdout
    assert not re.search(r"^sft (step|epoch)", result.stderr, re.M)
    summary = result.stdout[result.stdout.index("run summary\n"):]
    assert (run / "summary.txt").read_text() == summary
    rows = summary_rows(summary)
    shown = run.relative_to(cwd)
    assert list(rows) == ["steps", "loss", "val_loss", "run directory", "checkpoint", "model", "fit from model"]
    assert re.fullmatch(r"24 of 24 \(24 in \d+ (min \d+ )?s\)", rows["steps"]), rows["steps"]
    first, last = map(float, re.fullmatch(r"([\d.]+) \(step 1\) -> ([\d.]+) \(step 24\)", rows["loss"]).groups())
    assert last < first
    val_loss = float(re.findall(r"^sft epoch 4 val_loss ([\d.]+)$", result.stdout, re.M)[0])
    assert rows["val_loss"].endswith(" (step 24)") and float(rows["val_loss"].split()[0]) == pytest.approx(
        val_loss, abs=1e-3)
    assert rows["run directory"] == str(shown) and rows["checkpoint"] == f"{shown}/checkpoints/last.ckpt"
    assert rows["model"] == f"{shown}/model (a Hugging Face model directory)"
    assert rows["fit from model"] == f"python -m lit_ppo fit model={shown}/model"


def test_the_fit_that_sft_offers_learns_from_its_model(sft_run, cli_here):
    """SFT then RL: the fit command that the summary of the tiny model's sft offers, run as printed (shrunk, the
    path taken from sft's working directory), raises the model's accuracy on the task's test split. The model
    directory records the tiny model as its base, so the fit trains with the tiny model's settings (lr 1e-3,
    entropy bonus 0.01); a real model's (lr 1e-6) would leave the accuracy where it was."""
    from lit_ppo.launch.compose import compose, real_model_note
    from tests.integration.test_evaluation import printed_scores

    cwd, result = sft_run
    fit, given = re.search(r"^  fit from model python -m lit_ppo (fit) model=(\S+)$", result.stdout, re.M).groups()
    model = f"model={cwd / given}"
    tree = compose([model])
    assert (tree["model"]["actor"]["optimizer"]["lr"], tree["model"]["actor"]["entropy_coef"]) == (1e-3, 0.01)
    assert real_model_note(tree) is None
    scoring = ["eval.k=0", "eval.max_problems=200"]  # greedy, on the whole test split of 200 problems
    before = cli_here("validate", model, *scoring)
    assert before.returncode == 0, before.stderr[-3000:]
    untrained = printed_scores(before.stdout)["eval/accuracy"]
    # 10 iterations of the task's own batch: 0.06 -> 0.16 measured, against 0.06 -> 0.06 at lr 1e-6.
    after = cli_here(fit, model, "logger=none", *scoring, "trainer.max_steps=10")
    assert after.returncode == 0, after.stderr[-3000:]
    trained = float(re.search(r"^eval at iteration 10: accuracy ([\d.]+)", after.stdout, re.M).group(1))
    assert trained >= untrained + 0.05, (untrained, trained)  # at least 10 more of the 200 problems solved


@pytest.mark.parametrize("args, line", [
    (["data=dataset", "data.task_kwargs.train_path=sums.jsonl", "sft.epoch=2"],
     "error: sft.epoch is not a key (did you mean sft.epochs?); allowed: batch_size, completion_key, "
     "completion_template, epochs, max_length, shuffle"),
    (["data=dataset", "data.task_kwargs.train_path=sums.jsonl", "sft.epochs=0"],
     "error: sft.epochs=0 is invalid: must be a positive integer"),
    (["data=dataset", "data.task_kwargs.train_path=sums.jsonl", "sft.completion_key=answer"],
     "error: sums.jsonl line 1 has no completion: give a 'answer' column (sft.completion_key; its columns: "
     "completion), assistant messages in its prompt, or sft.completion_template (e.g. '<answer>{answer}</answer>')"),
    (["data=dataset"], "error: data.task_kwargs.train_path is required: give data.task_kwargs.train_path=<value>"),
    (["data=dataset", "data.task_kwargs.train_path=missing.jsonl"],
     "error: data.task_kwargs.train_path='missing.jsonl': no such file or directory"),
    (["sft.max_length=3"], "error: data.task=arithmetic problems('train')[0] has no completion"),
    (["data=dataset", "data.task_kwargs.train_path=sums.jsonl", "trainer=fsdp"],
     "error: trainer.strategy="),
    (["data=dataset", "data.task_kwargs.train_path=sums.jsonl", "scheduler=slurm"],
     "error: sft runs in this process: the scheduler group (scheduler=slurm, scheduler=ray) is fit's"),
    (["data=dataset", "data.task_kwargs.train_path=sums.jsonl", "--print_config"],
     "error: sft takes key=value overrides and --ckpt_path, not --print_config: usage: python -m lit_ppo sft "
     "[group=option ...] [key=value ...] [sft.key=value ...] [--ckpt_path CKPT]"),
    (["data=dataset", "data.task_kwargs.train_path=sums.jsonl", "--ckpt_path", "nowhere.ckpt"],
     "error: --ckpt_path nowhere.ckpt: no such file"),
])
def test_bad_sft_input_is_one_line_before_any_model_loads(cli_here, args, line):
    write_sums(cli_here.cwd / "sums.jsonl")
    result = cli_here("sft", "logger=none", *args)
    assert result.returncode == 2, result.stderr[-2000:]
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(line), last
    assert not (cli_here.cwd / "runs").exists() and not (cli_here.cwd / "cache").exists()


def test_sigterm_ends_the_step_writes_last_ckpt_exits_143_and_the_printed_resume_finishes_the_run(tmp_path):
    write_sums(tmp_path / "sums.jsonl")
    args = [sys.executable, "-m", "lit_ppo", "sft", "logger=none", "data=dataset",
            "data.task_kwargs.train_path=sums.jsonl", "sft.epochs=8", "sft.batch_size=4"]  # 120 steps
    env = {**os.environ, "LIT_PPO_CACHE": str(tmp_path / "cache")}
    proc = subprocess.Popen(args, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        seen = ""
        while "sft step 12/120" not in seen:  # a line per tenth of the run: it is training
            line = proc.stdout.readline()
            assert line, seen[-3000:]
            seen += line
        proc.send_signal(signal.SIGTERM)
        err, _ = proc.communicate(timeout=300)  # stdout and stderr, from the signal on
    finally:
        reap(proc)
    assert proc.returncode == 143 and "Traceback" not in err, err[-3000:]
    (ckpt,) = tmp_path.glob("runs/*/*/checkpoints/last.ckpt")
    step = torch.load(ckpt, map_location="cpu", weights_only=True)["global_step"]
    assert 12 <= step < 120
    assert f"received SIGTERM: finishing iteration {step}, then writing last.ckpt" in err
    resume = re.search(r"resume with (--ckpt_path \S+)", err).group(1).split()
    assert resume[1] == str(ckpt.absolute()) or resume[1] == str(ckpt.relative_to(tmp_path))
    # The summary of the stopped run offers the command that finishes it: the checkpoint alone, as fit's does.
    offered = summary_rows(err[err.index("run summary\n"):])["resume"]
    assert offered == f"python -m lit_ppo sft --ckpt_path {ckpt.relative_to(tmp_path)}"
    done = subprocess.run([sys.executable, *offered.split()[1:]], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "sft step 120/120" in done.stdout
    # As a fit's, the resumed run goes on in its own run directory.
    assert re.search(r"run directory: (\S+)", done.stderr).group(1) == str(ckpt.parent.parent.relative_to(tmp_path))
    (final,) = tmp_path.glob("runs/*/*/checkpoints/last.ckpt")
    assert torch.load(final, map_location="cpu", weights_only=True)["global_step"] == 120
    # Nothing is lost: the resumed run ends with the weights of a run that was never stopped.
    whole = tmp_path / "whole"
    whole.mkdir()
    write_sums(whole / "sums.jsonl")
    assert subprocess.run(args, cwd=whole, env=env, capture_output=True, timeout=600).returncode == 0
    (uninterrupted,) = whole.glob("runs/*/*/checkpoints/last.ckpt")
    resumed = torch.load(final, map_location="cpu", weights_only=True)["state_dict"]
    for name, value in torch.load(uninterrupted, map_location="cpu", weights_only=True)["state_dict"].items():
        torch.testing.assert_close(resumed[name], value, rtol=0, atol=0)


def test_sft_under_ddp_splits_the_examples_between_two_ranks(cli):
    write_sums(cli.cwd / "sums.jsonl", n=40)
    result = cli("sft", "logger=none", "trainer=ddp", "data=dataset", "data.task_kwargs.train_path=sums.jsonl",
                 "sft.epochs=2", timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    # 40 examples, 8 per rank and step on each of 2 ranks: 3 steps an epoch; one line each, from rank 0.
    assert re.findall(r"^sft step (\d+)/6 ", result.stdout, re.M) == [str(i) for i in range(1, 7)]
    assert (next((cli.cwd / "runs").glob("*/*")) / "model" / "model.safetensors").is_file()
