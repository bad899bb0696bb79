"""Real places that refuse writes, for fault tests: a file size limit (EFBIG, what a full disk looks
like to the writer, for any user), a small or read-only tmpfs (root, where mounting is permitted)."""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import subprocess
from pathlib import Path

import pytest


def _limit(limit: int) -> None:
    # Beyond the limit a write fails with EFBIG, once SIGXFSZ (which would kill the process) is ignored.
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))


def limit_file_size(limit: int):
    """``preexec_fn`` of a child process whose writes beyond ``limit`` bytes of any file fail (EFBIG)."""
    return lambda: _limit(limit)


@contextlib.contextmanager
def file_size_limit(limit: int):
    """This process's writes beyond ``limit`` bytes of any file fail (EFBIG) inside the block."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    handler = signal.getsignal(signal.SIGXFSZ)
    _limit(limit)
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, handler)


@contextlib.contextmanager
def mounted_tmpfs(path: Path, options: str):
    """A tmpfs mounted on the new directory ``path`` with ``options``; skips the test where mounting
    is not permitted (not root, no CAP_SYS_ADMIN)."""
    path.mkdir()
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], capture_output=True,
                            text=True)
    if result.returncode != 0:
        pytest.skip(f"mounting a tmpfs is not permitted here: {result.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", str(path)], check=True)


@contextlib.contextmanager
def read_only_directory(path: Path):
    """The new directory ``path``, which this process cannot write into: mode 0o555, or for root (whom
    modes do not stop) a read-only tmpfs."""
    if os.geteuid() == 0:
        with mounted_tmpfs(path, "ro,size=1m"):
            yield path
        return
    path.mkdir()
    path.chmod(0o555)
    try:
        yield path
    finally:
        path.chmod(0o755)
