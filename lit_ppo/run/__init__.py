"""Layer 5, a run's records: its directory and loggers (``tracking``), the MLflow store, the lock that
keeps one writer per run directory, resuming from a checkpoint, exporting its policy and comparing runs."""
