"""Float32 CPU products through oneDNN (``lit_ppo.models.cpu_matmul``): the choice, the linear layer and its
gradients against float64 products computed by hand, and a model's log-probs and their gradients against
torch's own products. oneDNN is chosen explicitly here, so that every machine runs both paths."""

from __future__ import annotations

import copy

import pytest
import torch

from lit_ppo.errors import ConfigError
from lit_ppo.models import cpu_matmul, token_logprobs
from lit_ppo.models.cpu_matmul import ENV, Float32Linear, use_onednn_linears


@pytest.fixture
def choose(monkeypatch):
    """``choose('onednn' | 'mkl' | None)``: the process's choice as that environment would make it."""

    def set_choice(value):
        if value is None:
            monkeypatch.delenv(ENV, raising=False)
        else:
            monkeypatch.setenv(ENV, value)
        cpu_matmul.onednn_chosen.cache_clear()

    yield set_choice
    cpu_matmul.onednn_chosen.cache_clear()


def _linear(in_features, out_features, bias=True, seed=0):
    torch.manual_seed(seed)
    layer = torch.nn.Linear(in_features, out_features, bias=bias)
    layer.__class__ = Float32Linear
    return layer


@pytest.mark.parametrize("shape", [(7, 48), (2, 5, 48), "transposed", (0, 48)], ids=str)
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
def test_linear_and_its_gradients_are_the_float64_products_in_float32(choose, shape, bias):
    choose("onednn")
    layer = _linear(48, 40, bias)
    torch.manual_seed(1)
    x = torch.randn(5, 2, 48).transpose(0, 1) if shape == "transposed" else torch.randn(*shape)
    x.requires_grad_(True)
    out = layer(x)
    upstream = torch.randn_like(out)
    (out * upstream).sum().backward()

    W, x64, g64 = layer.weight.detach().double(), x.detach().double(), upstream.double()
    expected = x64 @ W.T + (layer.bias.detach().double() if bias else 0)
    g2, x2 = g64.reshape(-1, 40), x64.reshape(-1, 48)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out.double(), expected, rtol=0, atol=1e-5)
    torch.testing.assert_close(x.grad.double(), g64 @ W, rtol=0, atol=1e-5)
    torch.testing.assert_close(layer.weight.grad.double(), g2.T @ x2, rtol=0, atol=1e-5)
    if bias:
        torch.testing.assert_close(layer.bias.grad.double(), g2.sum(0), rtol=0, atol=1e-5)
    if shape == (0, 48):
        assert not layer.weight.grad.any()


def test_outside_float32_the_layer_is_torch_linear_itself(choose):
    choose("onednn")
    layer = _linear(48, 40)
    plain = torch.nn.Linear(48, 40)
    plain.load_state_dict(layer.state_dict())
    x = torch.randn(6, 48)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ours, theirs = layer(x), plain(x)
    assert ours.dtype == torch.bfloat16
    assert torch.equal(ours, theirs)
    assert torch.equal(layer.double()(x.double()), plain.double()(x.double()))


def test_the_choice_follows_the_variable_then_the_cpu_vendor(choose, monkeypatch):
    choose("mkl")
    assert not cpu_matmul.onednn_chosen()
    choose("ONEDNN")
    assert cpu_matmul.onednn_chosen()
    for vendor, chosen in (("GenuineIntel", False), ("AuthenticAMD", True), ("", True)):
        monkeypatch.setattr(cpu_matmul, "_cpu_vendor", lambda vendor=vendor: vendor)
        choose(None)
        assert cpu_matmul.onednn_chosen() is chosen, vendor
    choose("fast")
    with pytest.raises(ConfigError, match=rf"^{ENV}=fast is invalid: must be one of onednn, mkl$"):
        cpu_matmul.onednn_chosen()


def test_only_plain_layers_of_at_least_the_smallest_size_change_class_and_keep_their_state(choose):
    choose("onednn")
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.Linear(256, 255), torch.nn.Embedding(4, 8))
    state = {k: v.clone() for k, v in model.state_dict().items()}
    assert use_onednn_linears(model) is model
    assert [type(m) for m in model] == [Float32Linear, torch.nn.Linear, torch.nn.Embedding]
    assert model.state_dict().keys() == state.keys()
    assert all(torch.equal(model.state_dict()[k], v) for k, v in state.items())
    choose("mkl")
    untouched = torch.nn.Sequential(torch.nn.Linear(256, 256))
    assert type(use_onednn_linears(untouched)[0]) is torch.nn.Linear


def test_log_probs_and_their_gradients_match_torch_products(choose, tiny, monkeypatch):
    """The whole path of the update's log-probs (every linear layer, the chunked LM head forward and
    backward) with oneDNN against torch's products, on the tiny model with every layer converted."""
    model = copy.deepcopy(tiny[0])
    torch.manual_seed(3)
    ids = torch.randint(3, model.config.vocab_size, (3, 9))
    mask = torch.ones_like(ids, dtype=torch.bool)
    mask[0, :2] = False

    def logprobs_and_grads():
        model.zero_grad()
        logp, entropy = token_logprobs(model, ids, mask, temperature=0.8, chunk_size=5, with_entropy=True)
        (logp.sum() + 0.1 * entropy.sum()).backward()
        return logp.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}

    choose("mkl")
    logp_torch, grads_torch = logprobs_and_grads()
    choose("onednn")
    monkeypatch.setattr(cpu_matmul, "SMALLEST_WEIGHT", 0)
    use_onednn_linears(model)
    assert sum(type(m) is Float32Linear for m in model.modules()) >= 8
    logp_onednn, grads_onednn = logprobs_and_grads()
    torch.testing.assert_close(logp_onednn, logp_torch, rtol=0, atol=1e-5)
    for name, grad in grads_torch.items():
        torch.testing.assert_close(grads_onednn[name], grad, rtol=1e-4, atol=1e-5, msg=name)


def test_a_tensor_subclass_keeps_torchs_dispatch(choose):
    """A sharded weight (DTensor) or any other tensor subclass is left to torch: oneDNN takes plain tensors."""
    choose("onednn")

    class Tagged(torch.Tensor):
        pass

    x = torch.randn(3, 48)
    assert cpu_matmul.applies(x, torch.nn.Parameter(torch.randn(40, 48)))
    assert not cpu_matmul.applies(x, torch.randn(40, 48).as_subclass(Tagged))


def _layers():
    """A Float32Linear, a plain Linear and one below the size: under autocast the first two get packed,
    in float32 the first only (the plain one computes with MKL, whose sums differ from oneDNN's)."""
    torch.manual_seed(4)
    model = torch.nn.Sequential(torch.nn.Linear(256, 320), torch.nn.Linear(320, 256, bias=False),
                                torch.nn.Linear(256, 255))
    model[0].__class__ = Float32Linear
    return model


@pytest.mark.parametrize("rows", [1, 2, 5, 64])
def test_packed_layers_compute_the_same_numbers_and_are_themselves_again_afterwards(choose, rows):
    choose("onednn")
    model = _layers()
    x = torch.randn(rows, 256)
    with torch.no_grad():
        plain = model(x)
        with cpu_matmul.packed_linears(model, rows=rows):
            assert [type(m).__name__ for m in model] == ["_PackedLinear", "Linear", "Linear"]
            packed = model(x)
            # The row count is a hint, not a limit.
            others = [torch.randn(n, 256) for n in (1, 2 * rows + 1)]
            packed_others = [model(other) for other in others]
            single_row_first_layer = model[0](others[0])
        plain_others = [model(other) for other in others]
    assert [type(m) for m in model] == [Float32Linear, torch.nn.Linear, torch.nn.Linear]
    assert not any(hasattr(m, "_packed_weight") for m in model)
    # oneDNN's products with the plain weight: bit for bit on the AMD EPYC measured, a float32 rounding
    # apart at most on any CPU.
    torch.testing.assert_close(packed, plain)
    for a, b in zip(packed_others, plain_others):
        torch.testing.assert_close(a, b)
    W = [m.weight.double() for m in model]
    by_hand = ((x.double() @ W[0].T + model[0].bias.double()) @ W[1].T) @ W[2].T + model[2].bias.double()
    torch.testing.assert_close(packed.double(), by_hand, rtol=0, atol=1e-5)
    # A single row keeps the plain weight: the very product Float32Linear computes.
    assert torch.equal(single_row_first_layer, model[0](others[0]))


def test_packed_layers_under_bfloat16_autocast_compute_what_autocast_computes(choose):
    choose("onednn")
    model = _layers()
    x = torch.randn(7, 256)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        plain = model(x)
        with cpu_matmul.packed_linears(model, rows=7):
            packed_types = [type(m).__name__ for m in model]
            packed = model(x)
    assert plain.dtype == packed.dtype == torch.bfloat16
    if torch.ops.mkldnn._is_mkldnn_bf16_supported():  # both AVX512-BF16 and AMX CPUs
        assert packed_types == ["_PackedLinear", "_PackedLinear", "Linear"]
    else:
        assert packed_types == ["Float32Linear", "Linear", "Linear"]
    # Bit for bit on an AVX512-BF16 CPU; autocast's product and the packed one are different oneDNN
    # primitives, so elsewhere a bfloat16 rounding apart at most.
    torch.testing.assert_close(packed.float(), plain.float(), rtol=2 ** -7, atol=1e-3)


def test_layers_stay_as_they_are_with_mkl_chosen_with_gradients_or_when_the_block_fails(choose):
    choose("mkl")
    model = _layers()
    with torch.no_grad(), cpu_matmul.packed_linears(model, rows=4):
        assert [type(m) for m in model] == [Float32Linear, torch.nn.Linear, torch.nn.Linear]
    choose("onednn")
    with pytest.raises(RuntimeError, match="^packed_linears computes without gradients"):
        with cpu_matmul.packed_linears(model, rows=4):
            pass
    with pytest.raises(KeyError), torch.no_grad(), cpu_matmul.packed_linears(model, rows=4):
        raise KeyError("inside")
    assert [type(m) for m in model] == [Float32Linear, torch.nn.Linear, torch.nn.Linear]
    assert not any(hasattr(m, "_packed_weight") for m in model)
