"""``python -m lit_ppo export --ckpt_path CKPT --output DIR [--adapter ADAPTER_DIR] [--overwrite]``: a
checkpoint's policy as a Hugging Face model directory (``lit_ppo.run.export``)."""

from __future__ import annotations

import argparse
import sys

from lit_ppo.errors import ConfigError, RunStopped
from lit_ppo.run.export import export
from lit_ppo.utils.quiet import quiet_dependencies

USAGE = "usage: python -m lit_ppo export --ckpt_path CKPT [--output DIR] [--adapter ADAPTER_DIR] [--overwrite]"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):
        raise ConfigError(f"{message} ({USAGE.removeprefix('usage: ')})")


def main(argv: list[str]) -> int:
    """``export`` subcommand; returns the exit code (2 for bad input, 1 for a failed write, each with a
    one-line message)."""
    parser = _Parser(prog="python -m lit_ppo export", add_help=False)
    parser.add_argument("--ckpt_path", required=True)
    parser.add_argument("--output")
    parser.add_argument("--adapter")
    parser.add_argument("--overwrite", action="store_true")
    if any(a in ("-h", "--help") for a in argv):
        print(USAGE)
        return 0
    try:
        args = parser.parse_args(argv)
        quiet_dependencies()  # the error line, if any, is all that stderr shows
        paths = export(args.ckpt_path, args.output, args.overwrite, args.adapter)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except RunStopped as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"exported {args.ckpt_path} to {' and '.join(map(str, paths))}")
    return 0
