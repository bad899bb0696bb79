"""Test doubles shared by the workflow tests."""

from __future__ import annotations


class FakeEngineBase:
    """The RolloutEngine methods a scripted engine does not care about; subclasses define generate."""

    version: int

    def update_weights(self, weights, version):
        self.version = version

    def sleep(self):
        pass

    def wake(self):
        pass
