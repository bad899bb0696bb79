"""Small helpers of the unit tests: build tensors, compare them against hand-computed values, compare
two models' weights."""

from __future__ import annotations

import torch


def tensor(x, dtype=torch.float32) -> torch.Tensor:
    return torch.tensor(x, dtype=dtype)


def assert_values(actual: torch.Tensor, expected, atol: float = 1e-6, rtol: float = 1e-6) -> None:
    """Shape and values, compared in float64 (dtype is checked separately where it matters)."""
    expected = torch.as_tensor(expected, dtype=torch.float64)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    torch.testing.assert_close(actual.detach().double(), expected, atol=atol, rtol=rtol)


def same_weights(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    """The same parameter and buffer names holding equal tensors."""
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)
