"""Test doubles shared by the rollout tests (and the fault tests that script rollouts): engines and a task."""

from __future__ import annotations

from dataclasses import replace

from lit_ppo.rollout.engines.protocol import Completion, SamplingParams


class FakeEngineBase:
    """The RolloutEngine methods a scripted engine does not care about; subclasses define generate."""

    version: int

    def update_weights(self, weights, version):
        self.version = version

    def sleep(self):
        pass

    def wake(self):
        pass


class ScriptedEngine(FakeEngineBase):
    """Returns, on call k, ``script[k]`` (one completion per prompt, in order, tagged with its version);
    records every call and bumps its version after each call (as if weights were pushed between turns)."""

    def __init__(self, script: list[list[Completion]], version: int = 7):
        self.script, self.version = script, version
        self.prompts: list[list[list[int]]] = []
        self.params: list[SamplingParams] = []
        self.versions: list[int] = []

    def generate(self, prompts, params):
        k = len(self.prompts)
        self.prompts.append([list(p) for p in prompts])
        self.params.append(params)
        self.versions.append(self.version)
        tagged = [[replace(completion, version=self.version)] for completion in self.script[k]]
        self.version += 1
        return tagged


class Numbers:
    """A task of ``n`` train problems, the numbers 0 to n - 1."""

    name = "numbers"

    def __init__(self, n: int):
        self.train = list(range(n))

    def problems(self, split: str) -> list[int]:
        return self.train if split == "train" else []
