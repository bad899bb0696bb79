"""``python -m lit_ppo compare [--experiment NAME] [--runs ID ...] [--metric M] [--output PNG]``: the
table and figure of tracked runs (``lit_ppo.run.compare``)."""

from __future__ import annotations

import argparse
import sys

from lit_ppo.errors import ConfigError
from lit_ppo.run import compare as compare_runs
from lit_ppo.run.compare import DEFAULT_OUTPUT, REWARD, compare

USAGE = "usage: python -m lit_ppo compare [--experiment NAME] [--runs ID ...] [--metric M] [--output PNG]"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):
        raise ConfigError(f"{message} ({USAGE.removeprefix('usage: ')})")


def main(argv: list[str]) -> int:
    """``compare`` subcommand; returns the exit code (2 for bad input, with a one-line message)."""
    if any(a in ("-h", "--help") for a in argv):
        print(compare_runs.__doc__.split("\n\n", 1)[0] + "\n\n" + USAGE)
        return 0
    parser = _Parser(prog="python -m lit_ppo compare", add_help=False, allow_abbrev=False)
    parser.add_argument("--experiment")
    parser.add_argument("--runs", nargs="+")
    parser.add_argument("--metric", default=REWARD)
    parser.add_argument("--output", default=DEFAULT_OUTPUT)
    try:
        args = parser.parse_args(argv)
        compare(args.runs, args.experiment, args.metric, args.output)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0
