"""The ``sft`` section of ``python -m lit_ppo sft``: how supervised fine-tuning reads its examples and how
long it trains. The model, data, trainer, logger and optimizer (``actor.optimizer``) come from the same
config groups and keys as ``fit``."""

from __future__ import annotations

import string
from dataclasses import dataclass, field

from lit_ppo.config import OptimizerConfig
from lit_ppo.config.checks import as_config, check_fields, check_positive_int, fail


@dataclass
class SFTConfig:
    """Supervised fine-tuning on prompts and completions: the loss is the mean negative log-likelihood of the
    completion tokens (and of every assistant message of a conversation), the prompt tokens excluded."""

    epochs: int = 1
    """Passes over the training examples (``trainer.max_steps``, when given, stops it earlier)."""
    batch_size: int = 8
    """Examples per optimizer step."""
    max_length: int = 1024
    """Most tokens of one example (prompt and completion); a longer example is refused, naming its row."""
    completion_key: str = "completion"
    """The column holding an example's completion: a string written after the chat-templated prompt and
    closed by the tokenizer's EOS (as a sampled completion is), or a list of assistant messages."""
    completion_template: str | None = None
    """The completion of a task's problem without a completion column, as a Python format string over its
    ``{answer}``, ``{prompt}`` and columns, e.g. ``<answer>{answer}</answer>``; None: a problem needs a
    completion column, or assistant messages in its prompt (a conversation)."""
    shuffle: bool = True
    """Shuffle the training examples each epoch (seeded by ``seed``)."""

    def __post_init__(self) -> None:
        check_fields(self, "sft")
        for name in ("epochs", "batch_size", "max_length"):
            check_positive_int(f"sft.{name}", getattr(self, name))
        if not self.completion_key:
            fail("sft.completion_key", self.completion_key, "a column name")
        template = self.completion_template
        if template is not None:
            try:
                fields_used = [name for _, name, _, _ in string.Formatter().parse(template) if name]
            except ValueError as e:
                fail("sft.completion_template", template, f"a Python format string ({e})")
            if not fields_used:
                fail("sft.completion_template", template, "a format string naming a field, e.g. "
                                                          "'<answer>{answer}</answer>'")


@dataclass
class SFTActorConfig:
    """The ``actor`` section as sft reads it: what trains the policy, under fit's keys."""

    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    """AdamW and its schedule (``actor.optimizer.*``), over the run's optimizer steps."""

    def __post_init__(self) -> None:
        self.optimizer = as_config(OptimizerConfig, "optimizer", self.optimizer)
        check_fields(self, "actor")
