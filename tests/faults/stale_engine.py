"""A callback for fault tests: one rank's rollout engine stops receiving weights (it claims every new
version but keeps sampling with the weights it has)."""

from __future__ import annotations

import lightning as L


class StaleEngine(L.Callback):
    """From the first batch on, rank ``rank``'s engine ignores weight pushes."""

    def __init__(self, rank: int = 0):
        self.rank = rank

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        engine = trainer.datamodule.engine
        if trainer.global_rank != self.rank or getattr(engine, "is_stale", False):
            return

        def update_weights(weights, version):
            for _ in weights:  # consumed like a real push (a gathering iterator may need every rank)
                pass
            engine.version = version

        engine.update_weights = update_weights
        engine.is_stale = True
