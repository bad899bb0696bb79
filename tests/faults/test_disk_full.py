"""A disk that fills up under the run directory: a checkpoint that cannot be written stops the run in
one line naming the file and the reason; the previous checkpoint is kept and no temporary file is left."""

from __future__ import annotations

import errno
import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from lit_ppo.errors import RunStopped
from lit_ppo.training.checkpoint_io import AtomicCheckpointIO
from tests.faults.filesystems import file_size_limit, limit_file_size, mounted_tmpfs, read_only_directory
from tests.integration.conftest import FAST, run_dir

pytestmark = pytest.mark.slow


def test_a_checkpoint_that_does_not_fit_stops_fit_in_one_line(tmp_path):
    from lit_ppo.models import load_causal_lm

    load_causal_lm("tiny", tmp_path / "cache")  # built here, with no limit
    (weights,) = (tmp_path / "cache").glob("tiny-*/model.safetensors")
    # Room for the config and the model's weights, not for a checkpoint, which holds the weights and
    # AdamW's two moments of each.
    limit = 2 * weights.stat().st_size
    result = subprocess.run([sys.executable, "-m", "lit_ppo", "fit", *FAST],
                            cwd=tmp_path, env={**os.environ, "LIT_PPO_CACHE": str(tmp_path / "cache")},
                            capture_output=True, text=True, timeout=300, preexec_fn=limit_file_size(limit))
    assert result.returncode == 1, result.stderr[-3000:]
    checkpoint = run_dir(tmp_path) / "checkpoints" / "last.ckpt"
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith(
        f"error: cannot write checkpoint {checkpoint}: {os.strerror(errno.EFBIG)} (no checkpoint was written)")
    assert "Traceback" not in result.stderr
    assert [line for line in result.stderr.splitlines() if "last.ckpt" in line] == errors  # nothing claims it
    assert not checkpoint.exists() and not [p for p in tmp_path.rglob("*") if ".tmp-" in p.name]


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def write_refused(target: Path) -> str:
    """Write a 4 MB checkpoint over ``target`` where that is refused; the RunStopped's message."""
    with pytest.raises(RunStopped) as stopped:
        AtomicCheckpointIO().save_checkpoint({"state_dict": {"w": torch.ones(2**20)}}, target)
    return str(stopped.value)


def test_a_refused_checkpoint_write_keeps_the_previous_one(tmp_path):
    target = tmp_path / "last.ckpt"
    AtomicCheckpointIO().save_checkpoint({"state_dict": {"w": torch.zeros(4)}}, target)
    before = sha256(target)
    with file_size_limit(2**16):
        message = write_refused(target)
    assert message == f"cannot write checkpoint {target}: {os.strerror(errno.EFBIG)} (the previous checkpoint is kept)"
    assert sha256(target) == before and sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt"]


def test_a_full_or_read_only_filesystem_refuses_the_checkpoint_in_one_line(tmp_path):
    with mounted_tmpfs(tmp_path / "small", "size=256k") as small:
        message = write_refused(small / "last.ckpt")
        assert message == (f"cannot write checkpoint {small / 'last.ckpt'}: {os.strerror(errno.ENOSPC)} "
                           f"(no checkpoint was written)")
        assert list(small.iterdir()) == []
    with read_only_directory(tmp_path / "ro") as ro:
        message = write_refused(ro / "checkpoints" / "last.ckpt")
        reason = os.strerror(errno.EROFS if os.geteuid() == 0 else errno.EACCES)
        assert message == (f"cannot write checkpoint {ro / 'checkpoints' / 'last.ckpt'}: {reason} "
                           f"(no checkpoint was written)")
