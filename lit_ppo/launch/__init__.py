"""Layer 8, a run from its config, under every front door (the command line, the Python API, a Ray
worker, a sweep): Hydra presets composed into LightningCLI's tree (``compose``, ``presets``), the tree
checked before anything loads (``check``, each mistake one line: ``explain``), and ``run``'s verbs:
the jobs ``fit``, ``evaluate``, ``sft`` and ``rm`` (their trees from ``sft`` and ``rm``), each a sequence of
``check(tree, subcommand, ckpt_path)``, ``run(subcommand, tree, ckpt_path)``, which hands it to
``LitPPOCLI`` (``lightning_cli``) with the job's LightningModule and data module, and the failure left
pending. Nothing here reads argv or chooses an exit code: ``lit_ppo.cli`` does. This file imports
nothing, so that composing a config loads no torch."""
