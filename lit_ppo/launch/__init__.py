"""Layer 7, a run from its config, under every front door (the command line, the Python API, a Ray
worker, a sweep): Hydra presets composed into LightningCLI's tree (``compose``, ``presets``), the tree
checked before anything loads (``check``, each mistake one line: ``explain``), and ``run``'s verbs,
``check(tree, subcommand, ckpt_path)`` and ``run(subcommand, tree, ckpt_path)``, which hand it to
``LitPPOCLI`` (``lightning_cli``). Nothing here reads argv or chooses an exit code: ``lit_ppo.cli``
does. This file imports nothing, so that composing a config loads no torch."""
