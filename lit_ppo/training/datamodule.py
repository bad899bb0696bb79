"""RolloutDataModule: prompts in, RolloutBatch objects out (generate -> reward -> filter -> fill).

Each rank reads its own shard of the task's prompts (``lit_ppo.rollout.stream``, a fresh seeded
permutation every epoch), and its collector (``lit_ppo.rollout.collector``) asks the rank's colocated
engine (``lit_ppo.rollout.engines.factory``) for ``gconfig.n_samples`` completions per prompt, scores them, lets
the dynamic filter accept or reject whole groups, and keeps pulling prompts until the batch is full.
The stream is pulled by the training step itself, so in synchronous mode the batch of iteration k is
generated with the weights of version k (nothing is prefetched ahead of the weight push). With
``max_head_offpolicyness`` k > 0 a producer thread (``lit_ppo.rollout.producer``) runs the same
collection ahead of the trainer, at most k versions ahead.

The data module holds the Lightning side of it: the hooks, the producer's lifecycle and the resumable
state. Its settings are one ``RolloutConfig`` (``rollout``), which the LightningModule reads too; what it
reads of the LightningModule is ``TrainedPolicy``, what the LightningModule and the callbacks read of it is
``lit_ppo.rollout.source.RolloutSource``.
"""

from __future__ import annotations

import inspect
import operator
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Iterator, Literal, Protocol

import lightning as L
import torch
from lightning.pytorch.plugins.precision import MixedPrecision
from lightning.pytorch.utilities import rank_zero_warn

from lit_ppo.config import EvalConfig, GenerationConfig, RolloutConfig
from lit_ppo.errors import ConfigError
from lit_ppo.models.policy import context_length
from lit_ppo.rollout.batch import RolloutBatch
from lit_ppo.rollout.collector import Collector
from lit_ppo.rollout.context import check_context, test_problem_count
from lit_ppo.rollout.engines.factory import build_engine
from lit_ppo.rollout.engines.protocol import RolloutEngine, SamplingParams
from lit_ppo.rollout.episodes.choose import build_workflow
from lit_ppo.rollout.episodes.episode import Workflow
from lit_ppo.rollout.evaluation import Evaluation, greedy, sum_names
from lit_ppo.rollout.producer import AsyncProducer, SharedEngine, batch_to_dict, drop_stale
from lit_ppo.rollout.stream import PromptStream, stable_seed
from lit_ppo.tasks import DEFAULT_TASK, build_task
from lit_ppo.utils.imports import describe, import_function
from lit_ppo.utils.source_docs import args_entries, dataclass_fields


class TrainedPolicy(Protocol):
    """What the data module reads of the LightningModule that trains on its batches (``LitPPO``)."""

    tokenizer: Any
    """The policy's tokenizer: prompts are templated and tokenized with it."""
    policy: torch.nn.Module
    """The trained model (its config declares the context length prompts must fit)."""
    device: torch.device
    """The rank's device: the engine's unless ``rollout.devices`` names another."""
    version: int
    """Policy version: the number of completed updates."""

    def full_policy(self) -> torch.nn.Module:
        """The policy as one plain transformers model (a collective when sharded: every rank calls it)."""


class RolloutDataModule(L.LightningDataModule):
    """Streams RolloutBatch objects from a task through a rollout engine.

    Its other arguments are the fields of ``RolloutConfig`` (``lit_ppo.config.rollout``), held as ``rollout``
    and documented there only: at import, ``Args:`` gets their entries from those field docstrings, for
    LightningCLI's help (``fit --help-all``).

    Args:
        task: registered task name ('arithmetic', 'gsm_symbolic', 'reasoning_gym', 'gsm8k', 'calculator',
            'word_problems', 'dataset', 'agent') or the dotted path module.Class of a Task.
        task_kwargs: the task's configuration.
        gconfig: sampling settings (``lit_ppo.config.GenerationConfig``).
        eval: how the task's test split is scored (``lit_ppo.config.EvalConfig``).
    """

    def __init__(self, task: str = DEFAULT_TASK, task_kwargs: dict | None = None,
                 gconfig: GenerationConfig | None = None, batch_size: int = 32, engine: str = "hf",
                 engine_kwargs: dict | None = None,
                 dynamic_filter_fn: str | None = None, dynamic_bs: bool = False, max_attempts_factor: int = 8,
                 system_prompt: str | None = None, seed: int = 0, max_turns: int = 4, turn_discount: float = 1.0,
                 episodes_in_flight: int = 32, episode_timeout_s: float = 300.0, tool_format: str = "auto",
                 on_drift: str = "share", on_invalid_reward: str = "error",
                 max_logp_gap: float | Literal["auto"] | None = "auto", eval: EvalConfig | None = None,
                 max_head_offpolicyness: int = 0, num_threads: int | None = None, devices: list[int] | None = None):
        super().__init__()
        self.rollout = RolloutConfig(
            engine=engine, engine_kwargs=engine_kwargs, batch_size=batch_size, dynamic_filter_fn=dynamic_filter_fn,
            dynamic_bs=dynamic_bs, max_attempts_factor=max_attempts_factor, system_prompt=system_prompt, seed=seed,
            max_turns=max_turns, turn_discount=turn_discount, episodes_in_flight=episodes_in_flight,
            episode_timeout_s=episode_timeout_s, tool_format=tool_format, on_drift=on_drift,
            on_invalid_reward=on_invalid_reward,
            max_logp_gap=max_logp_gap, max_head_offpolicyness=max_head_offpolicyness, num_threads=num_threads,
            devices=devices)
        """Every rollout setting but the task, the generation and the evaluation configs."""
        self.task = build_task(task, **(task_kwargs or {}))
        self.task_spec = task
        """``data.task`` as given: a registered name or the dotted path of the user's class."""
        self.gconfig = gconfig or GenerationConfig()
        self.accept: Callable[[RolloutBatch], bool] | None = (
            import_function(dynamic_filter_fn, "data.dynamic_filter_fn") if dynamic_filter_fn else None)
        self.eval = EvalConfig(**eval) if isinstance(eval, dict) else eval or EvalConfig()
        self.stream = PromptStream(self.task, seed)
        """This rank's train prompts; its position is the resumable state."""
        self.evaluation: Evaluation | None = None
        self.engine: RolloutEngine | None = None
        self.workflow: Workflow | None = None
        self.collector: Collector | None = None
        """Fills the batches of the fit in progress (built with its engine and workflow)."""
        self.producer: AsyncProducer | None = None
        """The producer thread of asynchronous rollouts (max_head_offpolicyness > 0), while fit runs."""
        self._queued: list[RolloutBatch] = []
        """Batches generated ahead and not trained on yet, restored from a checkpoint (handed over first)."""
        self._trainer_threads: int | None = None
        self._resumed_queues = False
        """The checkpoint resumed from held queues: checkpoints keep them, also with k = 0."""
        self.collecting = False
        """True while a batch is being generated (from its first prompt until it is handed over)."""
        self._boundary = self.stream.position()

    @property
    def _trained(self) -> TrainedPolicy:
        """The LightningModule of the trainer this data module is attached to."""
        return self.trainer.lightning_module

    # ------------------------------------------------------------------ sampling distribution
    def sampling_params(self, tokenizer) -> SamplingParams:
        """The sampling distribution of every request (the trainer recomputes log-probs under it)."""
        g = self.gconfig
        allowed = self.task.allowed_completion_tokens(tokenizer) if g.restrict_to_task_tokens else None
        return SamplingParams(n=g.n_samples, max_new_tokens=g.max_new_tokens, temperature=g.temperature,
                              top_k=g.top_k, top_p=g.top_p, stop_token_ids=list(g.stop_token_ids),
                              allowed_token_ids=allowed)

    # ------------------------------------------------------------------ Lightning hooks
    def setup(self, stage: str) -> None:
        """Before the first iteration (or evaluation), with the model's tokenizer at hand: the task's
        allowed completion tokens must be in its vocabulary and every prompt, with the completion
        budget, must fit the model's context; a one-line ConfigError otherwise."""
        trained = self._trained
        self._check_allowed_tokens(trained.tokenizer)
        check_context(self.task, self.gconfig, self.rollout, self.eval, trained.tokenizer,
                      context_length(getattr(trained.policy, "config", None)), stage)

    def _check_allowed_tokens(self, tokenizer) -> None:
        if not self.gconfig.restrict_to_task_tokens:
            return
        where = f"data.task={self.task_spec!r} with gconfig.restrict_to_task_tokens=true"
        try:
            ids = self.task.allowed_completion_tokens(tokenizer)
        except (Exception, SystemExit) as e:
            raise ConfigError(f"{where}: allowed_completion_tokens raised {describe(e)}") from None
        if ids is None:
            return
        vocab = len(tokenizer)
        try:
            values = list(ids)
        except TypeError:
            raise ConfigError(f"{where}: allowed_completion_tokens returned {type(ids).__name__}, not a list of "
                              f"token ids or None") from None
        if not values:
            raise ConfigError(f"{where}: allowed_completion_tokens returned no token ids (None allows all)")
        outside = [v for v in values if not _token_id(v, vocab)]
        if outside:
            raise ConfigError(f"{where}: allowed_completion_tokens returned {len(outside)} token id(s) outside the "
                              f"tokenizer's vocabulary of {vocab} (ids 0 to {vocab - 1}): "
                              f"{', '.join(map(repr, outside[:5]))}{', ...' if len(outside) > 5 else ''}")

    def train_dataloader(self) -> Iterator[RolloutBatch]:
        trained = self._trained
        if self.engine is None:
            self.engine = self._build_engine(trained)
        self.workflow = self._workflow(trained.tokenizer, self.sampling_params(trained.tokenizer))
        if self.rollout.max_head_offpolicyness > 0 and not isinstance(self.engine, SharedEngine):
            self.engine = SharedEngine(self.engine)
        self.collector = Collector(self.engine, self.workflow, self.stream, self.rollout, self.accept,
                                   self.trainer.global_rank, self.trainer.world_size)
        return self._stream() if self.rollout.max_head_offpolicyness == 0 else self._async_stream()

    def teardown(self, stage: str) -> None:
        self.stop_producer()

    def val_dataloader(self) -> "EvalBatches":
        return self._eval_batches()

    def test_dataloader(self) -> "EvalBatches":
        return self._eval_batches()

    def eval_problem_count(self) -> int:
        """How many test problems an evaluation scores (the first ones of the split)."""
        return test_problem_count(self.task, self.eval)

    def evaluate(self, indices: list[int]) -> torch.Tensor:
        """The ``lit_ppo.rollout.evaluation.sum_names`` sums of the test problems at ``indices``, scored by the
        engine."""
        if not indices:
            return torch.zeros(len(sum_names(self.task)), dtype=torch.float64)
        problems = self.task.problems("test")
        # The same seed for the same problems at every evaluation: curves compare like with like.
        seed = stable_seed(self.rollout.seed, -1, indices[0])
        self.engine.wake()
        return self.evaluation.score(self.engine, [problems[i] for i in indices], seed)

    def _eval_batches(self) -> "EvalBatches":
        """This rank's test problem indices (every world-th), in batches of ``eval.batch_size``."""
        trained = self._trained
        if self.engine is None:
            self.engine = self._build_engine(trained)
        params = self.sampling_params(trained.tokenizer)
        sampled = replace(params, n=self.eval.k) if self.eval.k else None
        self.evaluation = Evaluation(self.eval, self._workflow(trained.tokenizer, greedy(params), evaluating=True),
                                     sampled and self._workflow(trained.tokenizer, sampled, evaluating=True))
        count = self.eval_problem_count()
        mine = list(range(self.trainer.global_rank, count, self.trainer.world_size))
        batches = [mine[i:i + self.eval.batch_size] for i in range(0, len(mine), self.eval.batch_size)]
        # A rank without problems still runs the loop (an empty batch): the sums are added over all ranks.
        return EvalBatches(batches or ([[]] if count else []), problems_in_all=count,
                           world_size=self.trainer.world_size)

    def _workflow(self, tokenizer, params: SamplingParams, *, evaluating: bool = False) -> Workflow:
        """The task's workflow (``build_workflow``); an agent's sequences hold at most the policy's context."""
        context = context_length(getattr(self._trained.policy, "config", None)) or tokenizer.model_max_length
        return build_workflow(self.task, tokenizer, params, self.rollout, max_model_len=context,
                              evaluating=evaluating)

    def _build_engine(self, trained: TrainedPolicy) -> RolloutEngine:
        policy = trained.full_policy()  # the policy, or a model of its gathered / merged weights
        trainer = self.trainer
        return build_engine(self.rollout, policy, trained.tokenizer, is_trained_policy=policy is trained.policy,
                            device=trained.device, autocast=_trainer_autocast(trainer),
                            global_rank=trainer.global_rank, local_rank=trainer.local_rank,
                            world_size=trainer.world_size, version=trained.version)

    # ------------------------------------------------------------------ resumable state
    def state_dict(self) -> dict:
        """The prompt-stream position and, with asynchronous rollouts, the batches generated ahead,
        one list per rank (``queues``): a resume trains on exactly those, then continues the stream
        after them. Under DDP every rank calls this (it gathers the queues), as Lightning does."""
        if self.producer is not None:
            # A second signal abandons the batch the trainer waits for; otherwise it is finished first.
            position, queued = self.producer.state(finish_batch=not self.collecting)
        elif self.collecting:  # an abandoned batch: resume where the last completed one left the stream
            position, queued = dict(self._boundary), self._queued
        else:
            position, queued = self.stream.position(), self._queued
        if not (self.rollout.max_head_offpolicyness > 0 or self._resumed_queues):
            return position
        mine = [batch_to_dict(b) for b in queued]
        world = self.trainer.world_size if self.trainer is not None else 1
        queues = [mine]
        if world > 1:
            queues = [None] * world
            torch.distributed.all_gather_object(queues, mine)
        return {**position, "queues": queues}

    def load_state_dict(self, state: dict) -> None:
        self.stream.restore(state)
        queues = state.get("queues") or []
        self._resumed_queues = bool(queues)
        world, rank = (self.trainer.world_size, self.trainer.global_rank) if self.trainer is not None else (1, 0)
        if queues and len(queues) != world:
            rank_zero_warn(f"the checkpoint holds batches generated ahead by {len(queues)} rank(s) "
                           f"({sum(map(len, queues))} in all); this run has {world}: they are not trained on")
            queues = []
        self._queued = [RolloutBatch(**batch) for batch in (queues[rank] if queues else [])]

    # ------------------------------------------------------------------ the stream
    def _stream(self) -> Iterator[RolloutBatch]:
        while self._queued:  # a checkpoint of asynchronous training: its generated batches first
            yield self._hand_over(self._queued.pop(0), {})
        while True:
            self._boundary = self.stream.position()
            self.collecting = True  # stays True if generation is interrupted: the batch never completed
            batch = self.collector.collect()
            self.collecting = False
            yield batch

    # ------------------------------------------------------------------ asynchronous rollouts
    def _async_stream(self) -> Iterator[RolloutBatch]:
        self._start_producer()
        while True:
            self.collecting = True  # waiting for the producer: a second signal abandons the iteration
            batch, waited, queued = self.producer.take()
            self.collecting = False
            yield self._hand_over(batch, {"rollout/queue_size": float(queued), "time/wait_for_batch_s": waited})

    def _hand_over(self, batch: RolloutBatch, metrics: dict[str, float]) -> RolloutBatch:
        """``batch`` without groups older than the bound, with the hand-over's metrics."""
        batch, dropped = drop_stale(batch, self._trained.version, self.rollout.max_head_offpolicyness)
        batch.metrics = {**batch.metrics, **metrics, "rollout/dropped_stale": float(dropped)}
        return batch

    def _start_producer(self) -> None:
        trainer = self.trainer
        total = torch.get_num_threads()
        threads = self.rollout.num_threads or max(1, total // 2)
        self._trainer_threads = total
        torch.set_num_threads(max(1, total - threads))  # the trainer's thread (the producer sets its own)

        def remaining_iterations() -> int | None:
            return trainer.max_steps - trainer.global_step if trainer.max_steps > 0 else None

        self.producer = AsyncProducer(self.collector.collect, self.stream.position,
                                      self.rollout.max_head_offpolicyness, threads, remaining_iterations,
                                      queued=self._queued)
        self._queued = []
        self.producer.start()

    def iteration_done(self) -> None:
        """The iteration that took the latest batch has ended (its weights pushed): the producer may go on."""
        if self.producer is not None:
            self.producer.iteration_done()

    def stop_producer(self, wait: bool = True) -> None:
        """End asynchronous rollouts (at the end of fit, or without ``wait`` on an error); the queue
        stays in ``state_dict``."""
        if self.producer is None:
            return
        self.producer.close(wait)
        position, self._queued = self.producer.state(finish_batch=wait)
        self.stream.restore(position)
        self._boundary = position  # what state_dict reports while collecting (an abandoned iteration)
        self.producer = None
        torch.set_num_threads(self._trainer_threads)


if RolloutDataModule.__doc__:  # not under python -OO
    RolloutDataModule.__doc__ = (RolloutDataModule.__doc__.rstrip() + "\n" + args_entries(
        dataclass_fields(Path(inspect.getsourcefile(RolloutConfig)), RolloutConfig.__name__), indent=8) + "\n    ")


def _token_id(value, vocab: int) -> bool:
    """Whether ``value`` is an integer token id below ``vocab`` (a bool is not one)."""
    if isinstance(value, bool):
        return False
    try:
        return 0 <= operator.index(value) < vocab
    except TypeError:
        return False


def _trainer_autocast(trainer) -> str | None:
    """The autocast dtype of ``trainer``'s precision ('bfloat16' for bf16-mixed, 'float16' for 16-mixed),
    None without autocast (32-true, bf16-true, ...)."""
    plugin = getattr(trainer, "precision_plugin", None)
    if not isinstance(plugin, MixedPrecision):
        return None
    return "bfloat16" if plugin.precision == "bf16-mixed" else "float16"


class EvalBatches:
    """Batches of test problem indices, re-iterable at every evaluation: one dataloader to
    Lightning (which would take a list of them for several). The progress counts its problems
    (``lit_ppo.callbacks.progress``).

    Args:
        batches: this rank's share of the test problems, in batches.
        problems_in_all: the test problems that all ranks score together.
        world_size: the ranks that share them.
    """

    def __init__(self, batches: list[list[int]], problems_in_all: int, world_size: int = 1):
        self.batches = batches
        self.problems_in_all = problems_in_all
        self.world_size = world_size
        self.problems = sum(len(batch) for batch in batches)
        """This rank's share of the test problems."""

    def __iter__(self) -> Iterator[list[int]]:
        return iter(self.batches)

    def __len__(self) -> int:
        return len(self.batches)
