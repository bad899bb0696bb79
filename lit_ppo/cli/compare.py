"""``python -m lit_ppo compare [--experiment NAME] [--runs ID ...] [--metric M] [--output PNG]``: the
table and figure of tracked runs (``lit_ppo.run.compare``)."""

from __future__ import annotations

from lit_ppo.cli import usage
from lit_ppo.cli.args import ArgParser, asks_for_help, print_error
from lit_ppo.errors import ConfigError, RunStopped
from lit_ppo.run import compare as compare_runs
from lit_ppo.run.compare import DEFAULT_OUTPUT, REWARD, compare

USAGE = usage("compare")


def parser() -> ArgParser:
    """``compare``'s flags, each described."""
    out = ArgParser(USAGE, allow_abbrev=False, description=compare_runs.__doc__.split("\n\n", 1)[0] + (
        "\nThe store: MLFLOW_TRACKING_URI, else sqlite:///mlflow.db."))
    out.add_argument("--experiment", metavar="NAME",
                     help="the MLflow experiment whose runs to compare (default: MLFLOW_EXPERIMENT_NAME, else lit_ppo)")
    out.add_argument("--runs", nargs="+", metavar="ID",
                     help="only these runs, each by its run id, a unique prefix of it (the table's id column) or "
                          "its run name")
    out.add_argument("--metric", default=REWARD, metavar="M",
                     help=f"the metric drawn against the iteration, one line per run (default: {REWARD})")
    out.add_argument("--output", default=DEFAULT_OUTPUT, metavar="PNG",
                     help=f"where the figure is written (default: {DEFAULT_OUTPUT})")
    return out


def main(argv: list[str]) -> int:
    """``compare``; ``argv``: the command line after ``python -m lit_ppo``, ``compare`` first. Returns the
    exit code (2 for bad input, 1 for a figure that cannot be written, each with a one-line message)."""
    args = argv[1:]
    if asks_for_help(args):
        print(parser().format_help())
        return 0
    try:
        options = parser().parse_args(args)
        compare(options.runs, options.experiment, options.metric, options.output)
    except ConfigError as e:
        print_error(str(e))
        return 2
    except RunStopped as e:  # the figure could not be written (a full disk)
        print_error(str(e))
        return 1
    return 0
