"""The arithmetic of the progress (``lit_ppo.callbacks.progress``): the time left at the mean pace, and when an
evaluation's plain lines are due. The lines themselves: tests/integration/test_progress.py."""

from __future__ import annotations

import math

import pytest

from lit_ppo.callbacks.progress import EVALUATION_LINE_SECONDS, EvaluationCount, remaining_seconds


def test_the_time_left_is_the_mean_pace_times_what_remains():
    assert remaining_seconds(30.0, 3, 10) == pytest.approx(70.0)  # 10 s each, 7 to go
    assert remaining_seconds(30.0, 10, 10) == 0.0
    assert remaining_seconds(30.0, 0, 10) is None  # no pace before the first
    assert remaining_seconds(30.0, 3, math.inf) is None  # no end


def counted_lines(problems: int, batches: list[int], seconds_each: float = 1.0) -> list[int]:
    """The counts at which ``EvaluationCount`` prints a line for batches of ``batches`` problems, one every
    ``seconds_each`` seconds."""
    count = EvaluationCount(problems, started=0.0)
    return [count.done for i, size in enumerate(batches) if count.add(size, (i + 1) * seconds_each)]


def test_an_evaluation_prints_a_line_per_tenth_and_the_last():
    # 200 problems, 8 at a time: 25 batches but 10 lines, at the first batch past each tenth.
    assert counted_lines(200, [8] * 25) == [24, 40, 64, 80, 104, 120, 144, 160, 184, 200]
    # Batches bigger than a tenth: a line each; a short last batch still ends on n/n.
    assert counted_lines(200, [64, 64, 64, 8]) == [64, 128, 192, 200]


def test_slow_batches_print_a_line_each_minute_at_least():
    # 1000 problems, 1 at a time, each taking a third of the minute: a line at every third batch (one a minute).
    assert counted_lines(1000, [1] * 9, seconds_each=EVALUATION_LINE_SECONDS / 3) == [3, 6, 9]
