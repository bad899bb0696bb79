"""A hub id (``org/name``) whose model is in the local Hugging Face cache trains offline as ``model=org/name``,
and its checkpoint, which records the id, is scored again from the cache; a hub id neither local nor cached
is one line naming the download command."""

from __future__ import annotations

import pytest
import yaml

from lit_ppo.models import load_causal_lm, model_dir_problem
from tests.faults.test_bad_input import error_of
from tests.integration.conftest import FAST, run_dir
from tests.integration.test_own_model import _tiny_dir

HUB_ID = "my-org/tiny-chat"
REVISION = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture(scope="module")
def hf_home(tmp_path_factory):
    """An HF_HOME whose hub cache holds ``HUB_ID`` as huggingface_hub lays it out: the files of a snapshot
    under ``models--org--name/snapshots/<revision>`` and ``refs/main`` naming that revision."""
    home = tmp_path_factory.mktemp("hf-home")
    entry = home / "hub" / f"models--{HUB_ID.replace('/', '--')}"
    (entry / "snapshots").mkdir(parents=True)
    _tiny_dir(home / "build").rename(entry / "snapshots" / REVISION)
    (entry / "refs").mkdir()
    (entry / "refs" / "main").write_text(REVISION)
    return home


def test_a_cached_hub_id_trains_offline_and_its_checkpoint_finds_it_again(cli, hf_home, monkeypatch):
    env = {"HF_HOME": str(hf_home), "HF_HUB_OFFLINE": "1"}
    result = cli("fit", f"model={HUB_ID}", *FAST, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    run = run_dir(cli.cwd)
    assert yaml.safe_load((run / "config.yaml").read_text())["model"]["model"]["source"] == HUB_ID
    scored = cli("validate", "--ckpt_path", str(run / "checkpoints" / "last.ckpt"), env=env)
    assert scored.returncode == 0, scored.stderr[-3000:]
    assert "eval/accuracy" in scored.stdout
    monkeypatch.setenv("HF_HOME", str(hf_home))
    model, _ = load_causal_lm(HUB_ID)
    assert model.config.num_hidden_layers == 2


def test_a_hub_id_neither_local_nor_cached(capsys, tmp_path, monkeypatch, no_model_loading):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    expected = (f"is neither a local directory nor in the Hugging Face cache ({tmp_path / 'hf' / 'hub'}): download "
                f"it first with: hf download my-org/absent")
    assert error_of(capsys, "model=my-org/absent") == f"error: model=my-org/absent {expected}"
    assert model_dir_problem("my-org/absent") == expected
