"""``python -m lit_ppo compare [--experiment NAME] [--runs ID ...] [--metric M] [--output PNG]``: the
table and figure of tracked runs (``lit_ppo.run.compare``)."""

from __future__ import annotations

from lit_ppo.cli import usage
from lit_ppo.cli.args import ArgParser, asks_for_help, print_error
from lit_ppo.errors import ConfigError
from lit_ppo.run import compare as compare_runs
from lit_ppo.run.compare import DEFAULT_OUTPUT, REWARD, compare

USAGE = usage("compare")


def main(argv: list[str]) -> int:
    """``compare``; ``argv``: the command line after ``python -m lit_ppo``, ``compare`` first. Returns the
    exit code (2 for bad input, with a one-line message)."""
    args = argv[1:]
    if asks_for_help(args):
        print(compare_runs.__doc__.split("\n\n", 1)[0] + "\n\nusage: " + USAGE)
        return 0
    parser = ArgParser(USAGE, allow_abbrev=False)
    parser.add_argument("--experiment")
    parser.add_argument("--runs", nargs="+")
    parser.add_argument("--metric", default=REWARD)
    parser.add_argument("--output", default=DEFAULT_OUTPUT)
    try:
        options = parser.parse_args(args)
        compare(options.runs, options.experiment, options.metric, options.output)
    except ConfigError as e:
        print_error(str(e))
        return 2
    return 0
