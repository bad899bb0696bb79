"""Layer 0, helpers used by every layer above: text for one-line errors, registries, importing user code,
atomic files, command-line flags, stop signals, quiet dependency logs, sums and maxima over ranks, plain
config values. Imports nothing of lit_ppo but ``lit_ppo.errors``."""
