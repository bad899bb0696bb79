"""Agent benchmark: episodes per second of one agent with 1 episode in flight and with many.

    python scripts/bench_agents.py                    # quick (make bench): the tiny model
    python scripts/bench_agents.py --full             # docs/benchmarks.md numbers: SmolLM2
    python scripts/bench_agents.py --full --engine vllm

The agent is an ordinary function of an OpenAI-compatible client (``lit_ppo.rollout.episodes.agent``): it
asks a problem (the tiny model: arithmetic; SmolLM2: a word problem), then follows up ``--turns - 1`` times in
the same conversation (each call continues the episode's token sequence), and returns a reward. The same
problems, episodes and sampling run twice through the engine (``--engine``: hf or vllm), with ``--in-flight`` 1
and then ``--many`` (the calls that wait while the engine samples go in its next call,
``lit_ppo.rollout.engines.shared``); the table reports each run's episodes per second, its engine calls and
the ratio of the two rates.
"""

from __future__ import annotations

import argparse
import time

import torch

from lit_ppo.config import RolloutConfig
from lit_ppo.models import load_causal_lm
from lit_ppo.rollout.engines.hf import HFEngine
from lit_ppo.rollout.engines.protocol import SamplingParams
from lit_ppo.rollout.episodes.agent import AgentWorkflow
from lit_ppo.tasks.arithmetic import ArithmeticTask
from lit_ppo.tasks.word_problems import WordProblemsTask


class FollowUpAgent:
    """A task whose agent asks a problem of ``source``, then follows up in the same conversation."""

    name = "follow-up"

    def __init__(self, source, turns: int, max_tokens: int):
        self.source, self.turns, self.max_tokens = source, turns, max_tokens

    def problems(self, split):
        return self.source.problems(split)

    def reward(self, problem, completion):
        raise NotImplementedError("the agent's return value is the reward")

    def allowed_completion_tokens(self, tokenizer):
        return None

    def agent(self, client, problem):
        messages = [{"role": "user", "content": problem.prompt}]
        for turn in range(self.turns):
            reply = client.chat.completions.create(model="policy", messages=messages, max_tokens=self.max_tokens)
            messages += [reply.choices[0].message, {"role": "user", "content": "Again?"}]
        return float(problem.answer in (reply.choices[0].message.content or ""))


class CountingEngine:
    """The engine, counting its calls."""

    def __init__(self, engine):
        self.engine, self.calls = engine, 0
        self.version = engine.version

    def generate(self, prompts, params):
        self.calls += 1
        return self.engine.generate(prompts, params)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--full", action="store_true", help="SmolLM2 (default: the tiny model)")
    parser.add_argument("--problems", type=int, default=8, help="problems per run")
    parser.add_argument("--samples", type=int, default=4, help="episodes per problem")
    parser.add_argument("--turns", type=int, default=2, help="calls per episode")
    parser.add_argument("--max-tokens", type=int, default=32, help="max_tokens of each call")
    parser.add_argument("--many", type=int, default=32, help="episodes in flight of the second run")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    parser.add_argument("--engine", choices=("hf", "vllm"), default="hf", help="the rollout engine")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model, tokenizer = load_causal_lm("smollm2" if args.full else "tiny")[:2]
    if args.engine == "vllm":
        from lit_ppo.rollout.engines.vllm import VLLMEngine

        engine = VLLMEngine(model, tokenizer, seed=0)
    else:
        engine = HFEngine(model, tokenizer, max_batch_size=args.many)
    task = FollowUpAgent(WordProblemsTask() if args.full else ArithmeticTask(), args.turns, args.max_tokens)
    problems = task.problems("train")[:args.problems]
    params = SamplingParams(n=args.samples, max_new_tokens=args.max_tokens, stop_token_ids=[tokenizer.eos_token_id],
                            seed=0)
    context = model.config.max_position_embeddings
    print(f"{'SmolLM2' if args.full else 'tiny'}: {len(problems)} problems x {args.samples} episodes, "
          f"{args.turns} calls each, max_tokens {args.max_tokens}; {args.engine} engine, {args.threads} threads")
    print("| episodes in flight | episodes | seconds | episodes/s | engine calls | prompts per call |")
    print("|---|---|---|---|---|---|")
    rates = []
    for in_flight in (1, args.many):
        counting = CountingEngine(engine)
        workflow = AgentWorkflow(tokenizer, task, params, RolloutConfig(episodes_in_flight=in_flight), context)
        start = time.perf_counter()
        batch = workflow.run(counting, problems)
        seconds = time.perf_counter() - start
        episodes = len(problems) * args.samples
        rates.append(episodes / seconds)
        calls = episodes * args.turns
        print(f"| {in_flight} | {episodes} | {seconds:.1f} | {rates[-1]:.2f} | {counting.calls} | "
              f"{calls / counting.calls:.1f} |")
        assert batch.num_rows >= episodes
    print(f"\n{args.many} in flight / 1: {rates[1] / rates[0]:.2f}x the episodes per second")


if __name__ == "__main__":
    main()
