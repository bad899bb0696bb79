"""Command-line entry: ``python -m lit_ppo fit algo=<preset> [overrides]``."""

import sys


def main() -> int:
    print("lit_ppo: the training loop (`fit`) is not yet available; the algorithm core is importable "
          "from lit_ppo.algos and lit_ppo.config.", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
