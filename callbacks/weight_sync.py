"""Push the policy's new weights to the rollout engine after every RL iteration."""

from __future__ import annotations

import time

import lightning as L


class WeightSync(L.Callback):
    """After each update, stream the policy's named parameters into the engine (version += 1 there
    too), so the next batch is sampled by the weights just trained. Added by LitPPO itself."""

    def on_train_batch_end(self, trainer: L.Trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        engine = getattr(trainer.datamodule, "engine", None)
        if engine is None or engine.version == pl_module.version:
            return  # no update happened this step (every group filtered out)
        start = time.perf_counter()
        engine.wake()
        engine.update_weights(pl_module.engine_weights(), version=pl_module.version)
        pl_module.log("time/sync_s", time.perf_counter() - start, on_step=True, on_epoch=False, batch_size=1)
