"""Two paths swapped in one step: Linux's ``renameat2(RENAME_EXCHANGE)``, called through the C library.

A directory cannot be renamed onto a non-empty one, so replacing it by renames leaves an instant with
nothing at its path. An exchange has none: each name holds one of the two directories at every
instant, and a kill leaves either the old one or the new one there. It needs Linux 3.15 or later, a C
library with ``renameat2`` (glibc 2.28 or later) and a filesystem that supports the flag (ext4, XFS,
Btrfs, tmpfs and overlayfs do; NFS, CIFS and FUSE filesystems that do not implement it do not). Elsewhere
(macOS, Windows) ``exchange`` says so and changes nothing.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import os
import sys
from typing import Callable

AT_FDCWD = -100
"""``renameat2``'s "relative to the working directory" (the paths given are absolute anyway)."""
RENAME_EXCHANGE = 1 << 1
"""The flag of ``renameat2`` that swaps its two paths (linux/fs.h)."""
_CANNOT = {errno.ENOSYS, errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP}
"""The errors of a kernel or a filesystem that cannot exchange (EINVAL: a filesystem that takes no flag)."""


@functools.cache
def _renameat2() -> Callable[..., int] | None:
    """The C library's ``renameat2``, or None where there is none."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        function = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    function.restype = ctypes.c_int
    return function


def exchange(first: str | os.PathLike, second: str | os.PathLike) -> bool:
    """Swap the two existing paths ``first`` and ``second`` atomically; False, with nothing changed, where
    this system or their filesystem cannot (see the module docstring); OSError for any other failure."""
    renameat2 = _renameat2()
    if renameat2 is None:
        return False
    if renameat2(AT_FDCWD, os.fsencode(first), AT_FDCWD, os.fsencode(second), RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in _CANNOT:
        return False
    raise OSError(code, os.strerror(code), os.fspath(first), None, os.fspath(second))
