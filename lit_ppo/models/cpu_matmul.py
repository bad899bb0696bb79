"""Matrix products on CPU through oneDNN: float32 ones where MKL's are slow (the linear layers of a model and
the LM head of the log-probs), and decoding's with weights packed once per generate call.

torch computes a float32 ``linear`` on CPU with MKL's sgemm. On AMD processors MKL runs its AVX2 kernels,
whatever the CPU has; oneDNN, which torch ships as well, runs AVX-512 ones. Measured on one thread of an
AMD EPYC with AVX-512, at SmolLM2's shapes (1000 tokens x 576 x 1536, and the 49152-token LM head), the
forward product and both products of its backward pass: MKL 94-110 GFLOP/s, oneDNN 140-240 GFLOP/s.
Both are float32 products; they differ only in the order in which the sums accumulate (a relative
difference of about 1e-6).

Where the choice applies: float32 weights on CPU outside autocast (under ``bf16-mixed`` autocast torch
already takes oneDNN's bfloat16 kernels; on GPU nothing changes), in layers of at least
``SMALLEST_WEIGHT`` elements (below that, oneDNN's per-call setup costs what it saves). The processor's
vendor chooses it once per process: oneDNN unless the CPU is Intel's, where MKL runs its AVX-512 kernels.
``LIT_PPO_FLOAT32_MATMUL=mkl`` or ``=onednn`` chooses instead.

Decoding on CPU (``packed_linears``): a product with a plain weight has oneDNN rearrange the weight into its
blocked layout at every call, which at a decoding step's few rows costs as much as the product. The HF
engine has the layers' weights packed once per ``generate`` call and decodes with the packed copies. In
float32 these are oneDNN's kernels on its own layout: the same numbers bit for bit on the AMD EPYC measured
(a single row, for which oneDNN takes another kernel with a packed weight, keeps the plain one), at most a
float32 rounding apart elsewhere. In bfloat16 another oneDNN primitive than autocast's: bit for bit on that
EPYC (AVX512-BF16), at most a bfloat16 rounding apart elsewhere. Measured on one thread of that EPYC:
SmolLM2 4 prompts x 4 samples x 64 tokens generated in 3.3 s instead of 4.5 s in float32 and 2.2 s instead
of 2.7 s under bfloat16 autocast, packing included (0.15 s); the copies live only during the call. Packing
costs about one step's rearrangement, so a call of two decoding steps or more gains.
"""

from __future__ import annotations

import contextlib
import functools
import os
from pathlib import Path

import torch

from lit_ppo.errors import ConfigError

ENV = "LIT_PPO_FLOAT32_MATMUL"
"""The environment variable that chooses the float32 CPU kernels: 'onednn' or 'mkl'."""
CHOICES = ("onednn", "mkl")
SMALLEST_WEIGHT = 65536
"""Linear layers with fewer weights (in x out) keep torch's own product."""


@functools.cache
def onednn_chosen() -> bool:
    """Whether float32 CPU products go through oneDNN in this process (``ENV``, else by CPU vendor)."""
    choice = os.environ.get(ENV, "").strip().lower()
    if choice and choice not in CHOICES:
        raise ConfigError(f"{ENV}={os.environ[ENV]} is invalid: must be one of {', '.join(CHOICES)}")
    if not torch.backends.mkldnn.is_available():
        return False
    if choice:
        return choice == "onednn"
    return _cpu_vendor() != "GenuineIntel"


def _cpu_vendor() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("vendor_id"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def applies(*tensors: torch.Tensor) -> bool:
    """Whether a product of ``tensors`` goes through oneDNN: plain float32 tensors on CPU (not a sharded or
    other tensor subclass, which keeps torch's dispatch), outside autocast, oneDNN chosen."""
    return (all(type(t) in (torch.Tensor, torch.nn.Parameter) and t.device.type == "cpu" and t.dtype == torch.float32
                for t in tensors) and not torch.is_autocast_enabled("cpu") and onednn_chosen())


def _onednn_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    if x.shape[-1] == 0:  # oneDNN refuses a product over an empty sum (a weight gradient of no rows)
        out = x.new_zeros(*x.shape[:-1], weight.shape[0])
        return out if bias is None else out + bias
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ weight.T + bias`` without autograd, through oneDNN where ``applies`` to a weight of at least
    ``SMALLEST_WEIGHT`` elements (as ``use_onednn_linears`` converts the layer itself)."""
    if weight.numel() >= SMALLEST_WEIGHT and applies(x, weight):
        return _onednn_linear(x, weight, bias)
    return torch.nn.functional.linear(x, weight, bias)


def matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a @ b`` of two matrices without autograd, through oneDNN where ``applies`` to a ``b`` of at least
    ``SMALLEST_WEIGHT`` elements."""
    if b.numel() >= SMALLEST_WEIGHT and applies(a, b):
        return _onednn_linear(a, b.t())
    return a @ b


class _Linear(torch.autograd.Function):
    """``x @ W.T + b`` and its gradients, each product through oneDNN."""

    @staticmethod
    def forward(ctx, x, weight, bias):
        ctx.save_for_backward(x, weight)
        return _onednn_linear(x, weight, bias)

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        need_x, need_weight, need_bias = ctx.needs_input_grad
        grad_2d = grad.reshape(-1, grad.shape[-1])
        grad_x = _onednn_linear(grad, weight.t()) if need_x else None
        grad_weight = _onednn_linear(grad_2d.t(), x.reshape(-1, x.shape[-1]).t()) if need_weight else None
        grad_bias = grad_2d.sum(0) if need_bias else None  # False without a bias
        return grad_x, grad_weight, grad_bias


class Float32Linear(torch.nn.Linear):
    """``torch.nn.Linear`` whose float32 CPU products go through oneDNN where ``applies``; elsewhere (GPU,
    autocast, other dtypes) it is ``torch.nn.Linear`` itself. Same parameters, same state dict."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if applies(x, self.weight):
            return _Linear.apply(x, self.weight, self.bias)
        return super().forward(x)


def use_onednn_linears(model: torch.nn.Module) -> torch.nn.Module:
    """Make the plain ``torch.nn.Linear`` layers of ``model`` with at least ``SMALLEST_WEIGHT`` weights
    ``Float32Linear`` (in place; a no-op where oneDNN is not chosen)."""
    if onednn_chosen():
        for module in model.modules():
            if type(module) is torch.nn.Linear and module.weight.numel() >= SMALLEST_WEIGHT:
                module.__class__ = Float32Linear
    return model


class _PackedLinear(torch.nn.Linear):
    """A linear layer computing with the copy of its weight that ``packed_linears`` packed for oneDNN."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = self._packed_weight_dtype
        if dtype == torch.float32 and x.numel() == x.shape[-1]:
            # oneDNN computes a single float32 row with another kernel, whose sums the packed layout changes.
            return _onednn_linear(x, self.weight, self.bias)
        bias = None if self.bias is None else self.bias.to(dtype)
        return torch.ops.mkldnn._linear_pointwise(x.to(dtype), self._packed_weight, bias, "none", [], "")


def _packing_dtype(module: torch.nn.Module) -> torch.dtype | None:
    """The dtype of ``module``'s products where oneDNN computes them on CPU now (else None): float32 in a
    ``Float32Linear`` outside autocast, bfloat16 under autocast or in bfloat16 weights."""
    if type(module) not in (torch.nn.Linear, Float32Linear) or module.weight.numel() < SMALLEST_WEIGHT:
        return None
    weight = module.weight
    if type(weight) is not torch.nn.Parameter or weight.device.type != "cpu":
        return None
    dtype = torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else weight.dtype
    if dtype == torch.float32 and type(module) is Float32Linear and applies(weight):
        return dtype
    if dtype == torch.bfloat16 and _onednn_bfloat16():
        return dtype
    return None


@functools.cache
def _onednn_bfloat16() -> bool:
    """Whether oneDNN has bfloat16 kernels on this CPU (AVX512-BF16 or AMX)."""
    return torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()


@contextlib.contextmanager
def packed_linears(model: torch.nn.Module, rows: int):
    """Within the block, ``model``'s plain linear layers on CPU compute with copies of their weights packed
    once for oneDNN's products over about ``rows`` rows (module docstring), in the dtype they compute in
    now (autocast's or their own); the layers are as before on the way out. Without gradients only (the
    packed copies are not the parameters): for decoding."""
    if torch.is_grad_enabled():
        raise RuntimeError("packed_linears computes without gradients: enter it under torch.no_grad()")
    packed = []
    try:
        for module in model.modules():
            dtype = _packing_dtype(module)
            if dtype is None:
                continue
            module._packed_weight = torch.ops.mkldnn._reorder_linear_weight(module.weight.detach().to(dtype), rows)
            module._packed_weight_dtype = dtype
            packed.append((module, module.__class__))
            module.__class__ = _PackedLinear
        yield
    finally:
        for module, cls in packed:
            module.__class__ = cls
            del module._packed_weight, module._packed_weight_dtype
