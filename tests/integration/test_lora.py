"""LoRA from the real CLI: ``fit algo=grpo model.lora_rank=8`` trains only the adapters, the engine
samples the trainer's policy, the checkpoint keeps the base weights, exports write the merged model
(and the adapter alone), and a resumed LoRA run continues the same run."""

from __future__ import annotations

import csv
from pathlib import Path

import lightning as L
import pytest
import torch

from tests.integration.conftest import FAST, run_cli, run_dir

pytestmark = pytest.mark.slow
PROMPT = torch.tensor([[2, 6, 7, 10, 8, 1, 3, 9, 12, 1]])


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    cwd = tmp_path_factory.mktemp("lora")
    fast = [a for a in FAST if not a.startswith("logger=")] + ["logger=csv"]
    result = run_cli(["fit", "algo=grpo", "model.lora_rank=8", *fast], cwd)
    assert result.returncode == 0, result.stderr[-3000:]
    return run_dir(cwd)


def _logprobs(model) -> torch.Tensor:
    from lit_ppo.models import token_logprobs

    with torch.no_grad():
        return token_logprobs(model.eval(), PROMPT, torch.ones_like(PROMPT, dtype=torch.bool))[0]


def test_engine_samples_the_trainers_lora_policy(trained):
    (metrics,) = trained.glob("csv/version_*/metrics.csv")
    gaps = [float(row["mismatch/logp_abs_diff"]) for row in csv.DictReader(metrics.open())
            if row.get("mismatch/logp_abs_diff")]
    assert len(gaps) == 2 and max(gaps) < 1e-4


def test_checkpoint_keeps_the_base_weights_and_only_adapters_have_optimizer_state(trained):
    from lit_ppo.models import TinyModelConfig, build_tiny

    checkpoint = torch.load(trained / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    state = {k.removeprefix("policy."): v for k, v in checkpoint["state_dict"].items() if k.startswith("policy.")}
    base, _ = build_tiny(TinyModelConfig(), trained.parents[2] / "cache")
    adapters = [k for k in state if ".lora_" in k]
    for name, weight in base.named_parameters():
        stored = state.get(name, state.get(name.replace(".weight", ".base_layer.weight")))
        assert torch.equal(stored, weight), name
    assert any(not torch.equal(state[k], torch.zeros_like(state[k])) for k in adapters if ".lora_B." in k)
    (actor,) = checkpoint["optimizer_states"]
    assert len(actor["state"]) == len(adapters) == sum(len(g["params"]) for g in actor["param_groups"])


def test_export_writes_the_merged_model_and_the_adapter(trained, tmp_path, monkeypatch):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from lit_ppo.models import TinyModelConfig, build_tiny
    from lit_ppo.run.export import policy_of_checkpoint

    ckpt = trained / "checkpoints" / "last.ckpt"
    result = run_cli(["export", "--ckpt_path", str(ckpt), "--output", str(tmp_path / "merged"),
                      "--adapter", str(tmp_path / "adapter")], trained.parents[2])
    assert result.returncode == 0, result.stderr[-3000:]
    monkeypatch.setenv("LIT_PPO_CACHE", str(trained.parents[2] / "cache"))
    expected = _logprobs(policy_of_checkpoint(ckpt)[0])  # the trained LoRA policy, adapters unmerged
    for merged in (tmp_path / "merged", trained / "model"):  # the export and fit's own
        assert not (merged / "adapter_config.json").exists()
        model = AutoModelForCausalLM.from_pretrained(merged, local_files_only=True)
        torch.testing.assert_close(_logprobs(model), expected, rtol=0, atol=1e-5)
    assert {p.name for p in (tmp_path / "adapter").iterdir()} == {"adapter_config.json", "adapter_model.safetensors"}
    base, _ = build_tiny(TinyModelConfig(), trained.parents[2] / "cache")
    peft_model = PeftModel.from_pretrained(base, tmp_path / "adapter")
    torch.testing.assert_close(_logprobs(peft_model.base_model.model), expected, rtol=0, atol=1e-5)


@pytest.mark.parametrize("flags, message", [
    (["--adapter", "same", "--output", "same"], "--adapter same: must be another directory than --output same"),
    ([], "give --output DIR (the model) and / or --adapter DIR (its LoRA adapter)"),
])
def test_export_refuses_bad_combinations_in_one_line(trained, cli_here, flags, message):
    result = cli_here("export", "--ckpt_path", str(trained / "checkpoints" / "last.ckpt"), *flags)
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1
    assert result.stderr.startswith(f"error: {message}")


def test_resumed_lora_run_equals_the_uninterrupted_one(tmp_path):
    from tests.integration.test_training import fit, make

    def make_lora(path):
        module, data = make(path)
        torch.manual_seed(0)  # the adapters' init draws from the global generator
        return type(module)({**module.hparams["model"], "lora_rank": 4}, module.actor_cfg, algo="test"), data

    _, straight = fit(*make_lora(tmp_path / "a"), tmp_path / "a", max_steps=2)
    ckpt = L.pytorch.callbacks.ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=1, save_top_k=-1)
    _, first = fit(*make_lora(tmp_path / "b"), tmp_path / "b", max_steps=1, callbacks=[ckpt])
    module, data = make_lora(tmp_path / "b")
    _, second = fit(module, data, tmp_path / "b", max_steps=2, ckpt_path=str(tmp_path / "ckpt" / "epoch=0-step=1.ckpt"))
    assert module.version == 2 and second.batch_versions == [[1]]
    resumed = first.metrics + second.metrics
    for key in ("rollout/reward_mean", "actor/loss", "actor/grad_norm", "actor/entropy"):
        assert [m[key] for m in resumed] == pytest.approx([m[key] for m in straight.metrics], rel=1e-5, abs=1e-7), key


def test_resuming_with_other_lora_settings_is_refused_in_one_line(trained, cli_here):
    last = trained / "checkpoints" / "last.ckpt"
    result = cli_here("fit", "algo=grpo", *FAST, "model.lora_rank=4", "--ckpt_path", str(last))
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1, result.stderr[-3000:]
    assert result.stderr.startswith(f"error: model.lora_rank=4 cannot change when resuming --ckpt_path {last} "
                                    f"(the run had 8): ")


def test_lora_dropout_applies_to_the_update_only(tmp_path):
    from tests.integration.test_training import fit, make

    module, data = make(tmp_path)
    torch.manual_seed(0)
    module = type(module)({**module.hparams["model"], "lora_rank": 4, "lora_dropout": 0.2}, module.actor_cfg,
                          algo="test")
    _, rec = fit(module, data, tmp_path, max_steps=2)
    # The old log-probs come from a pass without dropout, equal to the engine's (merged weights, no dropout)...
    assert all(m["mismatch/logp_abs_diff"] < 1e-4 for m in rec.metrics)
    # ...while the update's own forward has it: its ratio to them is not 1 even on-policy.
    assert any(abs(m["actor/importance_weight_mean"] - 1) > 1e-4 for m in rec.metrics)
