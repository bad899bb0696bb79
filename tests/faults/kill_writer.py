"""Child process of the SIGKILL test: writes a small checkpoint, says ``ready``, then writes a big one
to the same path (the test kills it during that write) and says ``done``.

usage: python kill_writer.py atomic|lightning PATH NUMEL
"""

from __future__ import annotations

import sys

import torch
from lightning.pytorch.plugins.io import TorchCheckpointIO

from lit_ppo.training.checkpoint_io import AtomicCheckpointIO

FIRST = {"state_dict": {"w": torch.arange(1000, dtype=torch.float32)}, "step": 1}
"""The good checkpoint that must survive the kill."""


def main(kind: str, path: str, numel: int) -> None:
    io = AtomicCheckpointIO() if kind == "atomic" else TorchCheckpointIO()
    io.save_checkpoint(FIRST, path)
    print("ready", flush=True)
    io.save_checkpoint({"state_dict": {"w": torch.ones(numel)}, "step": 2}, path)
    print("done", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
