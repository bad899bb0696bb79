"""Command-line entry: ``python -m lit_ppo fit algo=<preset> [overrides]`` (see lit_ppo.cli),
``python -m lit_ppo validate|test --ckpt_path CKPT`` (the test split's scores, see lit_ppo.cli),
``python -m lit_ppo export --ckpt_path CKPT --output DIR`` (see lit_ppo.run.export),
``python -m lit_ppo compare [--experiment NAME]`` (see lit_ppo.run.compare) and
``python -m lit_ppo sweep algo=grpo,rloo seed=0,1`` (see lit_ppo.cli.sweep)."""

import sys

USAGE = """usage: python -m lit_ppo fit [group=option ...] [key=value ...] [--print_config] [--LightningCLI.flags]
       python -m lit_ppo fit --config run.yaml [--trainer.max_steps N ...]
       python -m lit_ppo validate|test --ckpt_path CKPT [--eval.k N ...]   (or with fit's overrides)
       python -m lit_ppo export --ckpt_path CKPT --output DIR [--adapter DIR] [--overwrite]
       python -m lit_ppo compare [--experiment NAME] [--runs ID ...] [--metric M] [--output PNG]
       python -m lit_ppo sweep key=a,b [key=range(0,3) ...] [key=value ...] [--experiment NAME] [--metric M] [--output PNG]

model=NAME|DIR: tiny, smollm2 or a local Hugging Face causal LM directory
groups: algo, model, data, rollout, trainer, logger, rejection, scheduler"""
SUBCOMMANDS = ("fit", "validate", "test", "export", "compare", "sweep")


def main(argv: list[str] | None = None) -> int:
    """Run one subcommand; returns its exit code: 0 when it did its whole job, 2 for bad input, 1 for a
    failure, 128 + the signal number when a signal stopped it (143 SIGTERM, 130 SIGINT, 138 SIGUSR1)."""
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    from lit_ppo.utils.stop_requests import Stopped, exit_code, exit_on_signals, forget_stop_requests, signal_name

    forget_stop_requests()  # a request stops the command it arrived in, not a later one in this process
    with exit_on_signals():
        try:
            return _dispatch(argv)
        except Stopped as e:  # a subcommand that has nothing of its own to say about the signal
            sys.stderr.write(f"error: stopped by {signal_name(e.signum)} during {argv[0]}{STOPPED.get(argv[0], '')}\n")
            return exit_code(e.signum)


STOPPED = {"export": ": nothing was exported (the output directory is as it was)", "compare": ": no table"}
"""What a subcommand stopped by a signal leaves, after ``stopped by SIGTERM during <subcommand>``."""


def _dispatch(argv: list[str]) -> int:
    if argv[0] == "export":
        from lit_ppo.cli.export import main as export_main

        return export_main(argv[1:])
    if argv[0] == "compare":
        from lit_ppo.cli.compare import main as compare_main

        return compare_main(argv[1:])
    if argv[0] == "sweep":
        from lit_ppo.cli.sweep import main as sweep_main

        return sweep_main(argv[1:])
    if argv[0] not in ("fit", "validate", "test"):
        print(f"error: unknown subcommand {argv[0]!r}: must be one of {', '.join(map(repr, SUBCOMMANDS))}",
              file=sys.stderr)
        return 2
    from lit_ppo.cli.fit import run

    return run(argv)


if __name__ == "__main__":
    sys.exit(main())
