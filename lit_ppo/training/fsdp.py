"""FSDP2 (``trainer=fsdp``): per-layer sharding of LitPPO's models and the strategy that runs it.

``FSDP2Strategy`` is Lightning's ``ModelParallelStrategy`` with every rank in one data-parallel
dimension (no tensor parallelism), gloo on CPU and NCCL on GPU. ``LitPPO.configure_model`` calls
``shard_models``: ``fully_shard`` on each decoder layer and then on the root of the policy, the
critic and the reference separately (the reference has no optimizer state: nothing of it trains).

Checkpoints are distributed: each rank writes its own shards (``torch.distributed.checkpoint``)
into a directory named like the checkpoint file it replaces (``last.ckpt/``), with the rest of
the checkpoint (loop and data state, hyperparameters, the run record) in its ``meta.pt``. They are
as safe as single-file ones (``lit_ppo.training.checkpoint_io``): refused before writing if any rank holds a
non-finite tensor, written into a temporary directory that replaces the old one only when complete,
and carrying the SHA-256 of every shard file, checked before a resume, an evaluation or an export
uses them. ``python -m lit_ppo export`` consolidates them into one Hugging Face directory.
"""

from __future__ import annotations

import functools
import os
import shutil
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from lightning.pytorch.strategies import ModelParallelStrategy

from lit_ppo.errors import RunStopped
from lit_ppo.models import token_logprobs
from lit_ppo.training.checkpoint_files import (
    DISTRIBUTED_META,
    distributed_checkpoint_problem,
    first_non_finite,
    write_meta,
)
from lit_ppo.utils.fs import file_sha256, remove_stale_directories, replace_directory, temporary_directory


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The repeated transformer blocks of a transformers model (its ``_no_split_modules`` classes)."""
    names = set(getattr(model, "_no_split_modules", None) or [])
    layers = [m for m in model.modules() if type(m).__name__ in names]
    if not layers:
        raise ValueError(f"trainer=fsdp: cannot find the decoder layers of {type(model).__name__} "
                         f"(it names none in _no_split_modules)")
    return layers


def shard(model: torch.nn.Module, mesh, body: torch.nn.Module, forward_method: str) -> None:
    """``fully_shard`` each decoder layer of ``body``, then ``model`` (its embeddings, final norm and
    head). LitPPO calls the body and the head itself (chunked log-probs, values), not
    ``model.forward``: ``forward_method`` is registered so that FSDP gathers the root's parameters
    around it, and reduce-scatters their gradients, as it does around ``forward``."""
    from torch.distributed.fsdp import fully_shard, register_fsdp_forward_method

    for layer in decoder_layers(body):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    register_fsdp_forward_method(model, forward_method)


def shard_models(module, mesh) -> None:
    """Shard LitPPO's policy, critic and reference over ``mesh`` (idempotent: a second call, e.g. for
    an evaluation after fit, finds them sharded)."""
    from torch.distributed.fsdp import FSDPModule

    if isinstance(module.policy, FSDPModule):
        return
    for model in (module.policy, module.ref):
        if model is not None:
            # The log-prob pass as a method of the model itself, so that it can be FSDP's forward.
            model.token_logprobs = functools.partial(token_logprobs, model)
            shard(model, mesh, model.base_model, "token_logprobs")
    if module.critic is not None:
        shard(module.critic, mesh, module.critic.body, "values")


def full_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """The whole of a sharded (DTensor) tensor, gathered from every rank; a plain tensor as it is."""
    from torch.distributed.tensor import DTensor

    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


class FSDP2Strategy(ModelParallelStrategy):
    """FSDP2 over all ranks, with verified atomic distributed checkpoints (see the module docstring).

    Args:
        timeout: how long collectives wait for the slowest rank (a ``datetime.timedelta``).
    """

    def __init__(self, **kwargs: Any):
        for fixed in ("data_parallel_size", "tensor_parallel_size", "save_distributed_checkpoint"):
            if fixed in kwargs:
                raise ValueError(f"trainer.strategy.{fixed} is fixed by FSDP2Strategy (every rank data-parallel, "
                                 f"distributed checkpoints); use Lightning's ModelParallelStrategy to change it")
        super().__init__(data_parallel_size=1, tensor_parallel_size=1, save_distributed_checkpoint=True, **kwargs)

    def setup_environment(self) -> None:
        self._data_parallel_size = self.num_nodes * self.num_processes  # one FSDP dimension: every rank
        super().setup_environment()

    def save_checkpoint(self, checkpoint: dict[str, Any], filepath, storage_options: Any | None = None) -> None:
        if storage_options is not None:
            raise TypeError(f"{type(self).__name__}.save_checkpoint: storage_options is not supported, must be None")
        import torch.distributed.checkpoint as dcp

        path = Path(self.broadcast(os.path.abspath(os.fspath(filepath))))
        local = first_non_finite({"state_dict": checkpoint["state_dict"],
                                  "optimizer_states": checkpoint.get("optimizer_states", [])})
        found = self.broadcast_any(local)
        if found is not None:
            raise RunStopped(f"refusing to write checkpoint {path}: {found} is non-finite "
                             f"(the previous checkpoint is kept)")
        tmp = Path(self.broadcast(temporary_directory(path) if self.global_rank == 0 else None))
        self.barrier("checkpoint directory")
        try:
            state = {"state_dict": checkpoint.pop("state_dict")}
            state.update({f"optimizer_{i}": s for i, s in enumerate(checkpoint.pop("optimizer_states", []))})
            dcp.save(state, checkpoint_id=tmp)
            self.barrier("checkpoint shards")
            if self.global_rank == 0:
                shards = {f.name: file_sha256(f) for f in sorted(tmp.iterdir()) if f.name != DISTRIBUTED_META}
                write_meta(checkpoint, shards, tmp / DISTRIBUTED_META)
                replace_directory(tmp, path)
                remove_stale_directories(path)
        except BaseException:
            if self.global_rank == 0:
                shutil.rmtree(tmp, ignore_errors=True)
            raise
        self.barrier("checkpoint published")

    def load_checkpoint(self, checkpoint_path, weights_only: bool | None = None) -> dict[str, Any]:
        path = self.broadcast(os.fspath(checkpoint_path))
        problem = self.broadcast(distributed_checkpoint_problem(path) if self.global_rank == 0 else None)
        if problem is not None:
            raise RunStopped(f"checkpoint {path} {problem}")
        return super().load_checkpoint(path, weights_only=weights_only)

    def broadcast_any(self, value: str | None) -> str | None:
        """The first rank's non-None ``value``, on every rank (None when all are None)."""
        if not (dist.is_available() and dist.is_initialized()):
            return value
        values: list[str | None] = [None] * self.world_size
        dist.all_gather_object(values, value)
        return next((v for v in values if v is not None), None)
