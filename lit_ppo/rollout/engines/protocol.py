"""The rollout engine protocol: what the trainer needs from an inference engine.

An engine is colocated with the trainer (one per rank), samples completions for token-id prompts
and returns the behaviour log-prob of every sampled token under the distribution it sampled from
(after temperature, top-k / top-p and the allowed-token restriction), so the trainer can recompute
the same quantity exactly. Weights are pushed after every update and bump ``version``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Protocol, runtime_checkable

import torch


@dataclass
class SamplingParams:
    """How to sample one request."""

    n: int = 1
    """Completions per prompt (the group size G)."""
    max_new_tokens: int = 64
    """Generation budget; a completion that reaches it without a stop token is truncated."""
    temperature: float = 1.0
    """Logit temperature (> 0), or 0 for greedy decoding (evaluation)."""
    top_k: int = 0
    """Keep the k most likely tokens; 0 keeps all."""
    top_p: float = 1.0
    """Keep the smallest set of tokens whose probability reaches top_p; 1.0 keeps all."""
    stop_token_ids: list[int] = field(default_factory=list)
    """Tokens that end a completion (included in it); the tokenizer's EOS is always one."""
    allowed_token_ids: list[int] | None = None
    """Restrict sampling to these tokens (None: the whole vocabulary)."""
    seed: int | None = None
    """Seed of this request's sampling, for reproducible rollouts."""


@dataclass
class Completion:
    """One sampled completion of one prompt."""

    token_ids: list[int]
    """Generated tokens, the stop token included if one was sampled."""
    logprobs: list[float]
    """Behaviour log-prob of each generated token under the sampling distribution."""
    stopped: bool
    """True if the completion ended with a stop token; False if it hit max_new_tokens."""
    version: int
    """Policy version of the weights that sampled it (the engine's ``version`` during the call)."""


@runtime_checkable
class RolloutEngine(Protocol):
    version: int
    """Policy version of the weights the engine samples with."""

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[list[Completion]]:
        """``params.n`` completions for each prompt, in prompt order, each tagged with ``version``."""

    def update_weights(self, weights: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        """Load the policy's named parameters (streamed) and set ``version``."""

    def sleep(self) -> None:
        """Free accelerator memory while the trainer updates (no-op where not needed)."""

    def wake(self) -> None:
        """Undo ``sleep`` before the next ``generate``."""
