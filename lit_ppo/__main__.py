"""Command-line entry: ``python -m lit_ppo fit algo=<preset> [overrides]`` (see lit_ppo.cli) and
``python -m lit_ppo export --ckpt_path CKPT --output DIR`` (see lit_ppo.export)."""

import sys

USAGE = """usage: python -m lit_ppo fit [group=option ...] [key=value ...] [--print_config] [--LightningCLI.flags]
       python -m lit_ppo fit --config run.yaml [--trainer.max_steps N ...]
       python -m lit_ppo export --ckpt_path CKPT --output DIR [--overwrite]

model=NAME|DIR: tiny, smollm2 or a local Hugging Face causal LM directory
groups: algo, model, data, rollout, trainer, logger, rejection, scheduler"""


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    if argv[0] == "export":
        from lit_ppo.export import main as export_main

        return export_main(argv[1:])
    if argv[0] != "fit":
        print(f"error: unknown subcommand {argv[0]!r}: must be one of 'fit', 'export'", file=sys.stderr)
        return 2
    from lit_ppo.cli import run

    return run(argv)


if __name__ == "__main__":
    sys.exit(main())
