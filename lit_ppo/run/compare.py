"""Compare: MLflow runs side by side, as one table and one figure.

``python -m lit_ppo compare [--experiment NAME] [--runs ID ...] [--metric M] [--output PNG]`` reads
the runs of an experiment (``MLFLOW_EXPERIMENT_NAME``, else ``lit_ppo``) or the runs given by id, id
prefix or name from the tracking store (``MLFLOW_TRACKING_URI``, else ``sqlite:///mlflow.db``), prints
one row per run in start order and draws ``--metric`` against the iteration, one line per run, to a PNG.

The columns, all read back from MLflow:

- iterations: the last step of ``rollout/reward_mean`` (MLflow steps are the iterations as the console
  prints them, from 1), so a finished run shows its ``trainer.max_steps``; for a run that logged none (an
  ``sft`` or ``rm`` run, compared by ``--metric rm/val_accuracy``, say), the last step of ``--metric``;
- final reward / best reward: the last and the largest value of ``rollout/reward_mean``;
- eval accuracy, kl, approx_kl, clip fraction, entropy: the last ``eval/accuracy``, ``actor/kl_ref`` (TRL's
  kl, to the reference or the teacher), ``actor/approx_kl`` (the policy's change per update),
  ``actor/clip_fraction``, ``actor/entropy`` (``-`` when the run logged none);
- it/s: iterations between the first and the last logged ``rollout/reward_mean`` divided by the
  wall-clock time between their MLflow timestamps. That is the rate of the training loop as a user
  waits for it (generation, update, weight sync, evaluation, checkpoints and logging all count),
  without model loading and the first iteration's warm-up, which only shift when the loop starts;
  ``-`` with fewer than two iterations.

The figure's x axis counts iterations in whole numbers, from 0 where a run scored its untrained policy
(``eval.before_training``), so that a run of a few iterations draws a line between whole ticks.
"""

from __future__ import annotations

import contextlib
import errno
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from lit_ppo.errors import ConfigError
from lit_ppo.run.mlflow_store import (
    check_mlflow_importable,
    probe_server,
    resolve_experiment,
    resolve_tracking_uri,
    sqlite_file,
)
from lit_ppo.utils.fs import user_path, write_file_atomically
from lit_ppo.utils.text import first_line

REWARD = "rollout/reward_mean"
DEFAULT_OUTPUT = "compare.png"
SHORT_ID = 8
"""Characters of a run id in the table's ``id`` column: enough to name the run in ``--runs``."""


@dataclass
class RunSummary:
    """One row of the table."""

    run_id: str
    name: str
    algo: str
    iterations: int
    final_reward: float | None
    best_reward: float | None
    iterations_per_s: float | None
    eval_accuracy: float | None
    kl: float | None
    approx_kl: float | None
    clip_fraction: float | None
    entropy: float | None


# ---------------------------------------------------------------------------------------------
# reading the store
# ---------------------------------------------------------------------------------------------

@contextlib.contextmanager
def _reading(uri: str) -> Iterator[None]:
    """Whatever the store says when it cannot answer (a damaged database, a server error), as one line."""
    from mlflow.exceptions import MlflowException
    from sqlalchemy.exc import SQLAlchemyError

    try:
        yield
    except (MlflowException, SQLAlchemyError, OSError) as e:
        raise ConfigError(f"MLflow tracking store {uri} cannot be read: {first_line(e)}") from None


def open_store(uri: str | None = None):
    """An MlflowClient of ``uri`` (None: the URI runs are tracked to) that exists and answers; a
    missing sqlite database is an error here, not created empty as MlflowClient would."""
    check_mlflow_importable()
    from mlflow.tracking import MlflowClient

    source = "MLFLOW_TRACKING_URI" if os.environ.get("MLFLOW_TRACKING_URI") else "the default tracking URI"
    uri = uri or resolve_tracking_uri(None)
    scheme = uri.split(":", 1)[0].lower()
    if scheme in ("http", "https"):
        probe_server(uri, source)
    elif scheme == "sqlite":
        database = sqlite_file(uri)
        if database and not Path(database).is_file():
            raise ConfigError(f"MLflow tracking store {uri} ({source}) does not exist: no run was tracked there "
                              f"(set MLFLOW_TRACKING_URI to the store the runs used)")
    with _reading(uri):
        return MlflowClient(uri)


def _experiment_source() -> str:
    return ("from MLFLOW_EXPERIMENT_NAME" if os.environ.get("MLFLOW_EXPERIMENT_NAME")
            else "the default: give --experiment NAME")


def select_runs(client, experiment: str | None, run_ids: list[str] | None) -> list:
    """The runs given by ``run_ids`` (ids, id prefixes or names; in ``experiment`` when it is given) or else all
    active runs of ``experiment`` (None: the experiment runs are tracked to), in start order."""
    uri = client.tracking_uri
    with _reading(uri):
        found = None
        if experiment is not None or not run_ids:
            name = experiment or resolve_experiment(None)
            where = f"--experiment {name}" if experiment else f"experiment {name} ({_experiment_source()})"
            found = client.get_experiment_by_name(name)
            if found is None or found.lifecycle_stage == "deleted":
                existing = sorted(e.name for e in client.search_experiments())
                raise ConfigError(f"{where}: no such experiment in {uri}; existing: {', '.join(existing) or 'none'}")
        if run_ids:
            runs = []
            for run_id in run_ids:
                run = _run_named(client, run_id, [found.experiment_id] if found is not None else None)
                if found is not None and run.info.experiment_id != found.experiment_id:
                    raise ConfigError(f"--runs {run_id}: the run is not in experiment {found.name}")
                runs.append(run)
        else:
            runs = _all_runs(client, [found.experiment_id])
            if not runs:
                raise ConfigError(f"{where}: the experiment has no runs in {uri}")
    return sorted(runs, key=lambda run: (run.info.start_time or 0, run.info.run_name or ""))


def _all_runs(client, experiment_ids: list[str]) -> list:
    """Every active run of the experiments, page by page."""
    runs, token = [], None
    while True:
        page = client.search_runs(experiment_ids, page_token=token)
        runs += page
        token = page.token
        if not token:
            return runs


def _run_named(client, given: str, experiment_ids: list[str] | None):
    """The run whose id is ``given``, else the one run whose id starts with it (as the table's ``id``
    column shows) or whose name it is (searched in ``experiment_ids``, None: every experiment); a
    ConfigError when none or several do."""
    from mlflow.exceptions import MlflowException

    try:
        return client.get_run(given)
    except MlflowException as e:
        if e.error_code not in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE"):
            raise
    experiment_ids = experiment_ids or [e.experiment_id for e in client.search_experiments()]
    runs = _all_runs(client, experiment_ids)
    by_id = [run for run in runs if run.info.run_id.startswith(given.lower())]
    if len(by_id) > 1:
        ids = ", ".join(sorted(run.info.run_id[:12] for run in by_id)[:4])
        raise ConfigError(f"--runs {given}: the prefix matches {len(by_id)} runs ({ids}): give more of the id")
    by_name = [run for run in runs if run.info.run_name == given]
    if len(by_name) > 1:
        ids = ", ".join(sorted(run.info.run_id[:SHORT_ID] for run in by_name))
        raise ConfigError(f"--runs {given}: {len(by_name)} runs have that name (ids {ids}): give the id of one")
    if not by_id + by_name:
        raise ConfigError(f"--runs {given}: no such run in {client.tracking_uri} (a run is given by its id, a "
                          f"prefix of it or its name)")
    return (by_id + by_name)[0]


def metric_history(client, run_id: str, metric: str) -> list:
    """The values of ``metric`` in step order (a step logged twice, by a resumed run, keeps its latest)."""
    with _reading(client.tracking_uri):
        by_step = {}
        for point in sorted(client.get_metric_history(run_id, metric), key=lambda m: (m.step, m.timestamp)):
            by_step[point.step] = point
    return list(by_step.values())


def summarize(client, run, metric: str = REWARD) -> RunSummary:
    """The row of ``run``; its iterations are those of ``metric`` where it logged no reward (an sft or rm run)."""
    rewards = metric_history(client, run.info.run_id, REWARD)
    steps = rewards or metric_history(client, run.info.run_id, metric)
    rate = None
    if len(rewards) >= 2 and rewards[-1].timestamp > rewards[0].timestamp:
        rate = (rewards[-1].step - rewards[0].step) / ((rewards[-1].timestamp - rewards[0].timestamp) / 1000)
    metrics = run.data.metrics  # MLflow keeps each metric's value at its last step here
    return RunSummary(
        run_id=run.info.run_id, name=run.info.run_name or run.info.run_id,
        algo=run.data.tags.get("algo") or run.data.params.get("algo") or "-",
        iterations=steps[-1].step if steps else 0,
        final_reward=rewards[-1].value if rewards else None,
        best_reward=max(point.value for point in rewards) if rewards else None,
        iterations_per_s=rate, eval_accuracy=metrics.get("eval/accuracy"), kl=metrics.get("actor/kl_ref"),
        approx_kl=metrics.get("actor/approx_kl"), clip_fraction=metrics.get("actor/clip_fraction"),
        entropy=metrics.get("actor/entropy"))


# ---------------------------------------------------------------------------------------------
# the table and the figure
# ---------------------------------------------------------------------------------------------

def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"


def format_table(summaries: list[RunSummary], extra: dict[str, dict[str, str]] | None = None) -> str:
    """Aligned plain text, one row per run: text columns left-aligned, numbers right-aligned.
    ``extra`` maps a run id to more ``{column: text}`` (a sweep's swept values), put after algo."""
    extra = extra or {}
    extra_columns = list(dict.fromkeys(column for row in extra.values() for column in row))
    header = ["run", "id", "algo", *extra_columns, "iterations", "final reward", "best reward", "eval accuracy", "it/s",
              "kl", "approx_kl", "clip fraction", "entropy"]
    numeric_from = 3 + len(extra_columns)
    rows = [[s.name, s.run_id[:SHORT_ID], s.algo,
             *[extra.get(s.run_id, {}).get(column, "-") for column in extra_columns],
             str(s.iterations), *map(_number, (s.final_reward, s.best_reward, s.eval_accuracy, s.iterations_per_s,
                                               s.kl, s.approx_kl, s.clip_fraction, s.entropy))]
            for s in summaries]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]

    def line(cells: list[str]) -> str:
        return "  ".join(cell.ljust(w) if i < numeric_from else cell.rjust(w)
                         for i, (cell, w) in enumerate(zip(cells, widths))).rstrip()

    return "\n".join([line(header), line(["-" * w for w in widths]), *[line(row) for row in rows]])


def check_output(output: str) -> Path:
    """The figure's path (``~`` expanded); ConfigError (one line) for one that is no .png file or that
    cannot be written."""
    path = user_path(output)
    if path.suffix.lower() != ".png":
        raise ConfigError(f"--output {output}: must be a .png file")
    if not path.parent.is_dir():
        raise ConfigError(f"--output {output}: directory {path.parent} does not exist")
    if path.is_dir():
        raise ConfigError(f"--output {output}: is a directory, must be a .png file")
    if not os.access(path.parent, os.W_OK | os.X_OK) or (path.exists() and not os.access(path, os.W_OK)):
        # access() refuses a read-only mount even to root, who may write anywhere else.
        reason = errno.EROFS if os.statvfs(path.parent).f_flag & os.ST_RDONLY else errno.EACCES
        where = path if path.exists() else path.parent
        raise ConfigError(f"--output {output}: cannot be written, {where} is not writable ({os.strerror(reason)})")
    return path


def curves(client, runs: list, metric: str) -> dict[str, tuple[list[int], list[float]]]:
    """``{run name: (iterations, values)}`` of the runs that logged ``metric``;
    ConfigError listing the metrics the runs have when none did."""
    out = {}
    for run in runs:
        history = metric_history(client, run.info.run_id, metric)
        if history:
            out[run.info.run_name or run.info.run_id] = ([p.step for p in history], [p.value for p in history])
    if not out:
        logged = sorted({name for run in runs for name in run.data.metrics})
        raise ConfigError(f"--metric {metric}: no selected run logged it; logged: {', '.join(logged) or 'none'}")
    return out


def draw(lines: dict[str, tuple[list[int], list[float]]], algos: dict[str, str], metric: str, output: Path):
    """One line per run, labelled by run name, one colour per algo (its runs, e.g. seeds, told apart by
    the line style), the legend beside the axes, ticks at whole iterations; rendered by the Agg canvas (no display
    needed). Returns the figure."""
    from matplotlib import colormaps
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    order = list(dict.fromkeys(algos[name] for name in lines))
    palette = colormaps["tab10" if len(order) <= 10 else "tab20"]
    styles = ("-", "--", ":", "-.")
    seen: dict[str, int] = {}
    figure = Figure(figsize=(12, 5), layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    for name, (x, y) in lines.items():
        algo = algos[name]
        style = styles[seen.get(algo, 0) % len(styles)]
        seen[algo] = seen.get(algo, 0) + 1
        axes.plot(x, y, label=name, color=palette(order.index(algo) % palette.N), linestyle=style,
                  marker="o" if len(x) <= 20 else None, linewidth=1.2)
    axes.set_xlabel("iteration")
    # At least one tick: a run's single point (one iteration) would otherwise get fractional ticks around it.
    axes.xaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))
    axes.set_ylabel(metric)
    axes.grid(alpha=0.3)
    figure.legend(loc="outside right upper", fontsize="small")
    write_file_atomically(output, lambda f: figure.savefig(f, format="png", dpi=100), "figure")
    return figure


def compare(run_ids: list[str] | None = None, experiment: str | None = None, metric: str = REWARD,
            output: str = DEFAULT_OUTPUT, uri: str | None = None,
            extra: dict[str, dict[str, str]] | None = None) -> Path:
    """Print the table of the selected runs and write the figure of ``metric``; every input is
    checked before anything is printed. Returns the PNG's path."""
    path = check_output(output)
    client = open_store(uri)
    runs = select_runs(client, experiment, run_ids)
    lines = curves(client, runs, metric)
    summaries = [summarize(client, run, metric) for run in runs]
    print(format_table(summaries, extra), flush=True)
    draw(lines, {summary.name: summary.algo for summary in summaries}, metric, path)
    print(f"figure of {metric}: {path}", flush=True)
    return path


