"""The prompts a job reads and whether they fit the model's context: the train split for ``fit``, the first
``eval.max_problems`` test problems for every job that scores them, each prompt with its completion budget
within the model's context length. Both the checks before a run (``lit_ppo.launch.check``, from the task
they built, before Lightning loads) and the data module at setup ask here. The workflows and the engine
protocol, which load torch, are imported only by the context check itself."""

from __future__ import annotations

from lit_ppo.config import EvalConfig, GenerationConfig, RolloutConfig
from lit_ppo.errors import ConfigError
from lit_ppo.tasks.base import Task, is_agent


def test_problem_count(task: Task, eval_cfg: EvalConfig) -> int:
    """How many test problems an evaluation scores (the first ones of the split)."""
    available = len(task.problems("test"))
    return available if eval_cfg.max_problems is None else min(available, eval_cfg.max_problems)


def check_context(task: Task, gconfig: GenerationConfig, rollout: RolloutConfig, eval_cfg: EvalConfig,
                  tokenizer, context: int | None, stage: str) -> None:
    """ConfigError of one line unless the longest prompt plus ``gconfig.max_new_tokens`` (a multi-turn
    episode: ``max_turns`` turns of it and the markup of the feedback turns between them, at least) fits the
    model's ``context`` (None: the model declares none); the prompts of the splits that ``stage`` reads."""
    if context is None or is_agent(task):  # an agent's client checks each call as it is made
        return
    from lit_ppo.rollout.engines.protocol import SamplingParams
    from lit_ppo.rollout.episodes.choose import build_workflow
    from lit_ppo.rollout.episodes.multi_turn import MultiTurnWorkflow

    workflow = build_workflow(task, tokenizer, SamplingParams(n=1, max_new_tokens=gconfig.max_new_tokens),
                              rollout, max_model_len=context)
    splits = [("test", test_problem_count(task, eval_cfg))]
    if stage == "fit":
        splits.insert(0, ("train", None))
    longest, where, seen = -1, "", set()
    for split, count in splits:
        for i, problem in enumerate(task.problems(split)[:count]):
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
    new = gconfig.max_new_tokens
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
    turns = rollout.max_turns
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
