"""Any reasoning-gym generator as a task: procedural problems with the dataset's own checker.

reasoning-gym (offline, no downloads) generates entries ``{"question", "answer", "metadata"}``
and scores an answer with ``dataset.score_answer(answer, entry)``. Its convention is that the
model gives the final answer inside ``<answer></answer>``, extracted with
``reasoning_gym.utils.extract_answer``; the instruction appended to every question is one of its
``SYSTEM_PROMPTS`` (the chat template is applied later, by the rollout workflow).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

from lit_ppo.tasks.base import Problem, split_problems
from lit_ppo.utils.text import closest


def _available_datasets() -> list[str]:
    import reasoning_gym  # noqa: F401  (importing registers every dataset; slow, so done lazily)
    from reasoning_gym.factory import DATASETS

    return sorted(DATASETS)


@dataclass
class ReasoningGymTask:
    """Problems of one reasoning-gym dataset, rewarded by that dataset's ``score_answer``."""

    dataset: str = "gsm_symbolic"
    """reasoning-gym dataset name (its registry key), e.g. 'gsm_symbolic', 'basic_arithmetic'."""
    size: int = 1000
    """Entries in the 'train' split."""
    seed: int = 0
    """Seed of the 'train' split; 'test' uses ``seed + size`` (see ``_split_seed``)."""
    test_size: int = 100
    """Problems in the 'test' split (0: none), held out: no training problem's question, none repeated (a
    generator with few distinct problems gives repeats and training ones, which are skipped)."""
    dataset_kwargs: dict[str, Any] = field(default_factory=dict)
    """Extra fields of the dataset's own config (e.g. ``{'min_terms': 2}``), validated by it."""
    prompt_style: str = "default"
    """Key of ``reasoning_gym.utils.SYSTEM_PROMPTS`` whose text follows each question."""

    _entries: dict[Problem, dict] = field(init=False, repr=False, compare=False)
    _splits: dict[str, tuple[Problem, ...]] = field(init=False, repr=False, compare=False)
    _scorer: Any = field(init=False, repr=False, compare=False, default=None)
    _instruction: str = field(init=False, repr=False, compare=False, default="")

    def __post_init__(self) -> None:
        from reasoning_gym.utils import SYSTEM_PROMPTS

        names = _available_datasets()
        if self.dataset not in names:
            close = closest(self.dataset, names, n=5, cutoff=0.5)
            hint = f"did you mean {', '.join(close)}? " if close else ""
            raise ValueError(f"dataset={self.dataset!r} is not a reasoning-gym dataset; {hint}"
                             f"{len(names)} are available, e.g. {', '.join(names[:8])}, ...")
        if self.prompt_style not in SYSTEM_PROMPTS:
            raise ValueError(f"prompt_style={self.prompt_style!r} is invalid: must be one of "
                             f"{', '.join(map(repr, SYSTEM_PROMPTS))}")
        for name in ("size", "test_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"{name}={value!r} is invalid: must be an integer >= 0")
        self._instruction = SYSTEM_PROMPTS[self.prompt_style]
        self._entries = {}
        # Generated eagerly (1000 gsm_symbolic entries take ~0.1 s, 10000 ~1.2 s) so that a bad
        # dataset config fails at construction and reward() can always find a problem's entry.
        train = self._generate(self._split_seed("train"), self.size)
        self._splits = {"train": train, "test": self._held_out(train)}

    @property
    def name(self) -> str:
        """The dataset's name: short, and valid in metric names and run names."""
        return self.dataset

    def _split_seed(self, split: str) -> int:
        # Most reasoning-gym generators seed entry i with Random(seed + i); offsetting the test
        # seed by `size` keeps the two splits' per-entry seeds disjoint (seed + 1 would not).
        return self.seed if split == "train" else self.seed + self.size

    def _held_out(self, train: tuple[Problem, ...]) -> tuple[Problem, ...]:
        """The first ``test_size`` problems of the test seed's entries whose question is new: neither a
        training problem's nor an earlier test problem's. More entries are generated while too few are
        new (entry i's seed is the same however many are made); ValueError when the generator runs dry."""
        if self.test_size == 0:
            return ()
        training, size = {p.prompt for p in train}, self.test_size
        while True:
            held_out, seen = [], set(training)
            for problem in self._generate(self._split_seed("test"), size):
                if problem.prompt not in seen:
                    seen.add(problem.prompt)
                    held_out.append(problem)
                    if len(held_out) == self.test_size:
                        return tuple(held_out)
            if size >= 50 * self.test_size:
                raise ValueError(f"test_size={self.test_size} is invalid for reasoning-gym dataset {self.dataset!r} "
                                 f"({self.dataset_kwargs!r}): {size} entries gave {len(held_out)} problems that are "
                                 f"not training ones and not repeated; lower test_size or size, or widen the "
                                 f"dataset's settings")
            size *= 2

    def _generate(self, seed: int, size: int) -> tuple[Problem, ...]:
        from reasoning_gym import create_dataset

        if size == 0:  # reasoning-gym configs reject size 0
            return ()
        try:
            data = create_dataset(self.dataset, seed=seed, size=size, **self.dataset_kwargs)
        except (AssertionError, TypeError) as e:  # its configs validate with assert
            raise ValueError(f"invalid config for reasoning-gym dataset {self.dataset!r} "
                             f"({self.dataset_kwargs!r}): {e}") from e
        # Scoring depends on the dataset's config, not on its seed: either split's instance will do.
        self._scorer = data.score_answer
        problems = []
        for entry in data:
            problem = Problem(prompt=f"{entry['question']}\n\n{self._instruction}",
                              answer=str(entry["answer"]))
            # Problem is a frozen (hashable) dataclass: it keys its entry, which score_answer
            # needs (some datasets check answers against metadata, not only the gold string).
            self._entries.setdefault(problem, entry)
            problems.append(problem)
        return tuple(problems)

    def problems(self, split: str) -> Sequence[Problem]:
        """The problems of 'train' or 'test', in the dataset's order (fixed by ``seed``)."""
        return split_problems(self._splits, split)

    def reward(self, problem: Problem, completion: str) -> float:
        """``score_answer`` of the last ``<answer>...</answer>`` in the completion; 0.0 without one.

        The dataset defines the scale: e.g. gsm_symbolic gives 1.0 for the right number, 0.01 for
        another number and 0.0 for no number.
        """
        from reasoning_gym.utils import extract_answer

        entry = self._entries.get(problem)
        if entry is None:
            raise ValueError(f"problem {problem.prompt[:60]!r}... is not one of this task's "
                             f"({self.dataset}, seed={self.seed}) problems")
        answer = extract_answer(completion)
        if answer is None:
            return 0.0
        try:
            return float(self._scorer(answer=answer, entry=entry))
        except Exception:
            # A model's output must never crash training; a checker that chokes on it scores 0.
            return 0.0

    def allowed_completion_tokens(self, tokenizer) -> None:
        """No restriction: completions are free text."""
        return None
