"""Dynamic GAE lambda: one lambda per trajectory from its length (docs/algorithms.md#dynamic-gae-lambda).

``actor.gae_lambda`` is either a number or a dotted path to ``fn(ctx, **gae_lambda_kwargs)`` that
returns a ``[B]`` float tensor; the built-ins below are two such functions.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any, Callable

import torch

from lit_ppo.utils.imports import import_object


@dataclass
class GaeLambdaContext:
    """Per-trajectory lengths a lambda function may depend on; each field is a ``[B]`` long tensor."""

    effective_token_lengths: torch.Tensor
    """Generated (trainable) tokens per row, the stop token included."""
    turn_counts: torch.Tensor
    """Distinct assistant turns per row (zeros when the batch has no turn_ids)."""
    timestep_lengths: torch.Tensor
    """GAE steps per row: effective_token_lengths for unit 'token', turn_counts for unit 'turn'."""

    @classmethod
    def from_mask(cls, mask: torch.Tensor, turn_ids: torch.Tensor | None = None,
                  unit: str = "token") -> "GaeLambdaContext":
        """Context of a label-aligned ``[B, T]`` batch."""
        active = mask.bool()
        lengths = active.sum(1)
        if turn_ids is None:
            if unit == "turn":
                raise ValueError("gae_timestep_unit='turn' needs turn_ids in the batch")
            turns = torch.zeros_like(lengths)
        else:
            ids = torch.where(active, turn_ids.long(), torch.full_like(turn_ids, -1, dtype=torch.long))
            ids = ids.sort(dim=1).values
            first = torch.ones_like(ids[:, :1], dtype=torch.bool)
            new_id = torch.cat([first, ids[:, 1:] != ids[:, :-1]], dim=1)
            turns = (new_id & (ids >= 0)).sum(1)
        return cls(lengths, turns, turns if unit == "turn" else lengths)

    @classmethod
    def empty(cls) -> "GaeLambdaContext":
        """A batch of zero rows, to validate a lambda function and its kwargs before training."""
        z = torch.zeros(0, dtype=torch.long)
        return cls(z, z, z)


def _check_real(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"gae_lambda_kwargs.{name}={value!r} is invalid: must be a finite number")


def vapo_length_adaptive_gae(ctx: GaeLambdaContext, alpha: float) -> torch.Tensor:
    """VAPO length-adaptive lambda = 1 - 1 / (alpha * L), floored at 0; 0 for empty rows."""
    _check_real("alpha", alpha)
    if alpha <= 0:
        raise ValueError(f"gae_lambda_kwargs.alpha={alpha!r} is invalid: must be > 0")
    L = ctx.timestep_lengths.double()
    lam = (1.0 - 1.0 / (alpha * L.clamp(min=1.0))).clamp(min=0.0)
    return torch.where(L > 0, lam, torch.zeros_like(lam)).float()


def relative_position_gae_lambda(ctx: GaeLambdaContext, q: float) -> torch.Tensor:
    """lambda = q^(1 / (L - 1)): with gamma = 1 the first step keeps the fraction q of a terminal
    reward and the last keeps 1, the same at equal relative positions for every length L.
    lambda = 1 for L = 1 and 0 for L = 0."""
    _check_real("q", q)
    if not 0.0 < q <= 1.0:
        raise ValueError(f"gae_lambda_kwargs.q={q!r} is invalid: must be in (0, 1]")
    L = ctx.timestep_lengths.double()
    lam = torch.pow(torch.full_like(L, q), 1.0 / (L - 1.0).clamp(min=1.0))
    lam = torch.where(L == 1, torch.ones_like(lam), lam)
    return torch.where(L == 0, torch.zeros_like(lam), lam).float()


def constant_gae_lambda(ctx: GaeLambdaContext, value: float) -> torch.Tensor:
    """The same lambda for every row: what a number resolves to."""
    return torch.full(ctx.timestep_lengths.shape, value, dtype=torch.float32,
                      device=ctx.timestep_lengths.device)


def _import(path: str) -> Callable:
    fn = import_object(path, "gae_lambda", "function")
    if not callable(fn):
        raise ValueError(f"gae_lambda={path!r} is not a dotted path to a function")
    return fn


def _checked(fn: Callable, kwargs: dict, ctx: GaeLambdaContext) -> torch.Tensor:
    lam = fn(ctx, **kwargs)
    B = ctx.timestep_lengths.shape[0]
    if not isinstance(lam, torch.Tensor):
        raise TypeError(f"gae_lambda function must return a torch.Tensor, got {type(lam).__name__}")
    if tuple(lam.shape) != (B,):
        raise ValueError(f"gae_lambda function must return one value per local trajectory: shape ({B},), "
                         f"got {tuple(lam.shape)}")
    if lam.device != ctx.timestep_lengths.device:
        raise ValueError(f"gae_lambda function returned a tensor on {lam.device}, the batch is on "
                         f"{ctx.timestep_lengths.device}")
    if not lam.is_floating_point():
        raise TypeError(f"gae_lambda function must return a floating tensor, got {lam.dtype}")
    if not torch.isfinite(lam).all():
        raise ValueError("gae_lambda function returned non-finite values")
    return lam.detach().float()


def resolve_gae_lambda(spec: float | str, kwargs: dict) -> Callable[[GaeLambdaContext], torch.Tensor]:
    """The lambda function of ``actor.gae_lambda``: a constant for a number, else the imported
    function with ``kwargs`` bound and its return value checked."""
    if isinstance(spec, bool) or not isinstance(spec, (int, float, str)):
        raise ValueError(f"gae_lambda={spec!r} is invalid: must be a number or a dotted path")
    if isinstance(spec, str):
        if not spec:
            raise ValueError("gae_lambda='' is invalid: must be a number or a dotted path")
        return functools.partial(_checked, _import(spec), dict(kwargs))
    if not math.isfinite(spec):
        raise ValueError(f"Static gae_lambda must be finite, got {spec!r}")
    return functools.partial(constant_gae_lambda, value=float(spec))
