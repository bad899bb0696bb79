"""lit_ppo.run.loggers: the MLflow loggers of a config and the tracking settings they resolve."""

from __future__ import annotations

import pytest

from lit_ppo.run.loggers import mlflow_loggers, tracking_setting, tracking_uris

MLFLOW = {"class_path": "lit_ppo.run.loggers.MLflowRunLogger", "init_args": {"tracking_uri": None}}
CSV = {"class_path": "lit_ppo.run.loggers.CSVRunLogger", "init_args": {}}


def test_the_mlflow_loggers_of_a_config_are_found_by_their_class():
    assert [spec for _, spec in mlflow_loggers([CSV, MLFLOW])] == [MLFLOW]
    assert mlflow_loggers(CSV) == [] and mlflow_loggers(None) == []


def test_tracking_settings_left_unset_come_from_the_environment(monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "sqlite:///from_env.db")
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "from_env")
    cls = mlflow_loggers(MLFLOW)[0][0]
    assert tracking_setting(cls, {}) == ("sqlite:///from_env.db", "MLFLOW_TRACKING_URI", "from_env")
    assert tracking_setting(cls, {"tracking_uri": "sqlite:///given.db", "experiment_name": "given"}) == (
        "sqlite:///given.db", "logger.init_args.tracking_uri", "given")
    assert tracking_uris({"trainer": {"logger": [CSV, MLFLOW]}}) == ["sqlite:///from_env.db"]


@pytest.mark.parametrize("logger", [False, None])
def test_a_config_without_loggers_tracks_nowhere(logger):
    assert tracking_uris({"trainer": {"logger": logger}}) == []
