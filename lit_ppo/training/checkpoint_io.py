"""Checkpoints written whole (``AtomicCheckpointIO``, which LitPPO and LitSFT install on every trainer).

A checkpoint whose weights or optimizer state hold a non-finite value is refused before anything is
written. Otherwise it is streamed into ``<dir>/.<name>.tmp-<random>`` in the destination directory, flushed
and fsynced, renamed onto ``<dir>/<name>`` with ``os.replace`` (atomic within one filesystem) and the
directory is fsynced: whatever kills the process, ``<name>`` is the previous checkpoint or the new one,
never a partial file. It carries the digest of its content (``lit_ppo.training.checkpoint_files``), which
loading checks. Retention removes, with the periodic checkpoint it drops, any older one that a killed
process left behind (``remove_checkpoint``). A write the filesystem refuses (a full disk, a quota, a
read-only mount, the file size limit) stops the run in one line naming the file and the reason
(``RunStopped``), the temporary file removed and the previous checkpoint kept. Lightning's
``TorchCheckpointIO`` stages the file in ``$TMPDIR`` instead; when that is another filesystem its final
move is a copy over the existing checkpoint, and a kill during the copy leaves a truncated file.
"""

from __future__ import annotations

import os
from typing import Any

from lightning.pytorch.plugins.io import TorchCheckpointIO
from lightning.pytorch.plugins.io.wrapper import _WrappingCheckpointIO

from lit_ppo.errors import RunStopped
from lit_ppo.training.checkpoint_files import DIGEST_KEY, PERIODIC_NAME, content_problem, scan, write_atomically


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning's torch checkpoint IO with atomic local writes, a content digest and a refusal to
    write or load non-finite weights / optimizer state (see the module docstring)."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path, storage_options: Any | None = None) -> None:
        if storage_options is not None:
            raise TypeError(f"{type(self).__name__}.save_checkpoint: storage_options is not supported, must be None")
        path = os.fspath(path)
        result = scan(checkpoint)
        if result.non_finite is not None:
            raise RunStopped(f"refusing to write checkpoint {path}: {result.non_finite} is non-finite "
                             f"(the previous checkpoint is kept)")
        content = {**checkpoint, DIGEST_KEY: result.digest}
        if "://" in path and not path.startswith("file://"):
            # Object stores replace an object in one request: a partial upload is never visible.
            super().save_checkpoint(content, path)
            return
        write_atomically(content, path.removeprefix("file://"))

    def remove_checkpoint(self, path) -> None:
        """Remove the periodic checkpoint that retention (ModelCheckpoint's ``save_top_k``) drops, and with
        it every older periodic checkpoint beside it: a process killed after writing a checkpoint and
        before removing the one it replaces leaves that one behind, and a resume from the newer one does
        not know it. Retention then converges at the next checkpoint written."""
        super().remove_checkpoint(path)
        local = os.fspath(path)
        if "://" in local and not local.startswith("file://"):
            return
        directory, name = os.path.split(local.removeprefix("file://"))
        dropped = PERIODIC_NAME.match(name)
        if dropped is None or not os.path.isdir(directory):
            return
        for entry in os.listdir(directory):
            older = PERIODIC_NAME.match(entry)
            if older is not None and int(older[1]) < int(dropped[1]):
                super().remove_checkpoint(os.path.join(directory, entry))

    def load_checkpoint(self, path, map_location: Any = lambda storage, loc: storage,
                        weights_only: bool | None = None) -> dict[str, Any]:
        checkpoint = super().load_checkpoint(path, map_location=map_location, weights_only=weights_only)
        problem = content_problem(checkpoint)
        if problem is not None:
            raise RunStopped(f"checkpoint {os.fspath(path)} {problem}")
        return checkpoint


def install_checkpoint_io(strategy) -> None:
    """Make ``strategy`` write through ``AtomicCheckpointIO``, unless the user chose their own
    checkpoint IO; a wrapper (e.g. AsyncCheckpointIO) around the default gets it inside."""
    current = strategy.checkpoint_io  # the getter fills in Lightning's default when none was given
    if type(current) is TorchCheckpointIO:
        strategy.checkpoint_io = AtomicCheckpointIO()
    elif isinstance(current, _WrappingCheckpointIO) and type(current.checkpoint_io) is TorchCheckpointIO:
        # The wrapper's public setter keeps an inner IO once set; the default one is replaced directly.
        current._checkpoint_io = AtomicCheckpointIO()
