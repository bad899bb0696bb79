"""What each worker of a ``scheduler=ray`` job runs (lit_ppo.schedulers.ray): its rank of the fit,
through LitPPOCLI with Ray's Lightning integration. Imports Ray: only a Ray job loads this module."""

from __future__ import annotations

import os

import lightning as L
import ray
from ray.train.lightning import RayDDPStrategy, RayLightningEnvironment, prepare_trainer

from lit_ppo.callbacks.graceful_stop import stop_message
from lit_ppo.launch.lightning_cli import LitPPOCLI
from lit_ppo.launch.run import run
from lit_ppo.utils.quiet import quiet_expected_output
from lit_ppo.utils.stop_requests import record_signal


class DriverStop(L.Callback):
    """Stops the fit at an iteration's end once the driver has received a stop signal, and tells the
    driver where it stopped.

    Args:
        stop: the driver's StopRequest actor.
    """

    def __init__(self, stop):
        self.stop = stop

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        self._record_driver_signal()  # GracefulStop, a module callback and so after this one, stops every rank

    def on_train_end(self, trainer, pl_module) -> None:
        # The driver says how the job ended: a worker's own output reaches its terminal through Ray's log
        # forwarding, which may still hold the last lines when the job ends.
        if trainer.is_global_zero:
            # Rank 0 may have asked before the signal came, and stopped with the rank that saw it.
            self._record_driver_signal()
            ray.get(self.stop.report.remote(stop_message(trainer)))

    def _record_driver_signal(self) -> None:
        signum = ray.get(self.stop.get.remote())
        if signum is not None:
            record_signal(signum)


class RayWorkerCLI(LitPPOCLI):
    """LitPPOCLI on a Ray Train worker: Ray's DDP strategy and cluster environment, checked by
    ``prepare_trainer``, and the driver's stop signal."""

    def __init__(self, args: list[str], stop):
        super().__init__(args, trainer_defaults={"callbacks": [DriverStop(stop)]})

    def instantiate_trainer(self, **kwargs):
        plugins = self._get(self.config_init, "trainer", default={}).get("plugins") or []
        plugins = plugins if isinstance(plugins, list) else [plugins]
        kwargs.update(strategy=RayDDPStrategy(), plugins=[*plugins, RayLightningEnvironment()])
        return prepare_trainer(super().instantiate_trainer(**kwargs))


def fit_on_worker(job: dict) -> None:
    """Ray Train's train function: run this worker's rank of the fit the driver composed.

    ``job``: tree (LightningCLI config), flags (LightningCLI flags), cwd (the driver's directory),
    env (variables to set), stop (the StopRequest actor)."""
    os.chdir(job["cwd"])  # Ray starts workers in a directory of its own
    os.environ.update(job["env"])
    quiet_expected_output()
    run("fit", job["tree"], flags=job["flags"], builder=lambda args: RayWorkerCLI(args, job["stop"]))
