"""Fixtures shared by every test folder."""

from __future__ import annotations

import pytest


@pytest.fixture
def no_model_loading(monkeypatch):
    """Any attempt to build the model fails the test: configuration errors must come first."""
    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the config error was reported")

    monkeypatch.setattr("lit_ppo.module.load_causal_lm", refuse)
