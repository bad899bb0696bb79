"""Small helpers of the algorithm tests: build tensors, compare against hand-computed values."""

from __future__ import annotations

import torch


def tensor(x, dtype=torch.float32) -> torch.Tensor:
    return torch.tensor(x, dtype=dtype)


def assert_values(actual: torch.Tensor, expected, atol: float = 1e-6, rtol: float = 1e-6) -> None:
    """Shape and values, compared in float64 (dtype is checked separately where it matters)."""
    expected = torch.as_tensor(expected, dtype=torch.float64)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    torch.testing.assert_close(actual.detach().double(), expected, atol=atol, rtol=rtol)
