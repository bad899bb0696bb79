"""Sweep: every combination of a Hydra multirun grid as its own ``fit``, then the compare table.

``python -m lit_ppo sweep algo=grpo,drgrpo,rloo seed=0,1 [overrides] [--experiment NAME] [--metric M]
[--output PNG]`` expands the grid as Hydra's BasicSweeper does (``a,b``, ``range(...)``,
``choice(...)``, ``glob(...)`` over a config group; the last swept key varies fastest), checks every
combination's config as ``fit`` does before anything runs, then runs the combinations one after
another, each as its own ``python -m lit_ppo fit`` process, all tracked to one MLflow experiment
(default ``sweep-<YYYYmmdd-HHMMSS>``, handed to each fit as ``MLFLOW_EXPERIMENT_NAME``). It ends
with the compare table and figure (default ``<experiment>.png``) of exactly the runs it started.

A failed fit does not stop the others; the sweep then exits 1 naming the failed combinations.
SIGINT / SIGTERM is forwarded to the running fit, which finishes its iteration, saves
``last.ckpt`` and exits; no further fit starts and the sweep exits with 128 + the signal number.
Each fit has its own process group, so a Ctrl-C in the terminal reaches it once, through the
sweep: a second signal would make it abandon its iteration. A sweep that dies without handling a
signal (SIGKILL, the OOM killer) takes its fit with it: the fit watches a pipe that only the sweep holds
open (``lit_ppo.utils.stop_requests.stop_with_pipe``) and, once the sweep is gone, stops as on one SIGTERM:
it saves ``last.ckpt``, marks its MLflow run KILLED and exits.
"""

from __future__ import annotations

import codecs
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass

from hydra import initialize_config_dir
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException

from lit_ppo.cli import usage
from lit_ppo.cli.args import ArgParser, asks_for_help, print_error
from lit_ppo.errors import ConfigError, RunStopped
from lit_ppo.launch.explain import explain_hydra_error
from lit_ppo.launch.presets import conf_dir, group_options
from lit_ppo.run.compare import REWARD, check_output, compare
from lit_ppo.run.mlflow_store import check_mlflow_importable
from lit_ppo.utils.flags import split_arguments
from lit_ppo.utils.stop_requests import STOP_WITH_PIPE_ENV

USAGE = usage("sweep")
SIGNALS = (signal.SIGINT, signal.SIGTERM)
FOLLOW_INTERVAL_S = 0.1
"""How often the running fit's stderr is read for new lines."""
RUN_ID_LINE = re.compile(r"^mlflow run id: (\S+) \((.*), experiment .*\)$")
"""What a fit prints on stderr once its MLflow run exists (lit_ppo.run.tracked_run.start_mlflow_runs)."""


@dataclass
class Combination:
    """One point of the grid: the overrides of its fit and the swept values that tell it apart."""

    overrides: list[str]
    swept: dict[str, str]

    @property
    def label(self) -> str:
        return " ".join(f"{key}={value}" for key, value in self.swept.items())


def expand(overrides: list[str]) -> list[Combination]:
    """The grid of ``overrides`` (Hydra override syntax) in BasicSweeper's order; ConfigError naming
    the override that does not parse, sweeps nothing, or sweeps a range a grid cannot (``interval``)."""
    # The config loader lets glob(...) list a config group's options, as in a Hydra multirun.
    with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
        parser = OverridesParser.create(config_loader=GlobalHydra.instance().config_loader())
        parsed = []
        for text in overrides:
            try:
                (override,) = parser.parse_overrides([text])
            except HydraException as e:
                message = explain_hydra_error(e, group_options)
                raise ConfigError(message if text in message else f"override {text!r} does not parse: {message}") \
                    from None
            if override.is_sweep_override():
                if not override.is_discrete_sweep():
                    raise ConfigError(f"override {text!r}: a grid sweeps a,b / range(...) / choice(...) / glob(...), "
                                      f"not {override.value_type.name.lower().replace('_', ' ')}")
                if not list(override.sweep_string_iterator()):
                    groups = sorted(p.name for p in conf_dir().iterdir() if p.is_dir())
                    raise ConfigError(f"override {text!r} sweeps no values (glob(...) lists a config group's "
                                      f"options: {', '.join(groups)})")
            parsed.append(override)
        (grid,) = BasicSweeper.split_arguments(parsed, max_batch_size=None)
    swept = [o.get_key_element() for o in parsed if o.is_sweep_override()]
    combinations = []
    for items in grid:
        values = dict(item.split("=", 1) for item in items)
        combinations.append(Combination(items, {key: values[key] for key in dict.fromkeys(swept)}))
    return combinations


def check(combinations: list[Combination]) -> None:
    """Compose and validate every combination as ``fit`` does (no model is loaded), so that a bad
    value in the grid fails before the first fit spends its time."""
    # Lightning loads with the checks: only once the flags parse, so that --help and a flag's mistake print at once.
    from lit_ppo.launch.compose import compose
    from lit_ppo.launch.run import check as check_fit
    from lit_ppo.run.loggers import mlflow_loggers

    for i, combination in enumerate(combinations, 1):
        where = f"[{i}/{len(combinations)}] {combination.label or 'fit'}"
        try:
            with warnings.catch_warnings():  # each fit prints its own warnings
                warnings.simplefilter("ignore")
                tree = compose(combination.overrides)
                check_fit(tree)
        except ConfigError as e:
            raise ConfigError(f"{where}: {e}") from None
        if not mlflow_loggers(tree["trainer"].get("logger")):
            raise ConfigError(f"{where}: the logger tracks no MLflow run and a sweep compares MLflow runs: "
                              f"leave logger=mlflow (the default)")


class ForwardSignals:
    """While active, SIGINT / SIGTERM are recorded and forwarded to the running fit, not acted on."""

    def __init__(self) -> None:
        self.received: int | None = None
        self.child: subprocess.Popen | None = None
        self._previous: dict[int, object] = {}

    def __enter__(self) -> ForwardSignals:
        self._previous = {signum: signal.signal(signum, self._handle) for signum in SIGNALS}
        return self

    def __exit__(self, *exc_info) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)

    def _handle(self, signum: int, frame) -> None:
        self.received = self.received or signum
        self.forward(signum)

    def forward(self, signum: int) -> None:
        if self.child is not None and self.child.poll() is None:
            self.child.send_signal(signum)


def run_fit(overrides: list[str], env: dict[str, str], signals: ForwardSignals) -> tuple[int, str | None, str | None]:
    """Run one ``python -m lit_ppo fit`` to its end, its stderr passed through; (exit code, MLflow
    run id, tracking URI), the last two as the fit printed them (None if it stopped before)."""
    # The fit writes its stderr to an unlinked file that is read here, not to a pipe: a pipe would break
    # when the sweep dies, and the fit's next line (its stop message) would fail instead of saving.
    fd, path = tempfile.mkstemp(prefix=".lit_ppo-fit-", suffix=".stderr")
    source = open(path, "rb")
    os.unlink(path)
    # The fit stops when this process has ended, however it ends: it reads the pipe whose write end only this
    # process holds (non-inheritable), which reaches its end of file then.
    watched, alive = os.pipe()
    try:
        child = subprocess.Popen([sys.executable, "-m", "lit_ppo", "fit", *overrides], stderr=fd, process_group=0,
                                 env={**env, STOP_WITH_PIPE_ENV: str(watched)}, pass_fds=(watched,))
    except BaseException:
        source.close()
        os.close(alive)
        raise
    finally:
        os.close(fd)
        os.close(watched)
    signals.child = child
    if signals.received is not None:  # arrived while the fit was starting
        signals.forward(signals.received)
    run_id = uri = None
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    pending = ""
    with source:
        while True:
            ended = child.poll() is not None  # before reading: what it wrote before it ended is read next
            chunk = decoder.decode(source.read(), final=ended)
            if not chunk and ended:
                break
            if not chunk:
                time.sleep(FOLLOW_INTERVAL_S)
                continue
            *lines, pending = (pending + chunk).split("\n")
            for line in lines:
                sys.stderr.write(line + "\n")
                found = RUN_ID_LINE.match(line)
                if found:
                    run_id, uri = found.groups()
            sys.stderr.flush()
    if pending:
        sys.stderr.write(pending)
        sys.stderr.flush()
    code = child.wait()
    os.close(alive)
    signals.child = None
    return code, run_id, uri


def parser() -> ArgParser:
    """``sweep``'s flags, each described (the grid and the other overrides are fit's ``key=value``)."""
    out = ArgParser(USAGE, allow_abbrev=False, description=__doc__.split("\n\n", 1)[0] + (
        "\n\nkey=a,b / range(a,b) / choice(a,b) / glob(pattern) sweep a key or a config group; every other "
        "override\nis fit's (python -m lit_ppo fit --help lists the keys)."))
    out.add_argument("--experiment", metavar="NAME",
                     help="the MLflow experiment of every fit (default: sweep-<YYYYmmdd-HHMMSS>)")
    out.add_argument("--metric", default=REWARD, metavar="M",
                     help=f"the metric of the final comparison figure (default: {REWARD})")
    out.add_argument("--output", metavar="PNG", help="where the comparison figure is written (default: "
                                                      "<experiment>.png)")
    return out


def sweep(args: list[str]) -> int:
    """Parse, expand and check the grid, run every fit, print the comparison; the exit code."""
    overrides, flags = split_arguments(args)
    options = parser().parse_args(flags)
    if not overrides:
        raise ConfigError(f"nothing to sweep: give key=a,b overrides ({USAGE})")
    from lit_ppo.run.run_dir import as_file_name, run_name  # Lightning: once the flags parse, as in check
    experiment = options.experiment or run_name("sweep")
    output = options.output or f"{as_file_name(experiment)}.png"
    check_output(output)
    check_mlflow_importable()  # every fit tracks to MLflow
    combinations = expand(overrides)
    check(combinations)
    total = len(combinations)
    print(f"sweep: {total} fits into MLflow experiment {experiment}", flush=True)
    env = {**os.environ, "MLFLOW_EXPERIMENT_NAME": experiment}
    started: dict[str, dict[str, str]] = {}  # MLflow run id -> swept values
    uri = None
    failed = []
    attempted = 0
    with ForwardSignals() as signals:
        for i, combination in enumerate(combinations, 1):
            if signals.received is not None:
                break
            attempted = i
            where = f"[{i}/{total}] fit {combination.label}".rstrip()
            print(where, flush=True)
            code, run_id, run_uri = run_fit(combination.overrides, env, signals)
            if run_id:  # algo has its own column in the table
                started[run_id] = {key: value for key, value in combination.swept.items() if key != "algo"}
                uri = uri or run_uri
            if code != 0 and signals.received is None:
                failed.append(f"{where.replace(' fit ', ' ', 1)} (exit {code})")
    if started:
        try:
            compare(list(started), metric=options.metric, output=output, uri=uri, extra=started)
        except ConfigError as e:
            print_error(f"{e} (the runs are in experiment {experiment}: python -m lit_ppo compare --experiment "
                        f"{experiment})")
            if signals.received is None and not failed:
                return 2
        except RunStopped as e:  # the figure could not be written (a full disk)
            print_error(str(e))
            if signals.received is None and not failed:
                return 1
    if signals.received is not None:
        print(f"sweep stopped by {signal.Signals(signals.received).name} after {attempted} of {total} fits",
              file=sys.stderr)
        return 128 + signals.received
    if failed:
        print_error(f"{len(failed)} of {total} fits failed: {'; '.join(failed)}")
        return 1
    return 0


def main(argv: list[str]) -> int:
    """``sweep``; ``argv``: the command line after ``python -m lit_ppo``, ``sweep`` first. Returns the exit
    code (2 for bad input, with a one-line message)."""
    args = argv[1:]
    if asks_for_help(args):
        print(parser().format_help())
        return 0
    try:
        return sweep(args)
    except ConfigError as e:
        print_error(str(e))
        return 2
