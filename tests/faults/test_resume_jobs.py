"""A resume is the run it continues, whichever job wrote it: a checkpoint is refused by the job that did not
write it (an sft run does not take an RL run's optimizer and schedule, nor fit an sft run's), in one line before
any model loads; a resume changes only the ``checkpoint.*`` keys it names, says so in lit_ppo's keys and goes
on writing ``last.ckpt`` (never ``last-v1.ckpt``); sft's resume checks what fit's does; a bad row of sft's data
is named by its file and line."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from lit_ppo.training.sft_data import SFTDataModule
from tests.faults.test_check_speed import assert_refused_quickly
from tests.integration.conftest import run_cli, run_here

pytestmark = pytest.mark.slow

FIT = ["logger=none", "data.batch_size=2", "gconfig.n_samples=2", "eval.max_problems=4",
       "trainer.enable_progress_bar=false"]
SFT = ["logger=none", "data=dataset", "data.task_kwargs.train_path=sums.jsonl", "sft.batch_size=4"]


def write_sums(path: Path, n: int = 24) -> None:
    rows = [{"prompt": f"{a}+{b}=", "completion": str(a + b)} for a in range(10) for b in range(6)][:n]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def step_of(path: Path) -> int:
    return torch.load(path, map_location="cpu", weights_only=True)["global_step"]


def notes(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("note: resuming with")]


@pytest.fixture
def here(monkeypatch, capfd):
    """``python -m lit_ppo <args>`` in ``cwd`` through its entry point in this process (``run_here``)."""
    return lambda args, cwd: run_here(args, cwd, monkeypatch, capfd)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """``last.ckpt`` of a GRPO fit (one iteration) and of an sft run (two steps), each made by the CLI."""
    cwd = tmp_path_factory.mktemp("jobs")
    write_sums(cwd / "sums.jsonl")
    for args in (["fit", *FIT, "trainer.max_steps=1"], ["sft", *SFT, "trainer.max_steps=2"]):
        result = run_cli(args, cwd)
        assert result.returncode == 0, result.stderr[-3000:]
    (fit,) = cwd.glob("runs/*/grpo-*/checkpoints/last.ckpt")
    (sft,) = cwd.glob("runs/*/sft-*/checkpoints/last.ckpt")
    return cwd, fit.relative_to(cwd), sft.relative_to(cwd)


@pytest.mark.parametrize("job, written_by", [("sft", "fit (algo=grpo)"), ("fit", "sft")])
def test_a_checkpoint_is_refused_by_the_job_that_did_not_write_it(checkpoints, job, written_by, here):
    cwd, fit, sft = checkpoints
    ckpt = sft if job == "fit" else fit
    before = sorted(p.relative_to(cwd) for p in cwd.rglob("*"))
    result = here([job, "logger=none", "actor.optimizer.lr=0.02", "--ckpt_path", str(ckpt)], cwd)
    assert result.returncode == 2, result.stderr[-3000:]
    assert result.stderr.splitlines() == [
        f"error: --ckpt_path {ckpt}: was written by {written_by}, not by {job}: {job} resumes only its own "
        f"checkpoints (the optimizer, schedule and data position are the job's); start {job} from its model "
        f"instead: python -m lit_ppo export --ckpt_path {ckpt} --output DIR, then python -m lit_ppo {job} model=DIR"]
    assert sorted(p.relative_to(cwd) for p in cwd.rglob("*")) == before  # nothing written, no model cached


def test_a_resume_that_changes_the_model_is_refused_as_soon_as_its_checkpoint_is_read(checkpoints):
    """The checkpoint's config is read, and compared with the command's, without Lightning (it took 5 s)."""
    cwd, fit, _ = checkpoints
    line = (f"error: model.source=smollm2 cannot change when resuming --ckpt_path {fit} (the run had tiny): its "
            f"weights, optimizer and prompt stream were made with it; resume without it, or start a new run")
    assert_refused_quickly(["fit", "model=smollm2", "--ckpt_path", str(fit)], cwd, line, reads_a_checkpoint=True)


@pytest.mark.parametrize("subcommand", ["validate", "test"])
def test_an_sft_checkpoint_is_refused_by_validate_and_test_naming_how_to_score_its_model(checkpoints, subcommand, here):
    cwd, _, sft = checkpoints
    result = here([subcommand, "--ckpt_path", str(sft)], cwd)
    assert result.returncode == 2, result.stderr[-3000:]
    assert result.stderr.splitlines() == [
        f"error: --ckpt_path {sft}: was written by sft, whose run has no task to score: {subcommand} scores fit's "
        f"checkpoints; score its model on a task instead: python -m lit_ppo export --ckpt_path {sft} --output DIR, "
        f"then python -m lit_ppo {subcommand} model=DIR"]


def test_sft_resume_refuses_what_its_batches_were_made_with_and_notes_a_changed_data_file(checkpoints, here):
    cwd, _, sft = checkpoints
    refused = here(["sft", *SFT[:-1], "sft.batch_size=8", "--ckpt_path", str(sft)], cwd)
    assert refused.returncode == 2, refused.stderr[-3000:]
    assert refused.stderr.splitlines() == [
        f"error: sft.batch_size=8 cannot change when resuming --ckpt_path {sft} (the run had 4): its batches and "
        f"their completions were made with it; resume without it, or start a new run"]
    # A changed file at the same path, a new learning rate: each said, the rate applied (0.002, twice the run's).
    data = cwd / "sums.jsonl"
    original = data.read_text()
    try:
        data.write_text(original.replace('"completion": "0"', '"completion": "zero"'))
        resumed = here(["sft", *SFT, "actor.optimizer.lr=0.002", "trainer.max_steps=3", "--ckpt_path", str(sft)],
                       cwd)
    finally:
        data.write_text(original)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert notes(resumed.stderr) == ["note: resuming with actor.optimizer.lr=0.002 (the run had 0.001)",
                                     "note: resuming with trainer.max_steps=3 (the run had 2)"]
    assert (f"note: --ckpt_path {sft}: data.task_kwargs.train_path=sums.jsonl changed since the checkpoint was "
            f"written (its SHA-256 differs): the resumed run trains on the changed data") in resumed.stderr
    assert re.search(r"^sft step 3/3 loss [\d.]+ lr 0\.002 ", resumed.stdout, re.M), resumed.stdout
    assert step_of(cwd / sft) == 3


def test_a_resume_changes_only_the_checkpoint_keys_it_names_and_goes_on_writing_last_ckpt(tmp_path, here):
    first = here(["fit", *FIT, "checkpoint.every_n_iterations=1", "trainer.max_steps=3"], tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    (last,) = tmp_path.glob("runs/*/*/checkpoints/last.ckpt")
    # checkpoint.keep alone: every iteration is still checkpointed, and the note names lit_ppo's key.
    from lit_ppo.launch.compose import compose
    from lit_ppo.launch.run import resume_fit

    overrides = [*FIT, "checkpoint.keep=5"]
    tree, _ = resume_fit(str(last), compose(overrides), overrides)
    (checkpoint,) = [c for c in tree["trainer"]["callbacks"] if c["class_path"].endswith("ModelCheckpoint")]
    assert (checkpoint["init_args"]["every_n_train_steps"], checkpoint["init_args"]["save_top_k"]) == (1, 5)
    # Every 2 iterations now, 2 kept, up to iteration 6: 4 and 6 are the run's checkpoints, last.ckpt holds 6.
    again = here(["fit", *FIT, "checkpoint.every_n_iterations=2", "checkpoint.keep=2", "trainer.max_steps=6",
                  "--ckpt_path", str(last)], tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    assert notes(again.stderr) == ["note: resuming with checkpoint.every_n_iterations=2 (the run had 1)",
                                   "note: resuming with checkpoint.keep=2 (the run had 3)",
                                   "note: resuming with trainer.max_steps=6 (the run had 3)"]
    assert sorted(p.name for p in last.parent.iterdir()) == ["epoch=0-step=4.ckpt", "epoch=0-step=6.ckpt",
                                                             "last.ckpt"]
    assert step_of(last) == 6


def test_a_bad_row_is_named_by_its_file_and_line(tmp_path, monkeypatch, here):
    monkeypatch.chdir(tmp_path)
    write_sums(tmp_path / "sums.jsonl", n=20)
    lines = (tmp_path / "sums.jsonl").read_text().splitlines()
    lines[13] = json.dumps({"prompt": "2+1=", "completion": 3})  # row 13: a number, not a completion
    lines.insert(5, "")  # a blank line before it: the row is on line 15 of the file
    (tmp_path / "sums.jsonl").write_text("\n".join(lines) + "\n")
    from lit_ppo.config.sft import SFTConfig

    # The held-out fraction shuffles which rows train: the message still names the line the user sees.
    with pytest.raises(ValueError) as error:
        SFTDataModule("dataset", {"train_path": "sums.jsonl", "test_fraction": 0.3, "seed": 1}, SFTConfig())
    assert str(error.value) == ("sums.jsonl line 15, column 'completion': int is not a string or a list of "
                                "assistant messages {role: assistant, content}")
    result = here(["sft", "logger=none", "data=dataset", "data.task_kwargs.train_path=sums.jsonl",
                   "data.task_kwargs.test_fraction=0.3"], tmp_path)
    assert result.returncode == 2 and result.stderr.splitlines()[-1] == f"error: {error.value}", result.stderr
