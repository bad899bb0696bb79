"""RolloutDataModule: prompts in, RolloutBatch objects out (generate -> reward -> filter -> fill).

Each rank reads its own shard of the task's prompts (a fresh seeded permutation every epoch), asks
its colocated engine for ``gconfig.n_samples`` completions per prompt, scores them, lets the dynamic
filter accept or reject whole groups, and keeps pulling prompts until the batch is full. The stream
is pulled by the training step itself, so in synchronous mode the batch of iteration k is generated
with the weights of version k (nothing is prefetched ahead of the weight push). With
``max_head_offpolicyness`` k > 0 a producer thread (``lit_ppo.rollout.producer``) runs the same
collection ahead of the trainer, at most k versions ahead.
"""

from __future__ import annotations

import hashlib
import operator
import os
import time
from dataclasses import replace
from typing import Callable, Iterator, Literal

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_warn

from lit_ppo.config import EvalConfig, GenerationConfig
from lit_ppo.errors import ConfigError, RunStopped
from lit_ppo.rollout.batch import RolloutBatch
from lit_ppo.rollout.engine import RolloutEngine, SamplingParams
from lit_ppo.rollout.evaluation import SUMS, Evaluation, greedy
from lit_ppo.rollout.producer import AsyncProducer, SharedEngine, batch_to_dict, drop_stale
from lit_ppo.rollout.workflows import (MultiTurnWorkflow, SingleTurnWorkflow, check_invalid_reward_action,
                                       check_turn_settings, is_multi_turn)
from lit_ppo.tasks import DEFAULT_TASK, build_task
from lit_ppo.utils.imports import describe, import_object

ENGINES = ("hf", "vllm")
INVALID_REWARDS_HINT = ("rewards must be finite real numbers (data.on_invalid_reward=error stops at the first "
                        "invalid one, naming its prompt and value)")


def import_function(path: str, key: str) -> Callable:
    """The function at dotted ``path`` (importable from the working directory); ValueError naming
    ``key`` if it cannot be imported or is not callable."""
    fn = import_object(path, key, "function")
    if not callable(fn):
        raise ValueError(f"{key}={path!r} is not a function")
    return fn


def _seed(*parts: int) -> int:
    """A 63-bit seed mixing the parts (stable across runs and platforms)."""
    digest = hashlib.sha256(":".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


class RolloutDataModule(L.LightningDataModule):
    """Streams RolloutBatch objects from a task through a rollout engine.

    Args:
        task: registered task name ('arithmetic', 'gsm_symbolic', 'reasoning_gym', 'gsm8k', 'calculator').
        task_kwargs: the task's configuration.
        gconfig: sampling settings (group size, length budget, temperature, top-k/top-p, restriction).
        batch_size: prompt groups per RL iteration and rank.
        engine: rollout engine, 'hf' (transformers) or 'vllm'.
        engine_kwargs: keyword arguments of the engine (e.g. vllm's gpu_memory_utilization, max_model_len;
            for 'hf': max_batch_size, dtype, autocast, checked here). Both take ``dtype`` ('bfloat16':
            the engine's weights in bf16). Under ``trainer.precision=bf16-mixed`` / ``16-mixed`` the HF
            engine autocasts as the trainer does (``autocast`` overrides it), on every thread.
        dynamic_filter_fn: dotted path to ``fn(group: RolloutBatch) -> bool`` accepting a prompt's
            group (e.g. lit_ppo.rollout.filters.mixed_outcomes, DAPO's 0 < mean reward < 1); None keeps all.
        dynamic_bs: stop after ``batch_size`` groups were tried and train on the accepted ones (the
            batch may be smaller, or empty: the iteration is then skipped); otherwise keep sampling
            until ``batch_size`` groups are accepted.
        max_attempts_factor: give up, with an error naming the filter, after
            ``max_attempts_factor * batch_size`` groups were tried for one batch (fixed batch size) or
            after ``max_attempts_factor`` consecutive empty batches (dynamic_bs).
        system_prompt: optional system message before every prompt.
        seed: seed of the prompt order and of sampling.
        max_turns: most assistant turns per episode of a multi-turn task (one with
            ``environment(problem)``, e.g. 'calculator'); ignored by single-turn tasks.
        turn_discount: factor in (0, 1] applied to a multi-turn episode's reward once per assistant
            turn after the first; ignored by single-turn tasks.
        on_invalid_reward: a reward that is not a finite real number (NaN, inf, None, a string)
            fails the iteration with an error naming the task, the prompt and the value ('error'), or
            drops that prompt's whole group ('drop'), counted in ``rollout/invalid_rewards``; dropped
            groups count as tried for ``dynamic_bs`` and ``max_attempts_factor``.
        max_logp_gap: largest mean |behaviour - trainer| log-prob gap, in nats per token, allowed on
            the tokens of a batch sampled by the current policy version (every token in synchronous
            training): above it the run stops, before any optimizer step on that batch, with an
            error naming the engine, since the engine is then not sampling from the trainer's
            weights. Measured by the trainer's recompute pass (``actor.recompute_logprob`` or the
            decoupled loss) or else by the first minibatch's forward pass, as the token mean over
            all ranks. 'auto' (the default) is 1e-3 where engine and trainer compute in float32 and
            0.1 where either computes in lower precision (``model.dtype`` or
            ``rollout.engine_kwargs.dtype`` not float32, ``trainer.precision`` not 32); a number
            replaces both; None (null) disables the check. The measured gaps and what the error
            recommends: docs/rollout.md#the-log-prob-gap.
        eval: how the task's test split is scored every ``trainer.val_check_interval`` iterations,
            at the end of ``fit``, and by ``validate`` / ``test`` (see ``lit_ppo.rollout.evaluation``).
        max_head_offpolicyness: k, how many policy versions a trained token may lag the policy that
            trains on it. 0: synchronous (each batch is generated by the current weights, then
            trained on). k > 0: a producer thread generates batches ahead while the trainer trains,
            starting one only while at most k batches are waiting or in training; each token keeps
            the version that sampled it, a group older than k versions at hand-over is dropped
            (``rollout/dropped_stale``), and the actor needs the decoupled loss
            (``actor.use_decoupled_loss``, e.g. algo=icepop). The engine then stays awake during the
            update (on a GPU it shares the device's memory with the trainer, or takes ``devices``).
        num_threads: with k > 0, the torch CPU threads of the producer thread; the trainer keeps the
            rest of the process's threads (at least one). None: half of them (at least one).
        devices: CUDA device indices for the rollout engines, the one at position ``local_rank`` for
            each rank of a node (``rollout=hf`` only); None: each engine on its rank's own device.
    """

    def __init__(self, task: str = DEFAULT_TASK, task_kwargs: dict | None = None,
                 gconfig: GenerationConfig | None = None, batch_size: int = 32, engine: str = "hf",
                 engine_kwargs: dict | None = None,
                 dynamic_filter_fn: str | None = None, dynamic_bs: bool = False, max_attempts_factor: int = 8,
                 system_prompt: str | None = None, seed: int = 0, max_turns: int = 4, turn_discount: float = 1.0,
                 on_invalid_reward: str = "error", max_logp_gap: float | Literal["auto"] | None = "auto",
                 eval: EvalConfig | None = None, max_head_offpolicyness: int = 0, num_threads: int | None = None,
                 devices: list[int] | None = None):
        super().__init__()
        if engine not in ENGINES:
            raise ValueError(f"data.engine={engine!r} is invalid: must be one of {', '.join(map(repr, ENGINES))}")
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"data.batch_size={batch_size!r} is invalid: must be a positive integer")
        if not isinstance(max_attempts_factor, int) or max_attempts_factor < 1:
            raise ValueError(f"data.max_attempts_factor={max_attempts_factor!r} is invalid: must be a positive integer")
        check_turn_settings(max_turns, turn_discount, prefix="data.")
        check_invalid_reward_action(on_invalid_reward, prefix="data.")
        if max_logp_gap not in (None, "auto") and (
                isinstance(max_logp_gap, bool) or not isinstance(max_logp_gap, (int, float)) or not max_logp_gap > 0):
            raise ValueError(f"rollout.max_logp_gap={max_logp_gap!r} is invalid: must be a positive number, 'auto' "
                             f"or null")
        _check_async_settings(max_head_offpolicyness, num_threads)
        _check_devices(devices, engine)
        _check_engine_kwargs(engine_kwargs, engine)
        self.task = build_task(task, **(task_kwargs or {}))
        self.task_spec = task
        """``data.task`` as given: a registered name or the dotted path of the user's class."""
        self.gconfig = gconfig or GenerationConfig()
        self.batch_size = batch_size
        self.engine_name = engine
        self.engine_kwargs = dict(engine_kwargs or {})
        self.dynamic_filter_fn = dynamic_filter_fn
        self.accept: Callable[[RolloutBatch], bool] | None = (
            import_function(dynamic_filter_fn, "data.dynamic_filter_fn") if dynamic_filter_fn else None)
        self.dynamic_bs = dynamic_bs
        self.max_attempts_factor = max_attempts_factor
        self.system_prompt = system_prompt
        self.seed = seed
        self.max_turns = max_turns
        self.turn_discount = turn_discount
        self.on_invalid_reward = on_invalid_reward
        self.max_logp_gap = max_logp_gap if max_logp_gap in (None, "auto") else float(max_logp_gap)
        self.eval = EvalConfig(**eval) if isinstance(eval, dict) else eval or EvalConfig()
        self.max_head_offpolicyness = max_head_offpolicyness
        self.num_threads = num_threads
        self.devices = None if devices is None else list(devices)
        self.evaluation: Evaluation | None = None
        self.engine: RolloutEngine | None = None
        self.producer: AsyncProducer | None = None
        """The producer thread of asynchronous rollouts (max_head_offpolicyness > 0), while fit runs."""
        self._queued: list[RolloutBatch] = []
        """Batches generated ahead and not trained on yet, restored from a checkpoint (handed over first)."""
        self._trainer_threads: int | None = None
        self._resumed_queues = False
        """The checkpoint resumed from held queues: checkpoints keep them, also with k = 0."""
        self.workflow: SingleTurnWorkflow | MultiTurnWorkflow | None = None
        # Position in the prompt stream and the number of generate calls: the resumable state.
        self.epoch = 0
        self.cursor = 0
        self.requests = 0
        self._empty_in_a_row = 0
        self._tried_in_a_row = 0
        self._invalid_in_a_row = 0
        """Groups tried, and of them dropped for invalid rewards, in the ``_empty_in_a_row`` empty batches."""
        self.collecting = False
        """True while a batch is being generated (from its first prompt until it is handed over)."""
        self._boundary = self._position()

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
        module = self.trainer.lightning_module if self.trainer is not None else None
        tokenizer = getattr(module, "tokenizer", None)
        if tokenizer is None:
            return
        self._check_allowed_tokens(tokenizer)
        self._check_context(tokenizer, getattr(getattr(module, "policy", None), "config", None), stage)

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

    def _check_context(self, tokenizer, model_config, stage: str) -> None:
        """The longest prompt plus ``gconfig.max_new_tokens`` (a multi-turn episode: ``max_turns`` turns
        of it and the markup of the feedback turns between them, at least) must fit the model's context."""
        context = _context_length(model_config)
        if context is None:
            return
        workflow = self._workflow(tokenizer, SamplingParams(n=1, max_new_tokens=self.gconfig.max_new_tokens))
        splits = [("test", self.eval_problem_count())]
        if stage == "fit":
            splits.insert(0, ("train", None))
        longest, where, seen = -1, "", set()
        for split, count in splits:
            for i, problem in enumerate(self.task.problems(split)[:count]):
                text = problem.prompt if problem.messages is None else None
                if text is not None and text in seen:
                    continue  # tasks repeat prompts; each is tokenized once
                seen.add(text)
                length = len(workflow.prompt_ids(problem.prompt if isinstance(workflow, MultiTurnWorkflow)
                                                 else problem))
                if length > longest:
                    longest, where = length, f"{split} problem {i}"
        if longest < 0:
            return
        new = self.gconfig.max_new_tokens
        limit = f"the model's context length of {context} (max_position_embeddings in its config)"
        if not isinstance(workflow, MultiTurnWorkflow):
            if longest + new > context:
                fix = (f"lower gconfig.max_new_tokens to {context - longest} or less, or shorten the prompts"
                       if longest < context else
                       "the prompt alone does not fit: shorten the prompts (and data.system_prompt) or use a model "
                       "with a longer context")
                raise ConfigError(f"gconfig.max_new_tokens={new} and the longest prompt ({longest} tokens, {where}) "
                                  f"need {longest + new} positions, more than {limit}: {fix}")
            return
        turns = self.max_turns
        eos = tokenizer.eos_token_id
        markup = len(workflow.feedback_ids("", [] if eos is None else [eos]))  # a feedback turn without its text
        need = longest + turns * new + (turns - 1) * markup
        if need > context:
            fitting = (context - longest + markup) // (new + markup)
            fix = (f"lower data.max_turns to {fitting} or less, or gconfig.max_new_tokens" if fitting >= 1 else
                   f"lower gconfig.max_new_tokens to {context - longest} or less with data.max_turns=1"
                   if longest < context else "the prompt alone does not fit: shorten the prompts")
            raise ConfigError(f"data.max_turns={turns} turns of gconfig.max_new_tokens={new} after the longest first "
                              f"prompt ({longest} tokens, {where}), with {turns - 1} feedback turn(s) of at least "
                              f"{markup} tokens between them, need at least {need} positions, more than {limit}: "
                              f"{fix}")

    def train_dataloader(self) -> Iterator[RolloutBatch]:
        module = self.trainer.lightning_module
        if self.engine is None:
            self.engine = self._build_engine(module)
        self.workflow = self._workflow(module.tokenizer, self.sampling_params(module.tokenizer))
        if self.max_head_offpolicyness == 0:
            return self._stream()
        if not isinstance(self.engine, SharedEngine):
            self.engine = SharedEngine(self.engine)
        return self._async_stream()

    def teardown(self, stage: str) -> None:
        self.stop_producer()

    def val_dataloader(self) -> "EvalBatches":
        return self._eval_batches()

    def test_dataloader(self) -> "EvalBatches":
        return self._eval_batches()

    def eval_problem_count(self) -> int:
        """How many test problems an evaluation scores (the first ones of the split)."""
        available = len(self.task.problems("test"))
        return available if self.eval.max_problems is None else min(available, self.eval.max_problems)

    def evaluate(self, indices: list[int]) -> torch.Tensor:
        """The ``lit_ppo.rollout.evaluation.SUMS`` of the test problems at ``indices``, scored by the engine."""
        if not indices:
            return torch.zeros(len(SUMS), dtype=torch.float64)
        problems = self.task.problems("test")
        # The same seed for the same problems at every evaluation: curves compare like with like.
        seed = _seed(self.seed, -1, indices[0])
        self.engine.wake()
        return self.evaluation.score(self.engine, [problems[i] for i in indices], seed)

    def _eval_batches(self) -> "EvalBatches":
        """This rank's test problem indices (every world-th), in batches of ``eval.batch_size``."""
        module = self.trainer.lightning_module
        if self.engine is None:
            self.engine = self._build_engine(module)
        params = self.sampling_params(module.tokenizer)
        sampled = replace(params, n=self.eval.k) if self.eval.k else None
        self.evaluation = Evaluation(self.eval, self._workflow(module.tokenizer, greedy(params)),
                                     sampled and self._workflow(module.tokenizer, sampled))
        count = self.eval_problem_count()
        mine = list(range(self.trainer.global_rank, count, self.trainer.world_size))
        batches = [mine[i:i + self.eval.batch_size] for i in range(0, len(mine), self.eval.batch_size)]
        # A rank without problems still runs the loop (an empty batch): the sums are added over all ranks.
        return EvalBatches(batches or ([[]] if count else []))

    def _workflow(self, tokenizer, params: SamplingParams) -> SingleTurnWorkflow | MultiTurnWorkflow:
        if is_multi_turn(self.task):
            return MultiTurnWorkflow(tokenizer, self.task, params, self.max_turns, self.turn_discount,
                                     self.system_prompt, self.on_invalid_reward)
        return SingleTurnWorkflow(tokenizer, self.task, params, self.system_prompt, self.on_invalid_reward)

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
            position, queued = self._position(), self._queued
        if not (self.max_head_offpolicyness > 0 or self._resumed_queues):
            return position
        mine = [batch_to_dict(b) for b in queued]
        world = self.trainer.world_size if self.trainer is not None else 1
        queues = [mine]
        if world > 1:
            queues = [None] * world
            torch.distributed.all_gather_object(queues, mine)
        return {**position, "queues": queues}

    def _position(self) -> dict:
        return {"epoch": self.epoch, "cursor": self.cursor, "requests": self.requests}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.cursor, self.requests = state["epoch"], state["cursor"], state["requests"]
        queues = state.get("queues") or []
        self._resumed_queues = bool(queues)
        world, rank = (self.trainer.world_size, self.trainer.global_rank) if self.trainer is not None else (1, 0)
        if queues and len(queues) != world:
            rank_zero_warn(f"the checkpoint holds batches generated ahead by {len(queues)} rank(s) "
                           f"({sum(map(len, queues))} in all); this run has {world}: they are not trained on")
            queues = []
        self._queued = [RolloutBatch(**batch) for batch in (queues[rank] if queues else [])]

    def _build_engine(self, module) -> RolloutEngine:
        policy = module.full_policy()  # the policy, or a model of its gathered / merged weights
        if self.engine_name == "hf":
            from lit_ppo.rollout.hf_engine import HFEngine

            device = module.device if self.devices is None else self._engine_device()
            # Under trainer.precision=bf16-mixed / 16-mixed the engine autocasts as the trainer does, on
            # every thread (the producer's does not inherit the trainer's autocast): same log-probs.
            kwargs = {"autocast": _trainer_autocast(self.trainer), **self.engine_kwargs}
            # Synchronously, sampling and training take turns: the engine samples from the policy
            # itself (no second copy of the weights) unless it needs one of its own: in another dtype
            # or on another device, beside a producer thread's training, or a gathered / merged model.
            share = (policy is module.policy and self.max_head_offpolicyness == 0 and self.devices is None
                     and kwargs.get("dtype") in (None, "auto"))
            engine = HFEngine(policy, module.tokenizer, device=device, share_weights=share, **kwargs)
        else:
            from lit_ppo.rollout.vllm_engine import VLLMEngine

            if self.trainer.world_size > 1:
                # One engine per rank through vLLM's external launcher, which reads the torchrun
                # variables; Lightning's own launcher does not set RANK.
                os.environ.update(RANK=str(self.trainer.global_rank), LOCAL_RANK=str(self.trainer.local_rank),
                                  WORLD_SIZE=str(self.trainer.world_size))
            engine = VLLMEngine(policy, module.tokenizer, seed=self.seed + self.trainer.global_rank,
                                **self.engine_kwargs)
        engine.version = module.version
        return engine

    # ------------------------------------------------------------------ the stream
    def _shard(self) -> list[int]:
        """This rank's prompt indices for the current epoch."""
        problems = self.task.problems("train")
        order = torch.randperm(len(problems), generator=torch.Generator().manual_seed(_seed(self.seed, self.epoch)))
        rank, world = self.trainer.global_rank, self.trainer.world_size
        return order[rank::world].tolist()

    def _next_problems(self, k: int):
        problems = self.task.problems("train")
        out = []
        while len(out) < k:
            shard = self._shard()
            if not shard:
                raise ValueError(f"task {self.task.name!r} has fewer train problems than ranks")
            take = shard[self.cursor:self.cursor + k - len(out)]
            out += [problems[i] for i in take]
            self.cursor += len(take)
            if self.cursor >= len(shard):
                self.epoch, self.cursor = self.epoch + 1, 0
        return out

    def _engine_device(self) -> torch.device:
        local_rank = self.trainer.local_rank
        if local_rank >= len(self.devices):
            raise ValueError(f"rollout.devices={self.devices} has no device for local rank {local_rank}: list one "
                             f"CUDA device per rank of a node")
        return torch.device("cuda", self.devices[local_rank])

    def _stream(self) -> Iterator[RolloutBatch]:
        while self._queued:  # a checkpoint of asynchronous training: its generated batches first
            yield self._hand_over(self._queued.pop(0), {})
        while True:
            self._boundary = self._position()
            self.collecting = True  # stays True if generation is interrupted: the batch never completed
            batch = self.collect()
            self.collecting = False
            yield batch

    def collect(self) -> RolloutBatch:
        """One iteration's batch: generate, score and filter groups until it is full."""
        start = time.perf_counter()
        self.engine.wake()
        accepted: list[RolloutBatch] = []
        tried = rejected = invalid = 0
        limit = self.batch_size * self.max_attempts_factor
        while True:
            wanted = self.batch_size - (tried if self.dynamic_bs else len(accepted))
            if wanted <= 0:
                break
            if not self.dynamic_bs and tried >= limit:
                shortfall = (f"fewer than data.batch_size={self.batch_size} within data.max_attempts_factor="
                             f"{self.max_attempts_factor}")
                if self.accept is None or invalid == tried:  # no filter to blame: invalid rewards emptied the batch
                    lead = (f"every one of the {tried} groups tried was" if invalid == tried else
                            f"{invalid} of the {tried} groups tried were")
                    raise RunStopped(f"{lead} dropped for an invalid reward (data.on_invalid_reward=drop), "
                                     f"{len(accepted)} accepted, {shortfall}: {INVALID_REWARDS_HINT}")
                dropped = f" ({invalid} dropped for invalid rewards, data.on_invalid_reward=drop)" if invalid else ""
                raise RunStopped(
                    f"data.dynamic_filter_fn={self.dynamic_filter_fn!r} accepted {len(accepted)} of {tried} groups"
                    f"{dropped}, {shortfall}: loosen the filter, raise the factor, or use data.dynamic_bs=true")
            seed = _seed(self.seed, self.trainer.global_rank, self.requests)
            self.requests += 1
            rollout = self.workflow.run(self.engine, self._next_problems(wanted), seed=seed)
            for g in range(rollout.num_groups):
                group = rollout.select_groups([g])
                tried += 1
                # Only data.on_invalid_reward=drop lets a non-finite reward get here (as NaN); the
                # filter never sees such a group.
                if not bool(torch.isfinite(group.rewards).all()):
                    invalid += 1
                elif self.accept is None or self.accept(group):
                    accepted.append(group)
                else:
                    rejected += 1
        self.engine.sleep()  # frees accelerator memory for the update (where the engine supports it)
        metrics = {"rollout/accepted": float(len(accepted)), "rollout/rejected": float(rejected),
                   "rollout/invalid_rewards": float(invalid),
                   "time/generate_s": time.perf_counter() - start}
        if not accepted:
            self._empty_in_a_row += 1
            self._tried_in_a_row += tried
            self._invalid_in_a_row += invalid
            if self._empty_in_a_row >= self.max_attempts_factor:
                iterations = (f"{self._empty_in_a_row} consecutive iterations (data.max_attempts_factor="
                              f"{self.max_attempts_factor}")
                if self._invalid_in_a_row == self._tried_in_a_row:  # no filter to blame
                    raise RunStopped(f"every one of the {self._tried_in_a_row} groups tried in {iterations}) was "
                                     f"dropped for an invalid reward (data.on_invalid_reward=drop): "
                                     f"{INVALID_REWARDS_HINT}")
                dropped = f", the last dropped {invalid} for invalid rewards" if invalid else ""
                raise RunStopped(
                    f"data.dynamic_filter_fn={self.dynamic_filter_fn!r} accepted no group in {iterations}{dropped}): "
                    f"loosen the filter")
            batch = _empty_batch()
        else:
            self._empty_in_a_row = self._tried_in_a_row = self._invalid_in_a_row = 0
            batch = RolloutBatch.concat(accepted, pad_id=self.workflow.pad_id)
        batch.metrics = metrics
        return batch

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
        version = self.trainer.lightning_module.version
        batch, dropped = drop_stale(batch, version, self.max_head_offpolicyness)
        batch.metrics = {**batch.metrics, **metrics, "rollout/dropped_stale": float(dropped)}
        return batch

    def _start_producer(self) -> None:
        trainer = self.trainer
        total = torch.get_num_threads()
        threads = self.num_threads or max(1, total // 2)
        self._trainer_threads = total
        torch.set_num_threads(max(1, total - threads))  # the trainer's thread (the producer sets its own)

        def remaining_iterations() -> int | None:
            return trainer.max_steps - trainer.global_step if trainer.max_steps > 0 else None

        self.producer = AsyncProducer(self.collect, self._position, self.max_head_offpolicyness, threads,
                                      remaining_iterations, queued=self._queued)
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
        self.epoch, self.cursor, self.requests = position["epoch"], position["cursor"], position["requests"]
        self._boundary = position  # what state_dict reports while collecting (an abandoned iteration)
        self.producer = None
        torch.set_num_threads(self._trainer_threads)


def _token_id(value, vocab: int) -> bool:
    """Whether ``value`` is an integer token id below ``vocab`` (a bool is not one)."""
    if isinstance(value, bool):
        return False
    try:
        return 0 <= operator.index(value) < vocab
    except TypeError:
        return False


def _context_length(config) -> int | None:
    """The longest sequence a model's config declares (``max_position_embeddings``), None if it declares none."""
    value = getattr(config, "max_position_embeddings", None)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _check_async_settings(max_head_offpolicyness, num_threads) -> None:
    k = max_head_offpolicyness
    if isinstance(k, bool) or not isinstance(k, int) or k < 0:
        raise ValueError(f"rollout.max_head_offpolicyness={k!r} is invalid: must be an integer >= 0 "
                         f"(0: synchronous)")
    if num_threads is not None and (isinstance(num_threads, bool) or not isinstance(num_threads, int)
                                    or num_threads < 1):
        raise ValueError(f"rollout.num_threads={num_threads!r} is invalid: must be a positive integer or null")


def _check_engine_kwargs(engine_kwargs, engine: str) -> None:
    """The settings of rollout=hf's engine (vLLM checks its own when it starts)."""
    if engine_kwargs is not None and not isinstance(engine_kwargs, dict):
        raise ValueError(f"rollout.engine_kwargs={engine_kwargs!r} is invalid: must be a mapping of engine settings")
    if engine != "hf" or not engine_kwargs:
        return
    from lit_ppo.rollout.hf_engine import KWARGS, precision_problem

    for name in engine_kwargs:
        if name not in KWARGS:
            raise ValueError(f"rollout.engine_kwargs.{name} is not a setting of rollout=hf; allowed: "
                             f"{', '.join(sorted(KWARGS))}")
    size = engine_kwargs.get("max_batch_size", 1)
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ValueError(f"rollout.engine_kwargs.max_batch_size={size!r} is invalid: must be a positive integer")
    problem = precision_problem(engine_kwargs.get("dtype"), engine_kwargs.get("autocast"), "rollout.engine_kwargs.")
    if problem:
        raise ValueError(problem)


def _trainer_autocast(trainer) -> str | None:
    """The autocast dtype of ``trainer``'s precision ('bfloat16' for bf16-mixed, 'float16' for 16-mixed),
    None without autocast (32-true, bf16-true, ...)."""
    from lightning.pytorch.plugins.precision import MixedPrecision

    plugin = getattr(trainer, "precision_plugin", None)
    if not isinstance(plugin, MixedPrecision):
        return None
    return "bfloat16" if plugin.precision == "bf16-mixed" else "float16"


def _check_devices(devices, engine: str) -> None:
    if devices is None:
        return
    if (not isinstance(devices, (list, tuple)) or not devices
            or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in devices)):
        raise ValueError(f"rollout.devices={devices!r} is invalid: must be a list of CUDA device indices or null")
    if engine != "hf":
        raise ValueError(f"rollout.devices needs rollout=hf: the {engine} engine shares its rank's device")
    available = torch.cuda.device_count()
    if max(devices) >= available:
        raise ValueError(f"rollout.devices={list(devices)}: this machine has {available} CUDA device(s)")


class EvalBatches:
    """Batches of test problem indices, re-iterable at every evaluation: one dataloader to
    Lightning (which would take a list of them for several)."""

    def __init__(self, batches: list[list[int]]):
        self.batches = batches

    def __iter__(self) -> Iterator[list[int]]:
        return iter(self.batches)

    def __len__(self) -> int:
        return len(self.batches)


def _empty_batch() -> RolloutBatch:
    empty_long = torch.zeros(0, 0, dtype=torch.long)
    empty_bool = torch.zeros(0, 0, dtype=torch.bool)
    return RolloutBatch(input_ids=empty_long, attention_mask=empty_bool, loss_mask=empty_bool,
                        behave_logp=torch.zeros(0, 0), versions=empty_long, turn_ids=empty_long,
                        rewards=torch.zeros(0), truncated=torch.zeros(0, dtype=torch.bool),
                        group_sizes=torch.zeros(0, dtype=torch.long))
