"""Export faults on a real trained checkpoint: an --output that would replace what export reads, a
SIGKILL in the middle of the write or at any point of publishing over the old --output (a model
directory stands there at every instant), the modes of the written files, a place that is read-only or
full."""

from __future__ import annotations

import errno
import hashlib
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from lit_ppo.training.checkpoint_io import AtomicCheckpointIO
from tests.faults.filesystems import limit_file_size, mounted_tmpfs, read_only_directory
from tests.integration.conftest import FAST, reap, run_cli, run_dir, sigkill

pytestmark = pytest.mark.slow
EXPORT_FILES = {"config.json", "generation_config.json", "lit_ppo_model.json", "model.safetensors", "tokenizer.json",
                "tokenizer_config.json", "chat_template.jinja"}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A real run of 2 iterations of the tiny model through the CLI: cwd, dir (its run directory), ckpt."""
    cwd = tmp_path_factory.mktemp("trained")
    result = run_cli(["fit", *FAST], cwd)
    assert result.returncode == 0, result.stderr[-3000:]
    return SimpleNamespace(cwd=cwd, dir=run_dir(cwd), ckpt=run_dir(cwd) / "checkpoints" / "last.ckpt")


@pytest.fixture
def export_here(trained, monkeypatch, capfd):
    """``python -m lit_ppo export ...`` through its entry point in this process, with the run's cache:
    (exit code, stderr)."""
    from lit_ppo.__main__ import main

    monkeypatch.setenv("LIT_PPO_CACHE", str(trained.cwd / "cache"))
    capfd.readouterr()

    def call(*args: str, ckpt: Path = trained.ckpt) -> tuple[int, str]:
        code = main(["export", "--ckpt_path", str(ckpt), *args])
        return code, capfd.readouterr().err

    return call


@pytest.fixture
def no_model_load(monkeypatch):
    """Make loading a model fail: what is refused here is refused before any model loads."""
    import lit_ppo.run.export

    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(lit_ppo.run.export, "load_causal_lm", refuse)


def files(root: Path) -> dict[str, str]:
    """Every file under ``root`` (hidden ones included) and the SHA-256 of its content."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def leftovers(output: Path) -> list[str]:
    """Temporary and set-aside directories of ``output`` beside it."""
    return sorted(p.name for p in output.parent.iterdir() if p.name.startswith(f".{output.name}."))


def umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


# ---------------------------------------------------------------------------------------------
# --output never is, contains or lies inside what export reads
# ---------------------------------------------------------------------------------------------

def test_export_refuses_to_write_over_its_own_input(trained, tmp_path, export_here, no_model_load, monkeypatch):
    before = files(trained.cwd)
    # One real process: the exit code and stderr a user sees.
    result = run_cli(["export", "--ckpt_path", str(trained.ckpt), "--output", str(trained.dir), "--overwrite"],
                     trained.cwd)
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        f"error: --output {trained.dir}: contains the checkpoint {trained.ckpt}, which export reads: "
        f"give a directory apart from it"]
    assert files(trained.cwd) == before
    # The other places through the same entry point, with or without --overwrite, spelled through a
    # symlink, `..` or `~`.
    link = tmp_path / "link"
    link.symlink_to(trained.dir)
    monkeypatch.setenv("HOME", str(trained.dir.parent))
    home_spelled = f"~/{trained.dir.name}/checkpoints"
    for output, flags, how in [
        (trained.dir / "checkpoints", ["--overwrite"], "contains"),
        (trained.dir / "checkpoints", [], "contains"),
        (trained.cwd, ["--overwrite"], "contains"),
        (trained.ckpt, ["--overwrite"], "is"),
        (trained.ckpt / "sub", [], "is inside"),
        (link, ["--overwrite"], "contains"),
        (trained.dir / "model" / ".." / "checkpoints", ["--overwrite"], "contains"),
        (home_spelled, ["--overwrite"], "contains"),
    ]:
        code, err = export_here("--output", str(output), *flags)
        shown = Path(output).expanduser().absolute()
        assert code == 2 and err.splitlines() == [
            f"error: --output {shown}: {how} the checkpoint {trained.ckpt}, which export reads: "
            f"give a directory apart from it"], (output, err)
    # The tiny model's cache entry, which the base model is read from.
    code, err = export_here("--output", str(trained.cwd / "cache"), "--overwrite")
    (entry,) = (trained.cwd / "cache").glob("tiny-*")
    assert code == 2 and err.splitlines() == [
        f"error: --output {trained.cwd / 'cache'}: contains the cache entry of model.source=tiny {entry}, "
        f"which export reads: give a directory apart from it"]
    assert files(trained.cwd) == before
    # A place apart from them is exported to.
    monkeypatch.undo()
    from lit_ppo.__main__ import main

    monkeypatch.setenv("LIT_PPO_CACHE", str(trained.cwd / "cache"))
    assert main(["export", "--ckpt_path", str(trained.ckpt), "--output", str(tmp_path / "exported")]) == 0
    assert {p.name for p in (tmp_path / "exported").iterdir()} == EXPORT_FILES


def test_export_refuses_to_write_over_a_local_base_model(trained, tmp_path, export_here, no_model_load):
    """A checkpoint of a model trained from a local directory: that directory is read too."""
    (entry,) = (trained.cwd / "cache").glob("tiny-*")
    base = tmp_path / "models" / "base"  # a local model directory: the tiny model's files, by a symlink
    base.parent.mkdir()
    base.symlink_to(entry)
    before = files(entry)
    checkpoint = torch.load(trained.ckpt, map_location="cpu", weights_only=True)
    checkpoint["hyper_parameters"]["model"]["source"] = str(base)
    ckpt = tmp_path / "local.ckpt"
    AtomicCheckpointIO().save_checkpoint(checkpoint, ckpt)  # with the digest of its new content
    for output, how in [(tmp_path / "models", "contains"), (base / "exported", "is inside"), (entry, "is")]:
        code, err = export_here("--output", str(output), "--overwrite", ckpt=ckpt)
        assert code == 2 and err.splitlines() == [
            f"error: --output {output}: {how} the base model directory (model.source) {base}, which export "
            f"reads: give a directory apart from it"]
    assert files(entry) == before


def test_export_never_writes_into_a_run_nor_over_what_holds_runs_stores_or_the_working_directory(
        trained, tmp_path, export_here, no_model_load, monkeypatch):
    model = trained.dir / "model"
    before = files(trained.cwd)
    # One real process: the run's final model is not replaced by an older checkpoint's weights.
    result = run_cli(["export", "--ckpt_path", str(trained.ckpt), "--output", str(model), "--overwrite"], trained.cwd)
    assert result.returncode == 2 and result.stderr.splitlines() == [
        f"error: --output {model}: is inside the run directory {trained.dir}, whose files its fit writes; export "
        f"never writes there, with or without --overwrite: give a new directory apart from it"]
    assert files(trained.cwd) == before
    # Places that hold runs, tracking stores, the working or the home directory.
    work = tmp_path / "work"
    (work / "project").mkdir(parents=True)
    (work / "project" / "mlflow.db").write_bytes(b"runs")
    (tmp_path / "filestore" / "mlruns" / "0").mkdir(parents=True)
    old_run = tmp_path / "old" / "runs" / "lit_ppo" / "grpo-1"
    (old_run / "checkpoints").mkdir(parents=True)
    (old_run / "config.yaml").write_text("seed: 0\n")
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "home").mkdir()
    monkeypatch.chdir(work / "project")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'elsewhere' / 'runs.db'}")
    (tmp_path / "elsewhere" / "runs.db").write_bytes(b"runs")
    kept = files(tmp_path)
    for output, shown, reason in [
        (model / "sub", model / "sub", f"is inside the run directory {trained.dir}, whose files its fit writes"),
        (old_run, old_run, f"is the run directory {old_run}, whose files its fit writes"),
        (".", work / "project", "is the working directory"),
        (str(work), work, f"holds the working directory {work / 'project'}"),
        ("~", tmp_path / "home", "is the home directory"),
        (str(tmp_path / "filestore"), tmp_path / "filestore",
         f"holds the MLflow tracking store {tmp_path / 'filestore' / 'mlruns'}"),
        (str(tmp_path / "old"), tmp_path / "old", f"holds the run directory {old_run}"),
        (str(tmp_path / "elsewhere"), tmp_path / "elsewhere",
         f"holds the MLflow tracking store {tmp_path / 'elsewhere' / 'runs.db'}"),
    ]:
        code, err = export_here("--output", str(output), "--overwrite")
        assert code == 2 and err.splitlines() == [
            f"error: --output {shown}: {reason}; export never writes there, with or without --overwrite: give a "
            f"new directory apart from it"], (output, err)
    assert files(tmp_path) == kept and files(trained.cwd) == before


# ---------------------------------------------------------------------------------------------
# a killed export, file modes
# ---------------------------------------------------------------------------------------------

# The export's own process, held once every file of the new directory is written into its temporary
# directory and before that is published, so that the kill lands in the middle of the export.
HELD_EXPORT = """
import sys
import lit_ppo.models.hf_dir as hf_dir

write = hf_dir.write_hf_files

def write_and_hold(model, tokenizer, path):
    write(model, tokenizer, path)
    print("written", path, flush=True)
    sys.stdin.readline()

hf_dir.write_hf_files = write_and_hold
from lit_ppo.__main__ import main
sys.exit(main(sys.argv[1:]))
"""


def test_an_export_killed_while_writing_leaves_its_output_intact_and_the_next_cleans_up(trained, tmp_path,
                                                                                         export_here):
    output = tmp_path / "exported"
    output.mkdir()
    (output / "notes.txt").write_text("mine")
    child = subprocess.Popen(
        [sys.executable, "-c", HELD_EXPORT, "export", "--ckpt_path", str(trained.ckpt), "--output", str(output),
         "--overwrite"], env={**os.environ, "LIT_PPO_CACHE": str(trained.cwd / "cache")},
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = child.stdout.readline()
        assert line.startswith("written "), child.communicate(timeout=60)[1][-3000:]
        temp = Path(line.split(" ", 1)[1].strip())
        assert temp.parent == tmp_path and temp.name.startswith(".exported.tmp-")
        # the new export, its model files complete (the record of its base model follows them), not published
        assert {p.name for p in temp.iterdir()} == EXPORT_FILES - {"lit_ppo_model.json"}
        sigkill(child)
    finally:
        reap(child)
    assert files(output) == {"notes.txt": hashlib.sha256(b"mine").hexdigest()}
    assert leftovers(output) == [temp.name]
    (tmp_path / ".other.tmp-1").mkdir()  # another directory's temporary is not this export's to remove
    code, err = export_here("--output", str(output), "--overwrite")
    assert code == 0, err
    assert {p.name for p in output.iterdir()} == EXPORT_FILES
    assert leftovers(output) == [] and (tmp_path / ".other.tmp-1").is_dir()


def test_exported_files_get_the_modes_of_new_files(trained, tmp_path, export_here):
    previous = os.umask(0o027)
    try:
        code, err = export_here("--output", str(tmp_path / "exported"))
    finally:
        os.umask(previous)
    assert code == 0, err
    output = tmp_path / "exported"
    assert output.stat().st_mode & 0o777 == 0o777 & ~0o027
    assert {p.name: p.stat().st_mode & 0o777 for p in output.iterdir()} == {n: 0o666 & ~0o027 for n in EXPORT_FILES}


# ---------------------------------------------------------------------------------------------
# a place that cannot be written
# ---------------------------------------------------------------------------------------------

def test_export_to_a_full_filesystem_fails_in_one_line_and_keeps_the_previous_content(trained, tmp_path):
    output = tmp_path / "exported"
    output.mkdir()
    (output / "notes.txt").write_text("mine")
    weights = trained.cwd / "cache"
    (entry,) = weights.glob("tiny-*")
    limit = (entry / "model.safetensors").stat().st_size // 2  # the weights file cannot be written whole
    result = subprocess.run(
        [sys.executable, "-m", "lit_ppo", "export", "--ckpt_path", str(trained.ckpt), "--output", str(output),
         "--overwrite"], env={**os.environ, "LIT_PPO_CACHE": str(weights)}, capture_output=True, text=True,
        timeout=300, preexec_fn=limit_file_size(limit))
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        f"error: --output {output}: cannot be written: {os.strerror(errno.EFBIG)} (its previous content is kept)"]
    assert files(output) == {"notes.txt": hashlib.sha256(b"mine").hexdigest()} and leftovers(output) == []


def test_export_to_a_read_only_place_is_refused_before_any_model_loads(tmp_path, export_here, no_model_load):
    with read_only_directory(tmp_path / "ro") as ro:
        code, err = export_here("--output", str(ro / "new" / "exported"))
        reason = os.strerror(errno.EROFS if os.geteuid() == 0 else errno.EACCES)
        assert code == 2 and err.splitlines() == [
            f"error: --output {ro / 'new' / 'exported'}: cannot be written, {ro} is not writable ({reason})"]
        assert list(ro.iterdir()) == []


def test_export_to_a_filesystem_without_room_fails_in_one_line(tmp_path, export_here):
    with mounted_tmpfs(tmp_path / "small", "size=64k") as small:
        code, err = export_here("--output", str(small / "exported"))
        assert code == 1 and err.splitlines() == [f"error: --output {small / 'exported'}: cannot be written: "
                                                  f"{os.strerror(errno.ENOSPC)} (nothing was written)"]
        assert list(small.iterdir()) == []


# ---------------------------------------------------------------------------------------------
# the export at the end of fit
# ---------------------------------------------------------------------------------------------

@pytest.mark.filterwarnings("ignore:Checkpoint directory .* exists and is not empty")
@pytest.mark.parametrize("place, how, what", [
    (".", "contains", "the checkpoint directory of ModelCheckpoint"),
    ("run", "contains", "the checkpoint directory of ModelCheckpoint"),
    ("run/checkpoints", "is", "the checkpoint directory of ModelCheckpoint"),
    ("run/checkpoints/model", "is inside", "the checkpoint directory of ModelCheckpoint"),
    ("run/config", "is", "the run directory (trainer.default_root_dir)"),
])
def test_fit_refuses_an_end_export_over_the_runs_own_files_when_it_starts(tmp_path, monkeypatch, place, how, what):
    """A user's ExportModel(dirpath=...) whose export would replace the run's files is refused before
    the first step, not after training."""
    import lightning as L
    from lightning.pytorch.callbacks import ModelCheckpoint
    from lightning.pytorch.demos.boring_classes import BoringModel

    from lit_ppo.callbacks.export import ExportModel
    from lit_ppo.errors import ConfigError

    monkeypatch.chdir(tmp_path)
    root = tmp_path / ("run/config" if place == "run/config" else "run")
    (tmp_path / "run" / "checkpoints").mkdir(parents=True)
    (tmp_path / "run" / "checkpoints" / "last.ckpt").write_bytes(b"an earlier checkpoint")
    before = files(tmp_path)
    trainer = L.Trainer(default_root_dir=root, max_steps=1, logger=False, enable_progress_bar=False,
                        enable_model_summary=False, callbacks=[
                            ExportModel(dirpath=place), ModelCheckpoint(dirpath=tmp_path / "run" / "checkpoints")])
    with pytest.raises(ConfigError) as refused:
        trainer.fit(BoringModel())
    path = tmp_path / "run" / "checkpoints" if "checkpoint" in what else root
    assert str(refused.value) == (f"ExportModel dirpath={place}: {how} {what} {path}, which the export at the end "
                                  f"of fit would overwrite: give a directory apart from it")
    assert trainer.global_step == 0 and files(tmp_path) == before


# The export's own process, held at a point of publishing its new --output over the old one (argv[1]):
# "exchanging", its new directory complete and about to be exchanged with the old one; "exchanged", just
# after; "removing", the old content (now in the temporary directory) partly removed.
HELD_AT = """
import os
import shutil
import sys

import lit_ppo.utils.fs as fs

point = sys.argv[1]
exchange, rmtree = fs.exchange, shutil.rmtree
exchanged = []


def hold(path):
    print(point, path, flush=True)
    sys.stdin.readline()


def exchange_and_hold(temp, path):
    if point == "exchanging":
        hold(temp)
    assert exchange(temp, path)
    exchanged.append(temp)
    if point == "exchanged":
        hold(temp)
    return True


def rmtree_and_hold(path, *args, **kwargs):
    if point == "removing" and path in exchanged:
        os.unlink(os.path.join(path, sorted(os.listdir(path))[0]))
        hold(path)
    rmtree(path, *args, **kwargs)


fs.exchange = exchange_and_hold
shutil.rmtree = rmtree_and_hold
from lit_ppo.__main__ import main
sys.exit(main(sys.argv[2:]))
"""
KILL_POINTS = {"exchanging": "old", "exchanged": "new", "removing": "new"}
"""Where the kill lands, and which model it leaves at --output."""


def exchanges_here(tmp_path: Path) -> bool:
    """Whether the filesystem of ``tmp_path`` can exchange two directories (lit_ppo.utils.exchange)."""
    from lit_ppo.utils.exchange import exchange

    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    try:
        return exchange(tmp_path / "a", tmp_path / "b")
    finally:
        (tmp_path / "a").rmdir()
        (tmp_path / "b").rmdir()


def test_an_export_killed_while_publishing_leaves_a_complete_model_at_its_output_at_every_instant(
        trained, tmp_path, export_here):
    if not exchanges_here(tmp_path):
        pytest.skip("the filesystem of the tests cannot exchange two directories (lit_ppo.utils.exchange)")
    output = tmp_path / "exported"
    code, err = export_here("--output", str(output))
    assert code == 0, err
    new = files(output)  # what every export of this checkpoint writes
    seen, stop = [], threading.Event()

    def watch() -> None:  # --output as a reader sees it, polled through every export below
        while not stop.is_set():
            try:
                seen.append(frozenset(os.listdir(output)))
            except FileNotFoundError:
                seen.append(None)
            time.sleep(0.0002)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        for point, left in KILL_POINTS.items():
            (output / "notes.txt").write_text(f"before the kill at {point}")  # tells the old model from the new
            old = files(output)
            child = subprocess.Popen(
                [sys.executable, "-c", HELD_AT, point, "export", "--ckpt_path", str(trained.ckpt), "--output",
                 str(output), "--overwrite"], env={**os.environ, "LIT_PPO_CACHE": str(trained.cwd / "cache")},
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            try:
                line = child.stdout.readline()
                assert line.startswith(f"{point} "), child.communicate(timeout=60)[1][-3000:]
                sigkill(child)
            finally:
                reap(child)
            assert files(output) == (old if left == "old" else new), point
        # The next export finds the model in place (nothing to put back) and removes what the kills left.
        assert leftovers(output) != []
        code, err = export_here("--output", str(output), "--overwrite")
        assert code == 0 and err == ""
    finally:
        stop.set()
        watcher.join()
    assert files(output) == new and leftovers(output) == []
    assert len(seen) > 100 and set(seen) == {frozenset(new), frozenset(new) | {"notes.txt"}}


# The export's own process on a filesystem that cannot exchange, held once it has set the old --output
# aside and before it renames the new one into its place: the kill lands between the two renames.
HELD_BETWEEN_RENAMES = """
import os
import sys

import lit_ppo.utils.fs as fs

rename = os.rename

def rename_and_hold(source, destination, *args, **kwargs):
    rename(source, destination, *args, **kwargs)
    if os.path.basename(destination).startswith(".exported.old-"):
        print("aside", destination, flush=True)
        sys.stdin.readline()

os.rename = rename_and_hold
fs.exchange = lambda first, second: False
from lit_ppo.__main__ import main
sys.exit(main(sys.argv[1:]))
"""


def test_without_an_exchange_an_export_killed_between_its_renames_gets_the_old_output_back_from_the_next(
        trained, tmp_path, export_here):
    output = tmp_path / "exported"
    output.mkdir()
    (output / "notes.txt").write_text("mine")
    child = subprocess.Popen(
        [sys.executable, "-c", HELD_BETWEEN_RENAMES, "export", "--ckpt_path", str(trained.ckpt), "--output",
         str(output), "--overwrite"], env={**os.environ, "LIT_PPO_CACHE": str(trained.cwd / "cache")},
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = child.stdout.readline()
        assert line.startswith("aside "), child.communicate(timeout=60)[1][-3000:]
        aside = Path(line.split(" ", 1)[1].strip())
        sigkill(child)
    finally:
        reap(child)
    assert not output.exists() and aside.name in leftovers(output)  # the moment the kill left
    # The next export, without --overwrite, finds the user's directory back in place and keeps it.
    code, err = export_here("--output", str(output))
    assert code == 2 and err.splitlines() == [
        f"note: --output {output}: an export was cut short while replacing it; its previous content is back from "
        f"{aside}",
        f"error: --output {output}: exists and is not empty (give --overwrite to replace it)"]
    assert files(output) == {"notes.txt": hashlib.sha256(b"mine").hexdigest()}
    code, err = export_here("--output", str(output), "--overwrite")
    assert code == 0, err
    assert {p.name for p in output.iterdir()} == EXPORT_FILES and leftovers(output) == []
