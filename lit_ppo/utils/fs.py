"""Files and directories that appear whole or not at all.

A file is written into a hidden temporary file beside it, fsynced and renamed onto it (``os.replace`` is
atomic within one filesystem), then the directory is fsynced: whatever kills the process, the path holds
the previous content or the new one, never a partial file. A directory is written into a hidden
temporary directory beside it and published by exchanging the two (``replace_directory``), so that its
path holds the previous directory or the new one at every instant. Where the filesystem cannot exchange
(``lit_ppo.utils.exchange``), it is published by two renames instead; when a kill cuts that short between
them, the next writer puts the previous content back first (``restore_interrupted``).
A write that the filesystem refuses is one line naming the file and the reason (``RunStopped``).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import re
import secrets
import shutil
import stat
from pathlib import Path
from typing import BinaryIO, Callable

from lit_ppo.errors import RunStopped
from lit_ppo.utils.exchange import exchange


def user_path(path: str | os.PathLike) -> Path:
    """A path as a user gave it (a setting, a flag, a URI's file), ``~`` and ``~user`` expanded: the one
    place that happens, as a shell would have done for a path of its own."""
    return Path(os.path.expanduser(os.fspath(path)))


def shown_path(path: str | os.PathLike) -> str:
    """``path`` as a line shows it: relative to the working directory when it lies inside it (shorter to
    copy), else absolute."""
    absolute = Path(path).absolute()
    return str(absolute.relative_to(Path.cwd())) if absolute.is_relative_to(Path.cwd()) else str(absolute)


def existing_path(path: str | os.PathLike, where: str) -> Path:
    """``user_path(path)``, which must be a regular file or a directory: ValueError of one line that starts
    with ``where`` for one that is missing or of another kind (reading a named pipe would wait for a
    writer forever)."""
    p = user_path(path)
    if not p.exists():
        raise ValueError(f"{where}: no such file or directory")
    if not (p.is_file() or p.is_dir()):
        mode = p.stat().st_mode
        kind = ("a named pipe (FIFO)" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode)
                else "a device")
        raise ValueError(f"{where}: is {kind}, not a regular file or a directory: give a file it can read whole")
    return p


def _create_temp(directory: str, name: str) -> tuple[str, int]:
    """A new hidden file beside the destination; mode 0o666 lets the umask decide, as open() does."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
    while True:
        path = os.path.join(directory, f".{name}.tmp-{secrets.token_hex(8)}")
        try:
            return path, os.open(path, flags, 0o666)
        except FileExistsError:
            continue


def _fsync_directory(directory: str) -> None:
    """Make the rename durable. Some filesystems cannot fsync a directory; the rename has happened
    by then, so that is not a failed save."""
    if os.name != "posix":
        return
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError as e:
        if e.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EBADF):
            raise
    finally:
        os.close(fd)


def _remove_stale_temps(directory: str, name: str) -> None:
    """Temporary files of ``name`` left by writers that were killed (nothing can clean up after SIGKILL)."""
    prefix = f".{name}.tmp-"
    for entry in os.listdir(directory):
        if entry.startswith(prefix):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(directory, entry))


def os_error(error: BaseException) -> OSError | None:
    """The operating system's error behind a failed write, or None: ``error`` itself, one it was
    raised from or while handling (``torch.save`` reports its file's failed write as a RuntimeError
    raised while handling the OSError), or the one that safetensors' writer names in its message
    (``... (os error 28)``)."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, OSError):
            return error
        number = re.search(r"\(os error (\d+)\)", str(error))
        if number:
            return OSError(int(number[1]), os.strerror(int(number[1])))
        error = error.__cause__ or error.__context__
    return None


def write_file_atomically(path: str | os.PathLike, write: Callable[[BinaryIO], None], what: str) -> None:
    """``write(f)`` into a temporary file beside the local ``path``, fsynced and renamed onto it, so
    that ``path`` is never partially written. A write that the filesystem refuses (full, over quota,
    read-only, beyond the file size limit) is a RunStopped of one line naming ``what``, the file and the
    reason: the temporary file is removed and ``path`` keeps its previous content."""
    path = os.path.abspath(path)
    directory, name = os.path.split(path)
    temp = None
    try:
        os.makedirs(directory, exist_ok=True)
        _remove_stale_temps(directory, name)  # first: on a full disk their room is needed
        temp, fd = _create_temp(directory, name)
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temp, path)
    except BaseException as e:  # KeyboardInterrupt and SystemExit too: no temporary file is left behind
        if temp is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temp)
        cause = os_error(e) if isinstance(e, Exception) else None
        if cause is None:
            raise
        kept = f"the previous {what} is kept" if os.path.exists(path) else f"no {what} was written"
        raise RunStopped(f"cannot write {what} {path}: {cause.strerror or cause} ({kept})") from e
    _fsync_directory(directory)


def file_sha256(path: str | os.PathLike) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest()


def temporary_directory(path: str | os.PathLike) -> str:
    """A new hidden directory beside ``path`` to write its replacement into."""
    directory, name = os.path.split(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    while True:
        temp = os.path.join(directory, f".{name}.tmp-{secrets.token_hex(8)}")
        try:
            os.mkdir(temp)
            return temp
        except FileExistsError:
            continue


def replace_directory(temp: str | os.PathLike, path: str | os.PathLike) -> None:
    """Publish the complete directory ``temp`` as ``path``. An existing ``path`` is exchanged with ``temp``
    in one step (``lit_ppo.utils.exchange``), then its old content, now at ``temp``, is removed: a kill
    at any point leaves the old or the new directory at ``path``, and at most a temporary directory that
    the next writer removes (``remove_stale_directories``). Where the filesystem cannot exchange, the old
    one moves aside first (to ``.<name>.old-<random>``), as a directory cannot be renamed onto a non-empty
    one: a kill between the two renames leaves it there, complete, and the next writer puts it back
    first (``restore_interrupted``; ``read_checkpoint`` names it); an error between them moves it back."""
    path = os.path.abspath(path)
    directory, name = os.path.split(path)
    for root, _, files in os.walk(temp):  # the files' data, before the renames make them visible
        for entry in files:
            with open(os.path.join(root, entry), "rb") as f:
                os.fsync(f.fileno())
    if os.path.lexists(path) and exchange(temp, path):
        _fsync_directory(directory)
        _remove(temp)
        return
    old = None
    if os.path.lexists(path):
        old = os.path.join(directory, f".{name}.old-{secrets.token_hex(8)}")
        os.rename(path, old)
    try:
        os.rename(temp, path)
    except BaseException:
        if old is not None:
            os.rename(old, path)
        raise
    _fsync_directory(directory)
    if old is not None:
        _remove(old)


def _remove(path: str) -> None:
    """Remove what a replaced ``path`` held: a directory with its files, or a symlink (not its target)."""
    shutil.rmtree(path) if os.path.isdir(path) and not os.path.islink(path) else os.unlink(path)


def restore_interrupted(path: str | os.PathLike) -> str | None:
    """Put back the previous content of ``path`` when a ``replace_directory`` was killed between its two
    renames (``path`` gone, its old content set aside); the set-aside directory it came from, or None."""
    directory, name = os.path.split(os.path.abspath(path))
    if os.path.lexists(path) or not os.path.isdir(directory):
        return None
    aside = [os.path.join(directory, e) for e in os.listdir(directory) if e.startswith(f".{name}.old-")]
    if not aside:
        return None
    newest = max(aside, key=lambda p: os.lstat(p).st_ctime)  # a rename sets it: the last one set aside
    os.rename(newest, path)
    _fsync_directory(directory)
    return newest


def remove_stale_directories(path: str | os.PathLike) -> None:
    """Temporary and set-aside directories of ``path`` left by killed writers; a previous content that
    a killed writer had set aside and not yet replaced is put back as ``path`` instead."""
    directory, name = os.path.split(os.path.abspath(path))
    if not os.path.isdir(directory):
        return
    restore_interrupted(path)
    for entry in os.listdir(directory):
        if entry.startswith((f".{name}.tmp-", f".{name}.old-")):
            shutil.rmtree(os.path.join(directory, entry), ignore_errors=True)
