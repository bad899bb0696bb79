"""One writer per run directory: an exclusive lock held for the life of the process that writes it.

Two processes continuing one run (two resumes of one checkpoint, a resume while the run still trains)
would interleave metrics in one MLflow run and replace each other's ``last.ckpt`` and ``model/``. The
process that owns a run (rank 0) takes ``flock`` on ``<run dir>/.lock``, which holds its pid, host and
command; the kernel releases the lock when that process ends in any way (SIGKILL included), so a
crashed run never blocks its resume; a process that outlives its run (the Python API) releases it when the
run ends. A second process is refused in one line naming the holder.
"""

from __future__ import annotations

import fcntl
import os
import socket
import sys
import time
from pathlib import Path

from lit_ppo.errors import ConfigError

LOCK_NAME = ".lock"
_held: dict[str, int] = {}  # run directory -> the open file descriptor that holds its lock


def lock_run_dir(run_dir: str | os.PathLike) -> None:
    """Take the run directory's lock for the rest of this process; ConfigError naming the process that
    holds it. Taking a lock this process holds already does nothing."""
    key = os.path.realpath(run_dir)
    if key in _held:
        return
    path = Path(key) / LOCK_NAME
    fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 4096, 0).decode("utf-8", "replace").strip() or "another process"
        os.close(fd)
        raise ConfigError(f"run directory {run_dir} is in use by {holder}: one process at a time continues a "
                          f"run (wait for it to end, or stop it with kill -TERM <pid> and resume from its "
                          f"last.ckpt)") from None
    # Child processes (DDP ranks, a launcher's workers) must not inherit the lock past this one's end.
    os.set_inheritable(fd, False)
    command = " ".join(sys.argv[1:3]) or "python"
    record = f"pid {os.getpid()} on {socket.gethostname()} (lit_ppo {command}, since {time.strftime('%H:%M:%S')})"
    os.ftruncate(fd, 0)
    os.pwrite(fd, record.encode(), 0)
    _held[key] = fd


def release_run_locks() -> None:
    """Release every run directory lock this process holds: a process that goes on after its run (the
    Python API's ``fit`` returning to a notebook) must not keep another from resuming it."""
    while _held:
        _, fd = _held.popitem()
        os.close(fd)  # closing the only descriptor of the open file releases its flock
