"""The processes of one run: whether this one is rank 0, and the variable through which rank 0 hands
the ranks it starts its run directory (``RUN_DIR_ENV``, set by ``lit_ppo.run.tracked_run.start``)."""

from __future__ import annotations

import os

RUN_DIR_ENV = "LIT_PPO_RUN_DIR"
"""The run directory that rank 0 chose, inherited by the ranks that Lightning starts."""
# Environment variables through which launchers tell a process its rank (Lightning's DDP launcher:
# LOCAL_RANK; torchrun: RANK, GROUP_RANK; SLURM: SLURM_PROCID; other nodes: NODE_RANK; LSF).
RANK_ENV = ("RANK", "LOCAL_RANK", "NODE_RANK", "GROUP_RANK", "SLURM_PROCID", "JSM_NAMESPACE_RANK")


def launched_as_rank_zero() -> bool:
    """Whether no launcher started this process as a rank other than 0."""
    return all(os.environ.get(key, "0") in ("", "0") for key in RANK_ENV)
