"""``logger=wandb``: a tiny fit tracked by Weights & Biases in offline mode (no network), its run file read
back record by record: the run's name, project and tags, the params as typed on the command line, the
metrics of every iteration, the samples table and the saved config and summary; and a machine without
wandb gets one line."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from tests.integration.conftest import FAST, run_cli, run_dir

BLOCK = 32768
"""The run file is a LevelDB-style log: 32 KiB blocks of chunks, each with a 7-byte header."""


def read_records(path: Path) -> list:
    """The protobuf records of a W&B run file (``run-<id>.wandb``), in order."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B", data[:7]
    records, pending, pos = [], b"", 7
    while pos + 7 <= len(data):
        if BLOCK - pos % BLOCK < 7:  # a block's tail too short for a header is padding
            pos += BLOCK - pos % BLOCK
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if kind == 0:
            break
        pending += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # a full record, or the last chunk of one
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
            pending = b""
    return records


@pytest.mark.slow
def test_an_offline_wandb_run_holds_the_runs_name_params_metrics_and_samples(tmp_path):
    args = [arg for arg in FAST if not arg.startswith("logger=")]
    result = run_cli(["fit", "logger=wandb", "logger.init_args.offline=true", "actor.eps_clip=0.25", *args,
                      "samples.every_n_iterations=1", "samples.count=3"], tmp_path, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    directory = run_dir(tmp_path)
    (offline,) = (directory / "wandb").glob("offline-run-*")
    records = read_records(next(offline.glob("run-*.wandb")))
    runs = [r.run for r in records if r.WhichOneof("record_type") == "run"]  # the start, then the tags' update
    assert runs[0].display_name == directory.name and runs[0].project == "lit_ppo"
    assert {"grpo", "algo=grpo", "task=arithmetic", "model=tiny", "engine=hf"} <= set(runs[-1].tags)
    config = {item.key: item.value_json for r in records if r.WhichOneof("record_type") == "config"
              for item in r.config.update}
    assert config["actor.eps_clip"] == '"0.25"' and config["algo"] == '"grpo"' and config["seed"] == '"0"'
    history = [{item.key or "/".join(item.nested_key): item.value_json for item in r.history.item}
               for r in records if r.WhichOneof("record_type") == "history"]
    rewards = [h for h in history if "rollout/reward_mean" in h]
    assert [h["trainer/global_step"] for h in rewards] == ["1", "2"]
    tables = [h for h in history if h.get("samples/_type") == '"table-file"']
    assert len(tables) == 2 and all(h["samples/nrows"] == "3" for h in tables)  # 3 rows at iterations 1 and 2
    saved = {r.files.files[0].path for r in records if r.WhichOneof("record_type") == "files" and r.files.files}
    assert {"config.yaml", "summary.txt"} <= saved
    assert (offline / "files" / "config.yaml").read_text() == (directory / "config.yaml").read_text()
    # W&B's own lines stay on stderr: stdout ends with the run summary, which names the W&B run's files.
    lines = result.stdout.splitlines()
    assert not any("wandb:" in line or "\x1b[" in line for line in lines), result.stdout[-2000:]
    assert lines[-1].startswith("  export ")
    assert f"  wandb run      {offline.relative_to(tmp_path)} (offline: wandb sync uploads it)" in lines


def test_wandb_missing_is_one_line(monkeypatch, capsys, tmp_path):
    import importlib.util

    from lit_ppo.__main__ import main

    found = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else found(name, *a))
    monkeypatch.chdir(tmp_path)
    assert main(["fit", "logger=wandb", *FAST[1:]]) == 2
    err = capsys.readouterr().err
    assert err.endswith("error: trainer.logger WandbRunLogger needs the wandb package, which is not installed: "
                        "pip install wandb\n"), err
    assert not (tmp_path / "runs").exists()
