"""A callback for distributed CLI tests: each rank writes what it trained and measured to a JSON file."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import lightning as L


class RankProbe(L.Callback):
    """Writes ``out_dir/rank<r>.json``: a digest of the rank's final policy weights, a digest of its
    initial ones, the mismatch metric of every iteration (mean over ranks, as logged) and the
    directory its checkpoints go to."""

    def __init__(self, out_dir: str):
        self.out_dir = Path(out_dir)
        self.mismatch: list[float] = []
        self.initial = ""

    @staticmethod
    def digest(module) -> str:
        h = hashlib.sha256()
        for name, p in module.policy.named_parameters():
            h.update(name.encode())
            h.update(p.detach().cpu().numpy().tobytes())
        return h.hexdigest()

    def on_train_start(self, trainer, pl_module) -> None:
        self.initial = self.digest(pl_module)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        value = trainer.callback_metrics.get("mismatch/logp_abs_diff")
        self.mismatch.append(None if value is None else float(value))

    def on_train_end(self, trainer, pl_module) -> None:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        checkpoint = trainer.checkpoint_callback
        record = {"world_size": trainer.world_size, "initial": self.initial, "final": self.digest(pl_module),
                  "mismatch": self.mismatch, "steps": trainer.global_step,
                  "ckpt_dir": os.path.abspath(checkpoint.dirpath) if checkpoint else None}
        (self.out_dir / f"rank{trainer.global_rank}.json").write_text(json.dumps(record))
