"""What the subcommands share to read their arguments and report a mistake: one argument parser whose
mistakes are one-line ConfigErrors, the test for a request for help, and the ``error:`` line."""

from __future__ import annotations

import argparse
import sys

from lit_ppo.errors import ConfigError

HELP_FLAGS = ("-h", "--help")


class ArgParser(argparse.ArgumentParser):
    """A subcommand's flags. A mistake raises a ConfigError of one line that ends with the usage (the
    subcommand prints it with exit code 2); there is no ``-h`` flag: ``--help`` prints ``format_help()``.

    Args:
        usage: the usage line, ``python -m lit_ppo <subcommand> ...``.
        kwargs: more ``argparse.ArgumentParser`` arguments (``description``, ``allow_abbrev``).
    """

    def __init__(self, usage: str, **kwargs):
        super().__init__(usage=usage, add_help=False, formatter_class=argparse.RawDescriptionHelpFormatter,
                         **kwargs)

    def error(self, message: str):
        raise ConfigError(f"{message} ({self.usage})")


def asks_for_help(args: list[str]) -> bool:
    """Whether a subcommand's ``args`` hold ``-h`` or ``--help``: it prints its help and does nothing else."""
    return any(arg in HELP_FLAGS for arg in args)


def print_error(message: str) -> None:
    """``error: message`` as one write: the ranks of one run share stderr, and print writes the
    newline in a second call to the file, after which another rank's line may land."""
    sys.stderr.write(f"error: {message}\n")
    sys.stderr.flush()
