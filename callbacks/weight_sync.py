"""Push the policy's new weights to the rollout engine after every RL iteration."""

from __future__ import annotations

import time

import lightning as L

from lit_ppo.rollout.source import RolloutSource


class WeightSync(L.Callback):
    """After each update, stream the policy's named parameters into the engine (version += 1 there
    too), so the next batch is sampled by the weights just trained; then let an asynchronous
    producer (rollout.max_head_offpolicyness > 0) go on. Added by LitPPO itself."""

    def on_train_batch_end(self, trainer: L.Trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        datamodule: RolloutSource = trainer.datamodule  # LitPPO.on_fit_start made sure of it
        engine = datamodule.engine
        if engine is not None and engine.version != pl_module.version:  # else no update happened this step
            start = time.perf_counter()
            engine.wake()
            engine.update_weights(pl_module.engine_weights(), version=pl_module.version)
            pl_module.log("time/sync_s", time.perf_counter() - start, on_step=True, on_epoch=False, batch_size=1)
        datamodule.iteration_done()

    def on_exception(self, trainer: L.Trainer, pl_module, exception: BaseException) -> None:
        # Also a failure before training (LitPPO.on_fit_start refusing another datamodule, or none).
        if isinstance(trainer.datamodule, RolloutSource):
            trainer.datamodule.stop_producer(wait=False)  # the process is ending: no batch is awaited
