"""The exception of a run that stops for a reason it can name."""


class RunStopped(RuntimeError):
    """The run stopped for the reason in its one-line message: a reward that is not a number, repeated
    non-finite optimizer steps, an engine that does not sample from the trainer's weights, a filter
    that starves the batch, a refused checkpoint. The CLI prints the message as one line (exit code
    1) and keeps the traceback in the run directory's ``error.log``."""
