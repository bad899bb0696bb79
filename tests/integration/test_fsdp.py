"""trainer=fsdp from the real CLI: 2 FSDP2 ranks over gloo train the policy, the critic and the
reference sharded; engines sample with the gathered weights; checkpoints are verified distributed
directories that resume exactly, evaluate and export to one Hugging Face directory."""

from __future__ import annotations

import csv
import shutil

import pytest
import torch
from safetensors.torch import load_file

from .conftest import FAST, run_cli, run_dir

pytestmark = pytest.mark.slow
# algo=ppo has a critic; kl_ctl > 0 adds the reference: all three are sharded.
FIT = ["fit", "algo=ppo", "actor.kl_ctl=0.05", "trainer=fsdp",
       *[a for a in FAST if not a.startswith(("trainer.max_steps=", "logger="))]]


def weights(model_dir) -> dict[str, torch.Tensor]:
    return load_file(model_dir / "model.safetensors")


def assert_same_weights(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=1e-6, msg=name)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Three iterations in one go (CSV metrics), and two then a resume for the third."""
    through, part = tmp_path_factory.mktemp("through"), tmp_path_factory.mktemp("part")
    result = run_cli([*FIT, "trainer.max_steps=3", "logger=csv"], through, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    result = run_cli([*FIT, "trainer.max_steps=2", "logger=none"], part, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return through, part


def test_fsdp_ranks_sample_with_the_gathered_weights_and_checkpoint_distributed(runs):
    through, part = runs
    (metrics_csv,) = run_dir(through).glob("csv/version_*/metrics.csv")
    rows = [r for r in csv.DictReader(metrics_csv.open()) if r.get("mismatch/logp_abs_diff")]
    assert len(rows) == 3
    # Iterations 2 and 3 sample with weights pushed from the shards of both ranks.
    assert all(float(r["mismatch/logp_abs_diff"]) < 1e-4 for r in rows), rows
    assert all(float(r["critic/grad_norm"]) > 0 for r in rows)
    last = run_dir(part) / "checkpoints" / "last.ckpt"
    assert last.is_dir()
    assert sorted(f.name for f in last.iterdir()) == [".metadata", "__0_0.distcp", "__1_0.distcp", "meta.pt"]
    assert not [p for p in last.parent.iterdir() if p.name.startswith(".")]  # no temporary directory left


def test_export_consolidates_the_shards_into_the_fit_end_model(runs, tmp_path):
    _, part = runs
    made = run_dir(part)
    result = run_cli(["export", "--ckpt_path", str(made / "checkpoints" / "last.ckpt"), "--output",
                      str(tmp_path / "exported")], tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert_same_weights(weights(tmp_path / "exported"), weights(made / "model"))
    from transformers import AutoModelForCausalLM

    assert AutoModelForCausalLM.from_pretrained(tmp_path / "exported", local_files_only=True) is not None


def test_a_distributed_checkpoint_resumes_exactly_and_evaluates(runs):
    through, part = runs
    # The resume continues the run directory (its last.ckpt and model/ then hold iteration 3, which
    # the other tests of this run hold true for any iteration).
    last = run_dir(part) / "checkpoints" / "last.ckpt"
    result = run_cli([*FIT, "trainer.max_steps=3", "logger=none", "--ckpt_path", str(last)], part, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert_same_weights(weights(run_dir(part) / "model"), weights(run_dir(through) / "model"))
    result = run_cli(["validate", "--ckpt_path", str(last)], part, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "eval/accuracy" in result.stdout


@pytest.mark.parametrize("damage, command, message", [
    ("flip", "fit", "shard file __1_0.distcp does not match its digest"),
    ("remove", "export", "is incomplete: shard file __1_0.distcp is missing"),
])
def test_a_damaged_distributed_checkpoint_is_refused_in_one_line(runs, tmp_path, damage, command, message):
    _, part = runs
    last = tmp_path / "last.ckpt"
    shutil.copytree(run_dir(part) / "checkpoints" / "last.ckpt", last)
    shard = last / "__1_0.distcp"
    if damage == "flip":
        data = bytearray(shard.read_bytes())
        data[len(data) // 2] ^= 0x01
        shard.write_bytes(bytes(data))
    else:
        shard.unlink()
    args = [*FIT, "--ckpt_path", str(last)] if command == "fit" else [
        "export", "--ckpt_path", str(last), "--output", str(tmp_path / "out")]
    result = run_cli(args, tmp_path)
    assert result.returncode == 2, result.stderr[-3000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and str(last) in lines[0], result.stderr


def test_lora_under_fsdp_merges_the_adapters_into_the_gathered_weights(tmp_path):
    fast = [a for a in FIT[1:] if not a.startswith(("algo=", "actor.kl_ctl="))]
    result = run_cli(["fit", "algo=grpo", *fast, "model.lora_rank=8", "trainer.max_steps=2", "logger=csv"], tmp_path,
                     timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    (metrics_csv,) = run_dir(tmp_path).glob("csv/version_*/metrics.csv")
    gaps = [float(r["mismatch/logp_abs_diff"]) for r in csv.DictReader(metrics_csv.open())
            if r.get("mismatch/logp_abs_diff")]
    assert len(gaps) == 2 and max(gaps) < 1e-4  # iteration 2 samples with the merged, gathered weights
