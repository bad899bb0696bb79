"""The compare figure (lit_ppo.run.compare.draw), read back from its axes: ticks at whole iterations."""

from __future__ import annotations

from lit_ppo.run.compare import draw


def shown_ticks(axes) -> list[float]:
    low, high = axes.get_xlim()
    return [float(t) for t in axes.get_xticks() if low <= t <= high]


def test_a_short_run_is_a_line_from_its_untrained_point_on_whole_iteration_ticks(tmp_path):
    figure = draw({"short": ([0, 2], [0.1, 0.4])}, {"short": "grpo"}, "eval/accuracy", tmp_path / "short.png")
    (axes,) = figure.axes
    (line,) = axes.lines
    assert list(line.get_xdata()) == [0, 2]  # the untrained score at iteration 0 and the final one: a line
    ticks = shown_ticks(axes)
    assert ticks == [0.0, 1.0, 2.0]
    assert (tmp_path / "short.png").stat().st_size > 0


def test_a_single_point_gets_its_own_iteration_as_tick_not_fractions_around_it(tmp_path):
    figure = draw({"one": ([1], [0.5])}, {"one": "grpo"}, "rollout/reward_mean", tmp_path / "one.png")
    assert shown_ticks(figure.axes[0]) == [1.0]  # MaxNLocator(integer=True) alone: 0.945, 0.96, ..., 1.05


def test_ticks_stay_whole_numbers_for_longer_runs(tmp_path):
    figure = draw({"a": ([0, 20, 40], [0.1, 0.5, 0.9]), "b": (list(range(1, 8)), [0.2] * 7)},
                  {"a": "grpo", "b": "rloo"}, "eval/accuracy", tmp_path / "two.png")
    ticks = shown_ticks(figure.axes[0])
    assert len(ticks) >= 2 and all(t == int(t) for t in ticks)
