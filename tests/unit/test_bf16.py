"""bf16: ``trainer.precision=bf16-mixed`` (Lightning's autocast over float32 master weights) and the
engine in bfloat16 (``rollout.engine_kwargs.dtype`` / ``autocast``), on CPU without downloads.

Tolerances are measured values with margin (this CPU, torch 2.13, seeds as below):
- tiny model (lit_ppo.models.build_tiny), 8 rows x 24 tokens: |bf16 - fp32| log-prob per token
  mean 0.0056, max 0.023 (over 4 data seeds x temperatures 1.0 / 0.7: mean <= 0.010, max <= 0.055);
  tested mean < 0.02, max < 0.08.
- random 4-layer Llama (hidden 256, vocab 4096), 8 rows x 64 tokens: mean 0.0017, max 0.0072 (3 model
  seeds x 2 data seeds: mean <= 0.0018, max <= 0.0093); tested mean < 0.005, max < 0.025.
- parameter gradients of sum(log-probs): relative error (norm of difference / norm) <= 0.017; tested < 0.05.
For scale: float32 recomputes agree to ~1e-6, and a real SmolLM2-135M in bf16 differs from float32
by 0.025 to 0.036 nats per token (mean over 350 sampled tokens; max 0.15 to 0.27).
"""

from __future__ import annotations

import copy
import threading
from types import SimpleNamespace

import lightning as L
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import LlamaConfig, LlamaForCausalLM

from lit_ppo.cli.compose import compose
from lit_ppo.training.datamodule import RolloutDataModule, _trainer_autocast
from lit_ppo.models import build_tiny, token_logprobs
from lit_ppo.rollout.engine import SamplingParams
from lit_ppo.rollout.hf_engine import HFEngine


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    model, tok = build_tiny(cache_dir=tmp_path_factory.mktemp("cache"))
    return model.eval(), tok


def llama_4l() -> LlamaForCausalLM:
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=4096, hidden_size=256, intermediate_size=768, num_hidden_layers=4,
                                        num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=256,
                                        tie_word_embeddings=True)).eval()


def batch(vocab_size: int, rows: int = 8, width: int = 24, seed: int = 0):
    """Random tokens, rows of different lengths (right padding), the first 8 tokens a prompt."""
    g = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(0, vocab_size, (rows, width), generator=g)
    attention_mask = torch.ones(rows, width, dtype=torch.bool)
    for b in range(rows):
        attention_mask[b, width - 2 * b:] = False
    loss_mask = attention_mask.clone()
    loss_mask[:, :8] = False
    return input_ids, attention_mask, loss_mask


def grads_of_logprob_sum(model, input_ids, attention_mask, loss_mask, bf16: bool):
    model.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        logp, _ = token_logprobs(model, input_ids, attention_mask, loss_mask=loss_mask)
    logp.sum().backward()
    return logp.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("name, width, mean_tol, max_tol", [("tiny", 24, 0.02, 0.08), ("llama_4l", 64, 0.005, 0.025)])
def test_bf16_autocast_logprobs_are_within_tolerance_of_fp32(tiny, name, width, mean_tol, max_tol):
    model = tiny[0] if name == "tiny" else llama_4l()
    input_ids, attention_mask, loss_mask = batch(model.config.vocab_size, width=width)
    fp32, fp32_grads = grads_of_logprob_sum(model, input_ids, attention_mask, loss_mask, bf16=False)
    bf16, bf16_grads = grads_of_logprob_sum(model, input_ids, attention_mask, loss_mask, bf16=True)
    # The log-softmax is float32 under autocast (only the matmuls are bf16); master weights stay float32.
    assert bf16.dtype == torch.float32
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert all(g.dtype == torch.float32 for g in bf16_grads.values())
    diff = (bf16 - fp32).abs()[loss_mask]
    assert float(diff.mean()) < mean_tol and float(diff.max()) < max_tol, (float(diff.mean()), float(diff.max()))
    assert float(diff.mean()) > 1e-4  # the bf16 path really computed in bf16 (float32 agrees to ~1e-6)
    assert ((bf16 == 0) == ~loss_mask).all()
    for n, g in bf16_grads.items():
        ref = fp32_grads[n]
        assert float((g - ref).norm() / ref.norm().clamp(min=1e-30)) < 0.05, n
    model.zero_grad(set_to_none=True)


def engine_batch(prompts, out):
    """The engine's completions as a padded batch: input ids, masks, behaviour log-probs."""
    rows = [(p, c) for p, cs in zip(prompts, out) for c in cs]
    width = max(len(p) + len(c.token_ids) for p, c in rows)
    input_ids = torch.zeros(len(rows), width, dtype=torch.long)
    attention_mask = torch.zeros(len(rows), width, dtype=torch.bool)
    loss_mask = torch.zeros_like(attention_mask)
    behave = torch.zeros(len(rows), width)
    for i, (p, c) in enumerate(rows):
        n = len(p) + len(c.token_ids)
        input_ids[i, :n] = torch.tensor(p + c.token_ids)
        attention_mask[i, :n] = True
        loss_mask[i, len(p):n] = True
        behave[i, len(p):n] = torch.tensor(c.logprobs)
    return input_ids, attention_mask, loss_mask, behave


def gap(model, prompts, out, bf16: bool) -> float:
    input_ids, attention_mask, loss_mask, behave = engine_batch(prompts, out)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        logp, _ = token_logprobs(model, input_ids, attention_mask, loss_mask=loss_mask)
    return float((logp - behave).abs()[loss_mask].mean())


PARAMS = SamplingParams(n=8, max_new_tokens=8, temperature=1.0, seed=0)


def test_an_autocast_engine_samples_in_bfloat16_on_any_thread(tiny):
    """autocast='bfloat16' (what the data module passes under bf16-mixed) holds on a thread without the
    trainer's autocast too, as the asynchronous producer's: before, that thread sampled in float32 and
    the gap check stopped an asynchronous bf16-mixed run at its first iteration. The check compares the
    engine with itself: how far its incremental bfloat16 decoding lands from the trainer's bfloat16
    forward pass depends on the CPU's kernels (1e-7 on one with AMX, 2.5e-3 on one without)."""
    model, tok = tiny
    prompts = [tok.encode("12+7="), tok.encode("3+4=")]
    engine = HFEngine(model, tok, autocast="bfloat16")
    results = {}
    thread = threading.Thread(target=lambda: results.update(out=engine.generate(prompts, PARAMS)))
    thread.start()
    thread.join()
    on_main = engine.generate(prompts, PARAMS)  # the same seed: the same samples, computed the same way
    assert [[c.token_ids for c in cs] for cs in results["out"]] == [[c.token_ids for c in cs] for cs in on_main]
    assert [[c.logprobs for c in cs] for cs in results["out"]] == [[c.logprobs for c in cs] for cs in on_main]
    assert gap(model, prompts, results["out"], bf16=False) > 1e-3  # not float32 (which agrees to 1e-7)
    # Without it, that thread computes in float32: exactly what the float32 trainer computes.
    plain = HFEngine(model, tok).generate(prompts, PARAMS)
    assert gap(model, prompts, plain, bf16=False) < 1e-5
    assert gap(model, prompts, plain, bf16=True) > 1e-3  # measured 5.6e-3


class _WeightCasts(TorchDispatchMode):
    """Counts casts of float32 tensors of ``shape`` to bfloat16."""

    def __init__(self, shape):
        super().__init__()
        self.shape, self.count = tuple(shape), 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        # Autocast casts through aten.to.dtype in inference mode and aten._to_copy outside it.
        if func is torch.ops.aten._to_copy.default:
            dtype = kwargs.get("dtype")
        elif func is torch.ops.aten.to.dtype:
            dtype = args[1]
        else:
            dtype = None
        if dtype == torch.bfloat16 and tuple(args[0].shape) == self.shape and args[0].dtype == torch.float32:
            self.count += 1
        return func(*args, **kwargs)


def test_an_autocast_engine_casts_each_weight_once_per_call_and_sees_every_update(tiny):
    """Decoding steps reuse one bfloat16 cast of each weight per generate call (before, every step
    cast every weight: 3x a SmolLM2 decode step's matmul time); the result equals a per-step cast's,
    and a weight update between calls reaches the next call."""
    model, tok = tiny
    prompts = [tok.encode("12+7="), tok.encode("3+4=")]
    params = SamplingParams(n=4, max_new_tokens=6, temperature=1.0, seed=3)
    engine = HFEngine(model, tok, autocast="bfloat16")
    weight = engine.model.model.layers[0].mlp.down_proj.weight
    with _WeightCasts(weight.shape) as casts:
        out = engine.generate(prompts, params)
    assert max(len(c.token_ids) for cs in out for c in cs) > 1  # several decoding steps ran
    assert casts.count == sum(p.shape == weight.shape for p in engine.model.parameters())  # one per layer
    with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=False):
        per_step = engine._generate(prompts, params)  # every step casts every weight
    assert [[(c.token_ids, c.logprobs) for c in cs] for cs in out] == \
        [[(c.token_ids, c.logprobs) for c in cs] for cs in per_step]
    # An update between calls: the next call equals a new engine built from the updated weights.
    changed = copy.deepcopy(model)
    with torch.no_grad():
        for p in changed.parameters():
            p.add_(0.05 * torch.randn_like(p))
    engine.update_weights(changed.named_parameters(), version=1)
    fresh = HFEngine(changed, tok, autocast="bfloat16").generate(prompts, params)
    assert [[c.logprobs for c in cs] for cs in engine.generate(prompts, params)] == \
        [[c.logprobs for c in cs] for cs in fresh]
    assert [[c.logprobs for c in cs] for cs in fresh] != [[c.logprobs for c in cs] for cs in out]


def test_a_bfloat16_engine_holds_bfloat16_weights_and_casts_pushes(tiny):
    model, tok = tiny
    engine = HFEngine(model, tok, dtype="bfloat16")
    assert {p.dtype for p in engine.model.parameters()} == {torch.bfloat16}
    assert all(p.dtype == torch.float32 for p in model.parameters())  # the trainer's copy is untouched
    moved = {n: p.detach() + 0.01 for n, p in model.named_parameters()}
    engine.update_weights(moved.items(), version=1)
    for n, p in engine.model.named_parameters():
        assert p.dtype == torch.bfloat16 and torch.equal(p, moved[n].bfloat16()), n
    engine.update_weights(model.named_parameters(), version=2)
    prompts = [tok.encode("12+7=")]
    out = engine.generate(prompts, PARAMS)
    assert all(isinstance(lp, float) for c in out[0] for lp in c.logprobs)
    # Rounding of the weights and activations, not a wrong policy: of the order of 1e-3 to 1e-2.
    assert 1e-3 < gap(model, prompts, out, bf16=True) < 0.05  # measured 6e-3


def test_engine_precision_settings_are_validated_before_any_model_loads():
    with pytest.raises(ValueError, match=r"^rollout.engine_kwargs.dtype='bf16' is invalid: must be one of 'auto', "):
        RolloutDataModule(engine_kwargs={"dtype": "bf16"})
    with pytest.raises(ValueError, match=r"^rollout.engine_kwargs.autocast='float32' is invalid"):
        RolloutDataModule(engine_kwargs={"autocast": "float32"})
    with pytest.raises(ValueError, match=r"^rollout.engine_kwargs.dtyp is not a setting of rollout=hf; allowed: "
                                         r"autocast, dtype, max_batch_size$"):
        RolloutDataModule(engine_kwargs={"dtyp": "bfloat16"})
    with pytest.raises(ValueError, match=r"^rollout.engine_kwargs.max_batch_size=0 is invalid"):
        RolloutDataModule(engine_kwargs={"max_batch_size": 0})
    assert compose(["rollout.engine_kwargs.dtype=bfloat16"])["data"]["engine_kwargs"] == {"dtype": "bfloat16"}
    RolloutDataModule(engine_kwargs={"dtype": "bfloat16", "autocast": "bfloat16", "max_batch_size": 8})
    RolloutDataModule(engine="vllm", engine_kwargs={"dtype": "half"})  # vLLM's own values: vLLM checks them


def test_the_engine_autocasts_as_the_trainers_precision(tiny):
    for precision, expected in (("bf16-mixed", "bfloat16"), ("32-true", None), ("bf16-true", None)):
        trainer = L.Trainer(accelerator="cpu", precision=precision, logger=False, enable_checkpointing=False,
                            enable_progress_bar=False, enable_model_summary=False)
        assert _trainer_autocast(trainer) == expected, precision
    # The data module builds its engine with it; rollout.engine_kwargs.autocast overrides it.
    model, tok = tiny
    module = SimpleNamespace(policy=model, full_policy=lambda: model, tokenizer=tok, device=torch.device("cpu"),
                             version=0)
    trainer = L.Trainer(accelerator="cpu", precision="bf16-mixed", logger=False, enable_checkpointing=False)
    for engine_kwargs, expected in (({}, torch.bfloat16), ({"autocast": None}, None)):
        data = RolloutDataModule(engine_kwargs=engine_kwargs)
        data.trainer = trainer
        assert data._build_engine(module).autocast == expected
