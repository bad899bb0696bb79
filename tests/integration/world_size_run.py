"""One RL iteration on fixed rollout groups, in one process or as one rank of a 2-rank DDP / FSDP2 run.

``python -m tests.integration.world_size_run BATCH OUT --devices N --strategy ddp|fsdp --mb_max_tokens M --groups SPEC``
trains LitPPO for one iteration on the groups of the saved RolloutBatch ``BATCH``: with one device on
all of them, with N devices rank r on the groups SPEC assigns it (``even``: groups r, r+N, ...;
``0:1,2,3|1:4`` style lists name them per rank). Rank 0 writes the updated policy weights, AdamW's
first moments (0.1 x the gradient after one step) and the logged metrics to ``OUT``.
"""

from __future__ import annotations

import argparse

import lightning as L
import torch

from lit_ppo.config import EvalConfig, GenerationConfig, ModelConfig, PPOActorConfig
from lit_ppo.rollout.batch import RolloutBatch
from lit_ppo.training.datamodule import RolloutDataModule
from lit_ppo.training.fsdp import FSDP2Strategy, full_tensor
from lit_ppo.training.module import LitPPO


def groups_of_rank(spec: str, n_groups: int, rank: int, world: int) -> list[int]:
    if spec == "even":
        return list(range(rank, n_groups, world))
    per_rank = dict(part.split(":") for part in spec.split("|"))
    return [int(g) for g in per_rank.get(str(rank), "").split(",") if g]


def rows_of_groups(batch: RolloutBatch, groups: list[int]) -> list[int]:
    starts = [0] + batch.group_sizes.cumsum(0).tolist()
    return [r for g in groups for r in range(starts[g], starts[g + 1])]


class FixedGroups(RolloutDataModule):
    """The saved batch's groups assigned to this rank, as the one batch of the run."""

    def __init__(self, path: str, spec: str, **kwargs):
        super().__init__(**kwargs)
        self.path, self.spec = path, spec

    def train_dataloader(self):
        batch: RolloutBatch = torch.load(self.path, weights_only=False)
        groups = groups_of_rank(self.spec, batch.num_groups, self.trainer.global_rank, self.trainer.world_size)
        mine = batch.select(rows_of_groups(batch, groups))
        mine.group_sizes = batch.group_sizes[groups]
        mine.metrics = {}
        return iter([mine])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("batch")
    parser.add_argument("out")
    parser.add_argument("--devices", type=int, default=1)
    parser.add_argument("--strategy", choices=("ddp", "fsdp"), default="ddp")
    parser.add_argument("--mb_max_tokens", type=int, default=16384)
    parser.add_argument("--minibatches", type=int, default=1)
    parser.add_argument("--groups", default="even")
    parser.add_argument("--cache", required=True)
    args = parser.parse_args()
    torch.manual_seed(0)
    actor = PPOActorConfig(kl_ctl=0.0, ppo_n_minibatches=args.minibatches, mb_max_tokens=args.mb_max_tokens,
                           reward_norm={"mean_level": "group", "std_level": "group"},
                           adv_norm={"mean_level": "batch", "std_level": "batch"},
                           # AdamW's first step moves each weight by lr * g / (|g| + eps): with the default
                           # eps 1e-8 a gradient entry near 0 turns rounding noise into a +-lr step.
                           optimizer={"lr": 1e-2, "eps": 1e-3})
    module = LitPPO(ModelConfig(cache_dir=args.cache), actor, algo="grpo")
    data = FixedGroups(args.batch, args.groups, gconfig=GenerationConfig(n_samples=4, max_new_tokens=4,
                                                                         restrict_to_task_tokens=True),
                       eval=EvalConfig(max_problems=0))
    strategy = "auto" if args.devices == 1 else FSDP2Strategy() if args.strategy == "fsdp" else "ddp"
    trainer = L.Trainer(accelerator="cpu", devices=args.devices, strategy=strategy,
                        max_steps=1, max_epochs=1, logger=False, enable_progress_bar=False, enable_model_summary=False,
                        enable_checkpointing=False, limit_val_batches=0)
    trainer.fit(module, datamodule=data)
    # Sharded tensors are gathered whole (a collective: every rank takes part).
    optimizer = module.optimizers().optimizer
    moments = {name: full_tensor(optimizer.state[p]["exp_avg"]).clone() for name, p in module.policy.named_parameters()
               if p in optimizer.state}
    weights = {k: full_tensor(v).clone() for k, v in module.policy.state_dict().items()}
    if trainer.is_global_zero:
        torch.save({"weights": weights, "exp_avg": moments,
                    "metrics": {k: float(v) for k, v in trainer.callback_metrics.items()},
                    "steps": trainer.global_step, "sharded": module.sharded}, args.out)


if __name__ == "__main__":
    main()
