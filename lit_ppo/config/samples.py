"""The ``samples`` section: how often a fit logs sample completions of its training batches, and how many
(TRL's ``log_completions`` / ``num_completions_to_print``). The trainer presets' CompletionSamples takes its
arguments from here (``${samples.*}``); the rows go to ``<run dir>/samples.jsonl`` and the tracked run."""

from __future__ import annotations

from dataclasses import dataclass

from lit_ppo.config.checks import check_fields, check_positive_int, fail


@dataclass
class SamplesConfig:
    """Sample completions of the training batches (prompt, completion, reward), logged every few iterations."""

    every_n_iterations: int = 10
    """Log samples at iteration 1 and every this many iterations after it; 0 logs none."""
    count: int = 8
    """Rows (completions) per log."""

    def __post_init__(self) -> None:
        check_fields(self, "samples")
        if self.every_n_iterations < 0:
            fail("samples.every_n_iterations", self.every_n_iterations, "a number of iterations >= 0 (0: none)")
        check_positive_int("samples.count", self.count)
