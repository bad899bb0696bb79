"""The model cache: where built or converted checkpoints live (``$LIT_PPO_CACHE`` or
``~/.cache/lit_ppo``).

Entries are published atomically: they are written to a dot-prefixed temporary directory that is renamed into
place when complete, so a killed build leaves at most a stale temporary directory (safe to delete),
never a half-written cache entry, and concurrent ranks building the same entry do not collide.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable

from lit_ppo.errors import ConfigError


def default_cache_dir() -> Path:
    """``$LIT_PPO_CACHE`` if set, else ``~/.cache/lit_ppo``."""
    return Path(os.environ.get("LIT_PPO_CACHE") or "~/.cache/lit_ppo").expanduser()


def cache_entry(cache_dir: str | Path | None, name: str) -> Path:
    """``cache_dir/name``; ``cache_dir`` None for ``default_cache_dir()``."""
    return Path(cache_dir if cache_dir is not None else default_cache_dir()).expanduser() / name


def _cached(cache_dir: str | Path | None, name: str, write: Callable[[Path], None]) -> Path:
    """``cache_dir/name``, calling ``write(tmp_dir)`` first if it does not exist yet.

    The entry appears in one ``rename`` of a complete temporary directory, so its existence means it
    is complete. If another process published it first, our copy is dropped and theirs is used.
    """
    final = cache_entry(cache_dir, name)
    if final.is_dir():
        return final
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{name}.", dir=final.parent))
    except OSError as e:
        setting = (f"model.cache_dir={cache_dir}" if cache_dir is not None else
                   f"LIT_PPO_CACHE={os.environ['LIT_PPO_CACHE']}" if os.environ.get("LIT_PPO_CACHE") else
                   f"the model cache {final.parent} (LIT_PPO_CACHE unset)")
        raise ConfigError(f"{setting}: cannot hold the model entry {name} that this run builds ({e.strerror or e}): "
                          f"give a writable directory") from None
    try:
        tmp.chmod(0o755)  # mkdtemp makes it private; the published entry should read like any directory
        write(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    try:
        tmp.rename(final)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        if not final.is_dir():  # not a lost race: a real error
            raise
    return final
