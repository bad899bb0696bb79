"""Distributed checkpoint directories (trainer=fsdp): verified like single files, published whole,
refused before writing when a shard is non-finite; a loaded checkpoint's learning rates rescaled."""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from lit_ppo.training.checkpoint_files import (
    DIGEST_KEY,
    DISTRIBUTED_META,
    SHARDS_KEY,
    distributed_checkpoint_problem,
    first_non_finite,
    read_checkpoint,
    scale_lr,
    write_meta,
)
from lit_ppo.utils.fs import file_sha256, remove_stale_directories, replace_directory, temporary_directory


def write_distributed(path, weight: torch.Tensor, step: int = 3) -> None:
    """A distributed checkpoint as FSDP2Strategy writes one, from this single process."""
    tmp = temporary_directory(path)
    dcp.save({"state_dict": {"policy.w": weight}}, checkpoint_id=tmp, no_dist=True)
    shards = {name: file_sha256(os.path.join(tmp, name)) for name in sorted(os.listdir(tmp))}
    write_meta({"global_step": step, "lit_ppo": {"algo": "grpo"}}, shards, os.path.join(tmp, DISTRIBUTED_META))
    replace_directory(tmp, path)


def test_a_written_checkpoint_reads_back_verified(tmp_path):
    path = tmp_path / "last.ckpt"
    write_distributed(path, torch.arange(6.0))
    meta = read_checkpoint(str(path))
    assert meta["global_step"] == 3 and meta["lit_ppo"] == {"algo": "grpo"}
    assert set(meta[SHARDS_KEY]) == {f for f in os.listdir(path) if f != DISTRIBUTED_META} and DIGEST_KEY in meta
    loaded = {"state_dict": {"policy.w": torch.zeros(6)}}
    dcp.load(loaded, checkpoint_id=str(path), no_dist=True)
    assert torch.equal(loaded["state_dict"]["policy.w"], torch.arange(6.0))


def test_replacing_publishes_the_new_directory_whole_and_drops_the_old(tmp_path):
    path = tmp_path / "last.ckpt"
    write_distributed(path, torch.zeros(4), step=1)
    write_distributed(path, torch.ones(4), step=2)
    assert read_checkpoint(str(path))["global_step"] == 2
    assert sorted(os.listdir(tmp_path)) == ["last.ckpt"]  # neither a temporary nor the old directory is left


def test_stale_directories_of_killed_writers_are_removed(tmp_path):
    path = tmp_path / "last.ckpt"
    for stale in ("last.ckpt", ".last.ckpt.tmp-1234", ".last.ckpt.old-5678", ".other.ckpt.tmp-1"):
        (tmp_path / stale).mkdir()
    remove_stale_directories(path)
    assert sorted(os.listdir(tmp_path)) == [".other.ckpt.tmp-1", "last.ckpt"]


@pytest.mark.parametrize("damage, message", [
    ("flip_shard", "does not match its digest (it was corrupted after it was written)"),
    ("drop_shard", "is incomplete: shard file"),
    ("truncate_meta", f"cannot be loaded, its {DISTRIBUTED_META} is truncated"),
    ("edit_meta", f"{DISTRIBUTED_META}: content does not match its digest"),
])
def test_damage_is_found_and_named_in_one_line(tmp_path, damage, message):
    path = tmp_path / "last.ckpt"
    write_distributed(path, torch.arange(64.0))
    shard = next(p for p in path.iterdir() if p.suffix == ".distcp")
    meta = path / DISTRIBUTED_META
    if damage == "flip_shard":
        data = bytearray(shard.read_bytes())
        data[-10] ^= 0x04
        shard.write_bytes(bytes(data))
    elif damage == "drop_shard":
        shard.unlink()
    elif damage == "truncate_meta":
        meta.write_bytes(meta.read_bytes()[:100])
    else:
        content = torch.load(meta, weights_only=True)
        content["global_step"] = 99  # a changed value under the old digest
        torch.save(content, meta)
    assert message in distributed_checkpoint_problem(path)
    with pytest.raises(ValueError) as error:
        read_checkpoint(str(path))
    assert str(error.value).startswith(f"--ckpt_path {path}: ") and message in str(error.value)
    assert "\n" not in str(error.value)


def test_a_save_killed_between_its_renames_names_the_previous_checkpoint(tmp_path):
    path = tmp_path / "last.ckpt"
    write_distributed(path, torch.zeros(4))
    os.rename(path, tmp_path / ".last.ckpt.old-abcd")  # the first rename of replace_directory happened
    with pytest.raises(ValueError, match=r"interrupted save left the previous checkpoint at .*\.last\.ckpt\.old-abcd"):
        read_checkpoint(str(path))


def test_first_non_finite_names_the_local_shard_of_a_dtensor(tmp_path):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    owned = not dist.is_initialized()  # an in-process engine (vLLM) of an earlier test may have made one
    if owned:
        dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cpu", (dist.get_world_size(),))
        finite = distribute_tensor(torch.ones(4, 2), mesh, [Shard(0)])
        broken = distribute_tensor(torch.tensor([[1.0, float("nan")]]), mesh, [Shard(0)])
        sections = {"state_dict": {"policy.a": finite}, "optimizer_states": [{"state": {0: {"exp_avg": broken}}}]}
        assert first_non_finite(sections) == "optimizer_states[0].state.0.exp_avg"
        assert first_non_finite({"state_dict": {"policy.a": finite, "step": torch.tensor(3)}}) is None
    finally:
        if owned:
            dist.destroy_process_group()


def test_scaling_the_learning_rate_keeps_the_schedule_progress():
    checkpoint = {"optimizer_states": [{"param_groups": [{"lr": 1.0, "initial_lr": 2.0}]},
                                       {"param_groups": [{"lr": 5.0}]}],
                  "lr_schedulers": [{"base_lrs": [2.0], "_last_lr": [1.0], "last_epoch": 7}]}
    scale_lr(checkpoint, 0, 0.5)
    assert checkpoint["optimizer_states"][0]["param_groups"] == [{"lr": 0.5, "initial_lr": 1.0}]
    assert checkpoint["lr_schedulers"] == [{"base_lrs": [1.0], "_last_lr": [0.5], "last_epoch": 7}]
    scale_lr(checkpoint, 1, 2.0)  # an optimizer without a schedule
    assert checkpoint["optimizer_states"][1]["param_groups"] == [{"lr": 10.0}]
