"""``lit_ppo.launch.run.run``: LitPPOCLI reads the tree from a temporary YAML that no run leaves behind."""

from __future__ import annotations

import tempfile

import pytest
import yaml

from lit_ppo.launch.run import run


@pytest.fixture
def temp_dir(tmp_path, monkeypatch):
    """A temporary directory of the test's own for ``tempfile``."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path


def test_the_builder_reads_the_tree_and_the_file_is_removed(temp_dir):
    seen = []

    def builder(args):
        path = args[args.index("--config") + 1]
        seen.append((args, yaml.safe_load(open(path))))
        return "built"

    tree = {"model": {"algo": "grpo"}, "trainer": {"max_steps": 3}}
    assert run("fit", tree, "a.ckpt", flags=["--print_config"], builder=builder) == "built"
    ((args, read),) = seen
    assert args[0] == "fit" and args[3:] == ["--print_config", "--ckpt_path", "a.ckpt"]
    assert read == tree
    assert list(temp_dir.iterdir()) == []


def test_the_file_is_removed_when_the_run_fails(temp_dir):
    def builder(args):
        assert any(temp_dir.glob("lit_ppo_*.yaml"))
        raise SystemExit(1)

    with pytest.raises(SystemExit):
        run("validate", {"trainer": {}}, builder=builder)
    assert list(temp_dir.iterdir()) == []


def test_without_a_tree_the_flags_name_the_config():
    calls = []
    run("test", None, "b.ckpt", flags=["--config", "run.yaml"], builder=calls.append)
    assert calls == [["test", "--config", "run.yaml", "--ckpt_path", "b.ckpt"]]
