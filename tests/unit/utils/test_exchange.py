"""Two paths swapped in one step (lit_ppo.utils.exchange), and a directory published by that exchange or,
where the filesystem cannot exchange, by two renames (lit_ppo.utils.fs.replace_directory)."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

import lit_ppo.utils.exchange as exchange_module
import lit_ppo.utils.fs as fs
from lit_ppo.utils.exchange import exchange


def directory(path, text: str):
    path.mkdir()
    (path / "file").write_text(text)
    return path


def test_two_directories_are_swapped(tmp_path):
    first, second = directory(tmp_path / "first", "one"), directory(tmp_path / "second", "two")
    if not exchange(first, second):
        pytest.skip("the filesystem of the tests cannot exchange two directories")
    assert (first / "file").read_text() == "two" and (second / "file").read_text() == "one"


def test_where_it_cannot_exchange_it_says_so_and_changes_nothing(tmp_path, monkeypatch):
    first, second = directory(tmp_path / "first", "one"), directory(tmp_path / "second", "two")
    monkeypatch.setattr(exchange_module, "_renameat2", lambda: None)  # not Linux, or a C library without it
    assert exchange(first, second) is False
    assert (first / "file").read_text() == "one" and (second / "file").read_text() == "two"


def test_any_other_failure_is_an_oserror_naming_both_paths(tmp_path):
    if exchange_module._renameat2() is None:
        pytest.skip("no renameat2 here")
    first = directory(tmp_path / "first", "one")
    with pytest.raises(FileNotFoundError) as failed:
        exchange(first, tmp_path / "missing")
    assert failed.value.errno == errno.ENOENT
    assert (failed.value.filename, failed.value.filename2) == (str(first), str(tmp_path / "missing"))


@pytest.mark.parametrize("exchanges", [True, False])
def test_a_directory_is_replaced_whole_with_or_without_an_exchange(tmp_path, monkeypatch, exchanges):
    if not exchanges:
        monkeypatch.setattr(fs, "exchange", lambda first, second: False)
    path = directory(tmp_path / "model", "old")
    new = fs.temporary_directory(path)
    (Path(new) / "file").write_text("new")
    fs.replace_directory(new, path)
    assert (path / "file").read_text() == "new" and sorted(p.name for p in tmp_path.iterdir()) == ["model"]
