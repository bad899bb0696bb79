"""``python -m lit_ppo <subcommand>``: the command line, whose subcommands lit_ppo.cli lists."""

import sys

from lit_ppo.cli import main

if __name__ == "__main__":
    sys.exit(main())
