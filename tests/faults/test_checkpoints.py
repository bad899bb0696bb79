"""Checkpoint integrity: atomic writes under SIGKILL, no non-finite checkpoint, refused resumes."""

from __future__ import annotations

import hashlib
import math
import os
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

import lightning as L
import pytest
import torch
import yaml
from lightning.pytorch.plugins.io import AsyncCheckpointIO, TorchCheckpointIO

from lit_ppo.cli.fit import ckpt_path_arg
from lit_ppo.run.resume import check_resume
from lit_ppo.training.checkpoint_files import DIGEST_KEY, scan
from lit_ppo.training.checkpoint_io import AtomicCheckpointIO, install_checkpoint_io
from lit_ppo.training.record import RECORD_KEY

KILL_WRITER = Path(__file__).with_name("kill_writer.py")
REPO = Path(__file__).resolve().parents[2]
# The CLI on the tiny model with small batches: seconds per iteration on 2 cores.
ARGS = ["logger=none", "data.batch_size=4", "gconfig.n_samples=4", "trainer.enable_progress_bar=false",
        "eval.max_problems=4"]
BIG_NUMEL = 64 * 2**20
"""float32 elements of the checkpoint that gets killed while it is written (256 MiB: a copy of it
takes long enough to be caught in the middle)."""


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def temp_files(directory: Path) -> list[Path]:
    return sorted(p for p in directory.iterdir() if ".tmp-" in p.name)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A real checkpoint: one GRPO iteration of the tiny model through the CLI (its presets' trainer)."""
    root = tmp_path_factory.mktemp("checkpoints")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LIT_PPO_CACHE", str(root / "cache"))
        from lit_ppo.cli.fit import main as run

        assert run(["fit", *ARGS, "trainer.max_steps=1", f"trainer.default_root_dir={root / 'run'}"]) == 0
        yield root


@pytest.fixture(scope="module")
def good(run_dir) -> Path:
    (last,) = (run_dir / "run").rglob("last.ckpt")
    return last


@pytest.fixture(scope="module")
def tree():
    """LightningCLI's tree of the run that made ``good``."""
    from lit_ppo.launch.compose import compose

    return compose(ARGS + ["trainer.max_steps=1"])


def load(path: Path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=True)


# ---------------------------------------------------------------------------------------------
# (a) a real SIGKILL during the write, $TMPDIR on another filesystem
# ---------------------------------------------------------------------------------------------

def other_filesystem(path: Path) -> Path | None:
    device = path.stat().st_dev
    for candidate in ("/dev/shm", tempfile.gettempdir(), "/var/tmp", "/tmp", str(Path.home())):
        c = Path(candidate)
        if c.is_dir() and os.access(c, os.W_OK) and c.stat().st_dev != device:
            return c
    return None


def kill_during_second_write(kind: str, target: Path, tmpdir: Path) -> str:
    """Start the writer, wait for its first checkpoint, SIGKILL it while the second is being written;
    returns the digest of the first checkpoint file."""
    child = subprocess.Popen([sys.executable, str(KILL_WRITER), kind, str(target), str(BIG_NUMEL)], cwd=REPO,
                             env={**os.environ, "TMPDIR": str(tmpdir)}, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        first_digest, first_size = sha256(target), target.stat().st_size
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and child.poll() is None:
            if kind == "atomic":
                writing = any(p.stat().st_size > 0 for p in temp_files(target.parent))
            else:  # Lightning's default rewrites the destination in place once its TMPDIR copy is done
                writing = target.stat().st_size != first_size
            if writing:
                child.send_signal(signal.SIGKILL)
                break
        assert child.wait(timeout=60) == -signal.SIGKILL, "the writer finished before it could be killed"
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    return first_digest


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["atomic", "lightning"])
def test_sigkill_during_write_keeps_the_previous_checkpoint(tmp_path, kind):
    """The atomic writer keeps the good checkpoint intact; Lightning's default, with $TMPDIR on
    another filesystem, loses it (so this test can fail)."""
    tmpdir = other_filesystem(tmp_path)
    if tmpdir is None:
        pytest.skip("no second writable filesystem for $TMPDIR")
    tmpdir = Path(tempfile.mkdtemp(dir=tmpdir, prefix="lit_ppo_tmpdir_"))
    target = tmp_path / "last.ckpt"
    try:
        first_digest = kill_during_second_write(kind, target, tmpdir)
        if kind == "lightning":
            assert sha256(target) != first_digest
            with pytest.raises(Exception):
                load(target)
            return
        assert sha256(target) == first_digest
        torch.testing.assert_close(load(target)["state_dict"]["w"], torch.arange(1000, dtype=torch.float32))
        (partial,) = temp_files(tmp_path)  # killed mid-write: the temporary file is shorter than the tensor
        assert 0 < partial.stat().st_size < BIG_NUMEL * 4
        # The next successful save of that checkpoint removes what the killed writer left.
        AtomicCheckpointIO().save_checkpoint({"state_dict": {"w": torch.zeros(3)}}, target)
        assert temp_files(tmp_path) == [] and load(target)["state_dict"]["w"].tolist() == [0.0, 0.0, 0.0]
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)
        for p in tmp_path.iterdir():
            p.unlink()


# ---------------------------------------------------------------------------------------------
# (b) nothing non-finite is ever written; failed writes leave nothing behind
# ---------------------------------------------------------------------------------------------

NON_FINITE_AT = {
    "state_dict.policy.model.layers.0.mlp.up_proj.weight":
        lambda c: c["state_dict"]["policy.model.layers.0.mlp.up_proj.weight"],
    "optimizer_states[0].state.3.exp_avg": lambda c: c["optimizer_states"][0]["state"][3]["exp_avg"],
}
"""Key path in the refusal -> where that tensor is in a checkpoint."""


@pytest.mark.parametrize("key", list(NON_FINITE_AT))
@pytest.mark.parametrize("value", [math.nan, math.inf])
def test_non_finite_state_is_never_written(good, tmp_path, key, value):
    target = tmp_path / "last.ckpt"
    shutil.copy(good, target)
    before = sha256(target)
    checkpoint = load(good)
    NON_FINITE_AT[key](checkpoint).view(-1)[0] = value
    with pytest.raises(RuntimeError) as error:
        AtomicCheckpointIO().save_checkpoint(checkpoint, target)
    message = str(error.value)
    assert "\n" not in message and str(target) in message and f": {key} is non-finite" in message
    assert sha256(target) == before and temp_files(tmp_path) == []


def test_infinite_callback_state_is_allowed(tmp_path):
    """ModelCheckpoint / EarlyStopping keep +-inf as 'no score yet': only weights and optimizer state count."""
    AtomicCheckpointIO().save_checkpoint({"state_dict": {"w": torch.ones(2)},
                                          "callbacks": {"ModelCheckpoint": {"kth_value": torch.tensor(math.inf)}}},
                                         tmp_path / "a.ckpt")
    assert load(tmp_path / "a.ckpt")[DIGEST_KEY]


def test_failed_write_leaves_no_temporary_file_and_keeps_the_checkpoint(tmp_path):
    target = tmp_path / "last.ckpt"
    io = AtomicCheckpointIO()
    io.save_checkpoint({"state_dict": {"w": torch.ones(2)}}, target)
    before = sha256(target)
    with pytest.raises(Exception):  # a lambda does not pickle: torch.save fails halfway through the file
        io.save_checkpoint({"state_dict": {"w": torch.ones(2)}, "hook": lambda: None}, target)
    assert sha256(target) == before and temp_files(tmp_path) == []


def test_written_checkpoint_has_its_digest_and_the_usual_mode(tmp_path):
    target = tmp_path / "sub" / "epoch=0-step=1.ckpt"  # the directory is created; glob characters are fine
    AtomicCheckpointIO().save_checkpoint({"state_dict": {"w": torch.ones(2)}, "step": 1}, target)
    loaded = load(target)
    assert loaded[DIGEST_KEY] == scan(loaded).digest
    umask = os.umask(0)
    os.umask(umask)
    assert target.stat().st_mode & 0o777 == 0o666 & ~umask
    assert temp_files(target.parent) == []


def test_a_users_trainer_gets_the_atomic_writer_and_never_saves_nan(run_dir, tmp_path):
    """LitPPO installs the writer in a user's own L.Trainer; NaN weights never reach the checkpoint."""
    from lit_ppo.config import GenerationConfig, ModelConfig, PPOActorConfig
    from lit_ppo.training.datamodule import RolloutDataModule
    from lit_ppo.training.module import LitPPO

    module = LitPPO(ModelConfig(cache_dir=str(run_dir / "cache")), PPOActorConfig(kl_ctl=0.0), algo="grpo")
    data = RolloutDataModule(batch_size=2, gconfig=GenerationConfig(n_samples=2, max_new_tokens=2,
                                                                    restrict_to_task_tokens=True))
    trainer = L.Trainer(accelerator="cpu", devices=1, max_steps=1, logger=False, enable_progress_bar=False,
                        enable_model_summary=False, enable_checkpointing=False, default_root_dir=tmp_path)
    trainer.fit(module, datamodule=data)
    assert type(trainer.strategy.checkpoint_io) is AtomicCheckpointIO
    target = tmp_path / "last.ckpt"
    trainer.save_checkpoint(target)
    before = sha256(target)
    assert load(target)[RECORD_KEY]["algo"] == "grpo"
    with torch.no_grad():
        module.policy.model.layers[1].self_attn.o_proj.weight[0, 0] = math.nan
    with pytest.raises(RuntimeError) as error:
        trainer.save_checkpoint(target)
    assert f"{target}: state_dict.policy.model.layers.1.self_attn.o_proj.weight is non-finite" in str(error.value)
    assert sha256(target) == before


class OwnIO(TorchCheckpointIO):
    """A user's own checkpoint IO."""


def test_install_respects_a_users_checkpoint_io():
    def io_after_install(**kwargs):
        strategy = L.Trainer(accelerator="cpu", devices=1, logger=False, **kwargs).strategy
        install_checkpoint_io(strategy)
        return strategy.checkpoint_io

    assert type(io_after_install()) is AtomicCheckpointIO
    assert type(io_after_install(plugins=[OwnIO()])) is OwnIO
    wrapped = io_after_install(plugins=[AsyncCheckpointIO()])
    assert type(wrapped) is AsyncCheckpointIO and type(wrapped.checkpoint_io) is AtomicCheckpointIO
    wrapped = io_after_install(plugins=[AsyncCheckpointIO(OwnIO())])
    assert type(wrapped.checkpoint_io) is OwnIO


# ---------------------------------------------------------------------------------------------
# (c) resuming: refused before any model loads, one line naming the file
# ---------------------------------------------------------------------------------------------

def refusal(path, tree) -> str:
    with pytest.raises(ValueError) as error:
        check_resume(str(path), tree)
    message = str(error.value)
    assert "\n" not in message and message.startswith(f"--ckpt_path {path}: "), message
    return message


def flip_a_weight_bit(src: Path, dst: Path) -> None:
    """Flip the lowest mantissa bit of one float32 in the largest tensor record (stays finite)."""
    data = bytearray(src.read_bytes())
    with zipfile.ZipFile(src) as archive:
        record = max(archive.infolist(), key=lambda info: info.file_size)
    name_len, extra_len = struct.unpack("<HH", data[record.header_offset + 26:record.header_offset + 30])
    start = record.header_offset + 30 + name_len + extra_len  # stored (uncompressed) bytes follow the header
    data[start + 4 * (record.file_size // 8)] ^= 0x01
    dst.write_bytes(bytes(data))


def test_good_checkpoint_of_the_same_run_is_accepted(good, tree):
    check_resume(str(good), tree)
    for special in ("last", "best", "hpc", "registry:latest"):  # resolved by Lightning itself, later
        check_resume(special, tree)


def test_missing_directory_and_unreadable_are_refused(good, tree, tmp_path):
    assert refusal(tmp_path / "nope.ckpt", tree).endswith(": no such file")
    assert "is a directory" in refusal(tmp_path, tree)
    unreadable = tmp_path / "locked.ckpt"
    shutil.copy(good, unreadable)
    unreadable.chmod(0)
    try:
        if os.access(unreadable, os.R_OK):
            pytest.skip("this user (root) reads files whatever their mode")
        assert "is not readable" in refusal(unreadable, tree)
    finally:
        unreadable.chmod(0o600)


def test_truncated_checkpoint_is_refused(good, tree, tmp_path):
    truncated = tmp_path / "truncated.ckpt"
    truncated.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    assert "cannot be loaded" in refusal(truncated, tree)
    empty = tmp_path / "empty.ckpt"
    empty.touch()
    assert "cannot be loaded" in refusal(empty, tree)


def test_bit_flipped_weight_is_refused_by_its_digest(good, tree, tmp_path):
    flipped = tmp_path / "flipped.ckpt"
    flip_a_weight_bit(good, flipped)
    # torch.load does not notice: one weight changed, everything still finite.
    a, b = load(good)["state_dict"], load(flipped)["state_dict"]
    assert sum(int((a[k] != b[k]).sum()) for k in a) == 1
    assert "does not match its digest" in refusal(flipped, tree)
    with pytest.raises(RuntimeError, match=f"checkpoint {flipped} content does not match its digest"):
        AtomicCheckpointIO().load_checkpoint(flipped)  # a resume that does not go through the CLI


def test_nan_weights_are_refused(good, tree, tmp_path):
    checkpoint = load(good)
    checkpoint["state_dict"]["policy.model.embed_tokens.weight"][2, 3] = math.nan
    checkpoint[DIGEST_KEY] = scan(checkpoint).digest  # a consistent digest: finiteness is checked on its own
    nan = tmp_path / "nan.ckpt"
    torch.save(checkpoint, nan)
    assert refusal(nan, tree).endswith("holds a non-finite tensor at state_dict.policy.model.embed_tokens.weight")


def test_checkpoint_of_a_different_run_lists_the_differing_keys(good, tree, tmp_path):
    other = {**tree, "model": {**tree["model"], "algo": "ppo"},
             "data": {**tree["data"], "task_kwargs": {"seed": 3, "max_operand": 5}}}
    message = refusal(good, other)
    assert ("was made with a different run: algo ('grpo' in the checkpoint, 'ppo' in this run); "
            "task.seed (0 in the checkpoint, 3 in this run); task.max_operand (9 in the checkpoint, 5 in this run)"
            in message)
    model_dir = tmp_path / "my_model"
    model_dir.mkdir()
    other = {**tree, "model": {**tree["model"], "model": {"source": str(model_dir)}}}
    assert f"model ('tiny' in the checkpoint, '{model_dir.resolve()}' in this run)" in refusal(good, other)
    other = {**tree, "data": {**tree["data"], "task": "calculator", "task_kwargs": {}}}
    assert ("task ('lit_ppo.tasks.arithmetic.ArithmeticTask' in the checkpoint, "
            "'lit_ppo.tasks.calculator.CalculatorTask' in this run)") in refusal(good, other)


def test_checkpoint_not_written_by_lit_ppo_is_refused(good, tree, tmp_path):
    checkpoint = load(good)
    del checkpoint[RECORD_KEY], checkpoint[DIGEST_KEY]
    plain = tmp_path / "plain.ckpt"
    torch.save(checkpoint, plain)
    assert "was not written by lit_ppo" in refusal(plain, tree)


def test_ckpt_path_is_found_in_flags_and_config():
    assert ckpt_path_arg(["--ckpt_path", "a.ckpt"]) == "a.ckpt"
    assert ckpt_path_arg(["--trainer.max_steps", "3", "--ckpt_path=b.ckpt"]) == "b.ckpt"
    assert ckpt_path_arg(["--print_config"], {"ckpt_path": "c.ckpt"}) == "c.ckpt"
    assert ckpt_path_arg(["--ckpt_path", "a.ckpt", "--ckpt_path=b.ckpt"]) == "b.ckpt"  # the last one wins
    assert ckpt_path_arg([], {"ckpt_path": None}) is None and ckpt_path_arg(["--ckpt_path=null"]) is None


@pytest.mark.slow
def test_cli_refuses_before_a_model_loads_and_resumes_a_good_checkpoint(good, tree, run_dir, tmp_path, monkeypatch,
                                                                         capsys):
    from lit_ppo.cli.fit import main as run
    from lit_ppo.models import policy

    monkeypatch.setenv("LIT_PPO_CACHE", str(run_dir / "cache"))
    truncated = tmp_path / "truncated.ckpt"
    truncated.write_bytes(good.read_bytes()[:1000])
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(tree, sort_keys=False))

    def no_model(*args, **kwargs):
        raise AssertionError("a model was loaded before the checkpoint was checked")

    with monkeypatch.context() as patch:
        patch.setattr(policy, "load_causal_lm", no_model)
        assert run(["fit", *ARGS, "algo=ppo", "--ckpt_path", str(good)]) == 2
        assert capsys.readouterr().err.strip().startswith(
            f"error: algo=ppo cannot change when resuming --ckpt_path {good} (the run had grpo): ")
        assert run(["fit", "--config", str(config), f"--ckpt_path={truncated}"]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"error: --ckpt_path {truncated}: cannot be loaded") and "\n" not in err
    # A run of its own to resume: the resume continues the checkpoint's run directory (good's stays as it is).
    out = tmp_path / "runs"
    assert run(["fit", *ARGS, "trainer.max_steps=1", f"trainer.default_root_dir={out}"]) == 0
    (first,) = out.rglob("last.ckpt")
    assert run(["fit", *ARGS, "trainer.max_steps=2", f"trainer.default_root_dir={tmp_path / 'elsewhere'}",
                "--ckpt_path", str(first)]) == 0
    (last,) = out.rglob("last.ckpt")
    assert last == first and not (tmp_path / "elsewhere").exists()
    resumed = load(last)
    assert resumed["global_step"] == 2 and resumed["policy_version"] == 2
    assert resumed[RECORD_KEY]["run"] == {"dir": str(first.parents[1].resolve())}  # logger=none: no MLflow run
