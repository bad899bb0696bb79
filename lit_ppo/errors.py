"""The exceptions a run reports as one line: a configuration mistake (exit code 2) and a run that stops
for a reason it can name (exit code 1)."""


class ConfigError(ValueError):
    """A configuration mistake, reported as one line (exit code 2)."""


class TrackingError(ConfigError):
    """The tracking store cannot be used; reported as one line (exit code 2) before any model loads."""


class RunStopped(RuntimeError):
    """The run stopped for the reason in its one-line message: a reward that is not a number, repeated
    non-finite optimizer steps, an engine that does not sample from the trainer's weights, a filter
    that starves the batch, a refused checkpoint. The CLI prints the message as one line (exit code
    1) and keeps the traceback in the run directory's ``error.log``."""
