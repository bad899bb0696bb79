"""Layer 6, a run's records: its directory (``run_dir``), its processes, its loggers, the run a resume
continues (``continued``), its tracking from start to end (``tracked_run``), the MLflow store, the lock that
keeps one writer per run directory, resuming from a checkpoint, exporting its policy and comparing runs."""
