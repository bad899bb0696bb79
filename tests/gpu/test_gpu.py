"""The CUDA paths of the trainer presets, run on a machine with NVIDIA GPUs (`pytest tests/gpu`);
skipped where there is none. One GPU in bf16-mixed with each engine (vLLM sleeping during the
update), asynchronous rollouts on the trainer's GPU or their own, and DDP / FSDP2 over NCCL on every
visible GPU."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from tests.integration.conftest import FAST, run_cli

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
# bf16 alone gives behaviour / trainer log-prob gaps of 1e-3 to 1e-2: within rollout.max_logp_gap=auto (0.1).


def fit(tmp_path, *args: str, algo: str = "grpo"):
    result = run_cli(["fit", f"algo={algo}", *FAST, *args], tmp_path, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "`Trainer.fit` stopped: `max_steps=2` reached." in result.stderr + result.stdout
    return result


def test_one_gpu_in_bf16_mixed(tmp_path):
    fit(tmp_path, "trainer=gpu")


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="rollout=vllm needs vllm")
def test_one_gpu_with_a_vllm_engine_that_sleeps_during_the_update(tmp_path):
    fit(tmp_path, "trainer=gpu", "rollout=vllm")


@pytest.mark.parametrize("engine", ["hf", "vllm"])
def test_asynchronous_rollouts_share_the_gpu_with_the_trainer(tmp_path, engine):
    if engine == "vllm" and importlib.util.find_spec("vllm") is None:
        pytest.skip("rollout=vllm needs vllm")
    fit(tmp_path, "trainer=gpu", f"rollout={engine}", "rollout.max_head_offpolicyness=1", algo="icepop")


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_asynchronous_rollouts_on_their_own_gpu(tmp_path):
    fit(tmp_path, "trainer=gpu", "rollout.max_head_offpolicyness=1", "rollout.devices=[1]", algo="icepop")


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
@pytest.mark.parametrize("trainer", ["ddp", "fsdp"])
def test_every_visible_gpu_over_nccl(tmp_path, trainer):
    result = fit(tmp_path, f"trainer={trainer}")
    assert f"MEMBER: {torch.cuda.device_count()}/{torch.cuda.device_count()}" in result.stdout + result.stderr


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="rollout=vllm needs vllm")
def test_the_smollm2_recipe_learns_on_one_gpu(tmp_path):
    """recipe=smollm2_word_problems_gpu (docs/recipes.md) for 20 iterations: the training reward of the
    last five iterations is above that of the first five. Prints s/iteration for the docs."""
    from mlflow.tracking import MlflowClient

    store = f"sqlite:///{tmp_path}/mlflow.db"
    result = run_cli(["fit", "recipe=smollm2_word_problems_gpu", "trainer.max_steps=20",
                      "trainer.val_check_interval=20"], tmp_path, timeout=1800, env={"MLFLOW_TRACKING_URI": store})
    assert result.returncode == 0, result.stderr[-3000:]
    client = MlflowClient(store)
    (run,) = client.search_runs([e.experiment_id for e in client.search_experiments()])
    history = sorted(client.get_metric_history(run.info.run_id, "rollout/reward_mean"), key=lambda m: m.step)
    rewards = [m.value for m in history]
    assert len(rewards) == 20
    seconds = (history[-1].timestamp - history[4].timestamp) / 1000 / 15
    print(f"smollm2 recipe on {torch.cuda.get_device_name()}: {seconds:.1f} s/iteration after warm-up; "
          f"reward first five {sum(rewards[:5]) / 5:.3f}, last five {sum(rewards[-5:]) / 5:.3f}")
    assert sum(rewards[-5:]) > sum(rewards[:5]), rewards


@pytest.mark.parametrize("offload", [False, True])
def test_a_reward_model_scores_on_the_gpu_and_offloads_between_scorings(tmp_path, offload):
    """``reward_model.offload``: the GPU holds the weights only while they score; without it they stay."""
    import asyncio

    from tests.unit.tasks.rewards.test_model import COMPLETIONS, PROMPTS, classifier, reward_model

    path = classifier(tmp_path / "rm")
    on_cpu = asyncio.run(reward_model(path, device="cpu")(prompts=PROMPTS, completions=COMPLETIONS))
    rm = reward_model(path, device="cuda", offload=offload)
    before = torch.cuda.memory_allocated()
    values = asyncio.run(rm(prompts=PROMPTS, completions=COMPLETIONS))
    assert values == pytest.approx(on_cpu, abs=1e-3)
    held = torch.cuda.memory_allocated() - before
    weights = sum(p.numel() * p.element_size() for p in rm._model.parameters())
    assert (held < weights / 2) if offload else (held >= weights)
    assert next(rm._model.parameters()).device.type == ("cpu" if offload else "cuda")
