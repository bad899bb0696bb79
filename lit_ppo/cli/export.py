"""``python -m lit_ppo export --ckpt_path CKPT --output DIR [--adapter ADAPTER_DIR] [--overwrite]``: a
checkpoint's policy as a Hugging Face model directory (``lit_ppo.run.export``)."""

from __future__ import annotations

from lit_ppo.cli.args import ArgParser, asks_for_help, print_error
from lit_ppo.errors import ConfigError, RunStopped
from lit_ppo.run.export import export
from lit_ppo.utils.quiet import quiet_dependencies

USAGE = "python -m lit_ppo export --ckpt_path CKPT [--output DIR] [--adapter ADAPTER_DIR] [--overwrite]"
"""Its own usage, which ``--help`` and a mistake show (``python -m lit_ppo --help`` shows the common form)."""


def main(argv: list[str]) -> int:
    """``export``; ``argv``: the command line after ``python -m lit_ppo``, ``export`` first. Returns the
    exit code (2 for bad input, 1 for a failed write, each with a one-line message)."""
    args = argv[1:]
    if asks_for_help(args):
        print(f"usage: {USAGE}")
        return 0
    parser = ArgParser(USAGE)
    parser.add_argument("--ckpt_path", required=True)
    parser.add_argument("--output")
    parser.add_argument("--adapter")
    parser.add_argument("--overwrite", action="store_true")
    try:
        options = parser.parse_args(args)
        quiet_dependencies()  # the error line, if any, is all that stderr shows
        paths = export(options.ckpt_path, options.output, options.overwrite, options.adapter)
    except ConfigError as e:
        print_error(str(e))
        return 2
    except RunStopped as e:
        print_error(str(e))
        return 1
    print(f"exported {options.ckpt_path} to {' and '.join(map(str, paths))}")
    return 0
