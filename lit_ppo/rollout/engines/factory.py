"""Building a rank's rollout engine from ``RolloutConfig``: the HF engine on the rank's device (or one of
``rollout.devices``), or a vLLM engine per rank, started as one of torchrun's processes.

The HF engine of the synchronous loop samples from the trainer's policy itself: sampling and training
take turns, so no second copy of the weights is needed. It gets a copy of its own whenever that does
not hold: asynchronous rollouts (the producer samples while the trainer trains), another dtype or
device, or a policy that the trainer gathered or merged for it (FSDP2, LoRA).
"""

from __future__ import annotations

import os

import torch

from lit_ppo.config.rollout import RolloutConfig
from lit_ppo.rollout.engines.hf import HFEngine
from lit_ppo.rollout.engines.protocol import RolloutEngine
from lit_ppo.rollout.engines.vllm import VLLMEngine


def engine_device(devices: list[int], local_rank: int) -> torch.device:
    """The CUDA device of ``rollout.devices`` at position ``local_rank``."""
    if local_rank >= len(devices):
        raise ValueError(f"rollout.devices={devices} has no device for local rank {local_rank}: list one "
                         f"CUDA device per rank of a node")
    return torch.device("cuda", devices[local_rank])


def build_engine(rollout: RolloutConfig, policy: torch.nn.Module, tokenizer, *, is_trained_policy: bool,
                 device: torch.device, autocast: str | None, global_rank: int, local_rank: int, world_size: int,
                 version: int) -> RolloutEngine:
    """The engine of one rank, sampling with ``policy``'s weights as policy version ``version``.

    Args:
        rollout: which engine, its settings, and whether rollouts run ahead of the trainer.
        policy: a plain transformers model of the policy's weights.
        tokenizer: the policy's tokenizer.
        is_trained_policy: ``policy`` is the very model the trainer updates (not a gathered or merged
            copy), which the synchronous HF engine may then sample from without a copy.
        device: the rank's device (the HF engine's unless ``rollout.devices`` names one).
        autocast: the trainer's autocast dtype ('bfloat16', 'float16' or None), which the HF engine
            takes on so that it computes what the trainer recomputes (``rollout.engine_kwargs.autocast``
            overrides it).
        global_rank, local_rank, world_size: the rank's place in the run.
        version: the policy version of ``policy``'s weights.
    """
    if rollout.engine == "hf":
        if rollout.devices is not None:
            device = engine_device(rollout.devices, local_rank)
        # Under trainer.precision=bf16-mixed / 16-mixed the engine autocasts as the trainer does, on
        # every thread (the producer's does not inherit the trainer's autocast): same log-probs.
        kwargs = {"autocast": autocast, **rollout.engine_kwargs}
        share = (is_trained_policy and rollout.max_head_offpolicyness == 0 and rollout.devices is None
                 and kwargs.get("dtype") in (None, "auto"))
        engine = HFEngine(policy, tokenizer, device=device, share_weights=share, **kwargs)
    else:
        if world_size > 1:
            # One engine per rank through vLLM's external launcher, which reads the torchrun
            # variables; Lightning's own launcher does not set RANK.
            os.environ.update(RANK=str(global_rank), LOCAL_RANK=str(local_rank), WORLD_SIZE=str(world_size))
        engine = VLLMEngine(policy, tokenizer, seed=rollout.seed + global_rank, **rollout.engine_kwargs)
    engine.version = version
    return engine
