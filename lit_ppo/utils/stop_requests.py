"""Requests to stop this process's command: stop signals, and failures that let an iteration finish.

Every subcommand runs under ``exit_on_signals``: a signal raises ``Stopped`` wherever the main thread
is, so the command unwinds (temporary files removed, nothing half-published, an MLflow run marked
KILLED) and exits with 128 + the signal number: 143, 130, 138. Python's own defaults would end SIGTERM
without unwinding and turn SIGINT into a traceback with exit code 1. During training GracefulStop
(lit_ppo.callbacks.graceful_stop) replaces these handlers and stops at an iteration boundary instead;
both record the signal here, so ``received_signal`` answers for the whole command.

A process started by another lit_ppo command (a sweep's fit) stops the same way, on SIGTERM sent to itself once,
when that command ends however it ends (SIGKILL, the OOM killer): it watches a pipe whose only writer is the
starting process (``STOP_WITH_PIPE_ENV``), which closes when the last of its threads ends. A parent death signal
(``PR_SET_PDEATHSIG``) would come again each time a thread of the dying parent hands the child on to another.

A failure that leaves the trained state intact (the tracking store failing, lit_ppo.run.loggers) is
recorded with ``fail_after_iteration``: training stops at the next iteration boundary with
``last.ckpt``, as on a signal, and the command then fails with that one line (exit code 1).
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from typing import Iterator

SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)
STOP_WITH_PIPE_ENV = "LIT_PPO_STOP_WITH_PIPE"
"""The file descriptor of a pipe's read end that this process inherited from the command that started it: at its
end of file, that command has ended, and this one stops as on SIGTERM (``stop_with_pipe``)."""
_received: list[int] = []  # signals are per process, and so is the record of one
_failures: list[str] = []


class Stopped(BaseException):
    """A stop signal arrived outside the training loop. A BaseException, as KeyboardInterrupt is, so
    that no ``except Exception`` in between swallows it."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def received_signal() -> int | None:
    """The first stop signal this process received (since ``forget_stop_requests``), or None."""
    return _received[0] if _received else None


def record_signal(signum: int) -> None:
    """Remember ``signum`` as this process's stop signal, unless one came first."""
    if not _received:
        _received.append(signum)


def fail_after_iteration(message: str) -> None:
    """Stop training at the next iteration boundary, then fail the command with ``message`` (the first
    one recorded wins)."""
    if not _failures:
        _failures.append(message)


def pending_failure() -> str | None:
    """The message of the failure recorded by ``fail_after_iteration``, or None."""
    return _failures[0] if _failures else None


def stop_requested() -> bool:
    return bool(_received or _failures)


def forget_stop_requests() -> None:
    """Start a new record: a request stops the fit it arrived in, not a later one in this process."""
    _received.clear()
    _failures.clear()


def signal_name(signum: int) -> str:
    return signal.Signals(signum).name


def exit_code(signum: int) -> int:
    """The shell's convention for a command ended by ``signum``."""
    return 128 + signum


def _raise_stopped(signum: int, frame) -> None:
    record_signal(signum)
    raise Stopped(signum)


def stop_with_pipe() -> None:
    """Send this process SIGTERM once the pipe of ``STOP_WITH_PIPE_ENV`` (if it was given one) reaches its end
    of file, from a daemon thread that waits for it. The variable is taken out of the environment: the processes
    this one starts do not inherit the descriptor."""
    fd = os.environ.pop(STOP_WITH_PIPE_ENV, None)
    if fd is None:
        return

    def watch() -> None:
        try:
            while os.read(int(fd), 1):  # nothing is written: the read returns b"" when the writer has ended
                pass
        except (OSError, ValueError):  # no descriptor of this process: nothing to watch
            return
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="lit_ppo-stop-with-pipe", daemon=True).start()


@contextlib.contextmanager
def exit_on_signals() -> Iterator[None]:
    """Within the block, a stop signal raises ``Stopped`` in the main thread (elsewhere: no change,
    Python delivers signals to the main thread only); so does the end of the command that started this process
    (``stop_with_pipe``)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {signum: signal.signal(signum, _raise_stopped) for signum in SIGNALS}
    stop_with_pipe()
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
