"""Atomic writes: readers see old or new content, failures leave nothing behind."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from tandem.utils import io
from tandem.utils.io import atomic_dir, atomic_write_json, atomic_write_text, fsync_tree
from tandem.utils.jsonable import to_jsonable


def _names(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_atomic_write_text_replaces_and_leaves_no_temp(tmp_path: Path) -> None:
    target = tmp_path / "sub" / "a.txt"
    atomic_write_text(target, "one")
    atomic_write_text(target, "two")
    assert target.read_text() == "two"
    assert _names(target.parent) == ["a.txt"]


def test_atomic_write_text_failure_keeps_old_content(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "a.txt"
    atomic_write_text(target, "old")

    def broken_replace(src: str, dst: str) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(io.os, "replace", broken_replace)
    with pytest.raises(OSError, match="disk full"):
        atomic_write_text(target, "new")
    assert target.read_text() == "old"
    assert _names(tmp_path) == ["a.txt"]


def test_atomic_write_json_makes_values_json_safe(tmp_path: Path) -> None:
    target = tmp_path / "s.json"
    atomic_write_json(target, {"a": float("nan"), "b": np.float32(0.5), "c": torch.tensor(3), "d": (1, 2)})
    assert json.loads(target.read_text()) == {"a": None, "b": 0.5, "c": 3, "d": [1, 2]}


def test_to_jsonable_converts_nested_and_non_finite() -> None:
    value = {1: [float("inf"), np.int64(2), torch.tensor([1.0, 2.0])], "p": Path("x"), "o": object}
    out = to_jsonable(value)
    assert out["1"] == [None, 2, [1.0, 2.0]]
    assert out["p"] == "x"
    assert isinstance(out["o"], str)
    json.dumps(out, allow_nan=False)


def test_atomic_dir_publishes_on_success(tmp_path: Path) -> None:
    final = tmp_path / "ckpt"
    with atomic_dir(final) as tmp:
        assert tmp.name == f".ckpt.tmp-{os.getpid()}"
        assert not final.exists()
        (tmp / "nested").mkdir()
        (tmp / "nested" / "w.bin").write_bytes(b"123")
    assert (final / "nested" / "w.bin").read_bytes() == b"123"
    assert _names(tmp_path) == ["ckpt"]


def test_atomic_dir_leaves_nothing_on_exception(tmp_path: Path) -> None:
    final = tmp_path / "ckpt"
    with pytest.raises(KeyError), atomic_dir(final) as tmp:
        (tmp / "half.bin").write_bytes(b"x")
        raise KeyError("boom")
    assert _names(tmp_path) == []


def test_atomic_dir_exception_keeps_existing_folder(tmp_path: Path) -> None:
    final = tmp_path / "ckpt"
    final.mkdir()
    (final / "old.txt").write_text("old")
    with pytest.raises(RuntimeError), atomic_dir(final) as tmp:
        (tmp / "new.txt").write_text("new")
        raise RuntimeError
    assert _names(final) == ["old.txt"]
    assert _names(tmp_path) == ["ckpt"]


def test_atomic_dir_replaces_existing_folder(tmp_path: Path) -> None:
    final = tmp_path / "ckpt"
    final.mkdir()
    (final / "old.txt").write_text("old")
    with atomic_dir(final) as tmp:
        (tmp / "new.txt").write_text("new")
    assert _names(final) == ["new.txt"]
    assert _names(tmp_path) == ["ckpt"]


def test_atomic_dir_failed_swap_restores_old_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    final = tmp_path / "ckpt"
    final.mkdir()
    (final / "old.txt").write_text("old")
    real_replace = os.replace

    def replace(src: os.PathLike[str], dst: os.PathLike[str]) -> None:
        if Path(src).name.startswith(".ckpt.tmp-"):
            raise OSError("rename failed")
        real_replace(src, dst)

    monkeypatch.setattr(io.os, "replace", replace)
    with pytest.raises(OSError, match="rename failed"), atomic_dir(final) as tmp:
        (tmp / "new.txt").write_text("new")
    assert _names(final) == ["old.txt"]
    assert _names(tmp_path) == ["ckpt"]


def test_atomic_dir_fsyncs_every_file_before_rename(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    events: list[tuple[str, str]] = []
    monkeypatch.setattr(io, "fsync_file", lambda p: events.append(("file", Path(p).name)))
    monkeypatch.setattr(io, "fsync_dir", lambda p: events.append(("dir", Path(p).name)))
    real_replace = os.replace
    monkeypatch.setattr(
        io.os, "replace", lambda s, d: (events.append(("rename", Path(d).name)), real_replace(s, d))
    )
    with atomic_dir(tmp_path / "out") as tmp:
        (tmp / "a").write_text("a")
        (tmp / "sub").mkdir()
        (tmp / "sub" / "b").write_text("b")
    rename_at = events.index(("rename", "out"))
    before = events[:rename_at]
    assert {("file", "a"), ("file", "b"), ("dir", "sub"), ("dir", tmp.name)} <= set(before)
    assert events[rename_at + 1 :] == [("dir", tmp_path.name)]  # the rename itself is made durable


def test_fsync_tree_visits_all_files_and_dirs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "x" / "y").mkdir(parents=True)
    (tmp_path / "x" / "y" / "f").write_text("1")
    (tmp_path / "g").write_text("2")
    files: list[str] = []
    dirs: list[str] = []
    monkeypatch.setattr(io, "fsync_file", lambda p: files.append(Path(p).name))
    monkeypatch.setattr(io, "fsync_dir", lambda p: dirs.append(Path(p).name))
    fsync_tree(tmp_path)
    assert sorted(files) == ["f", "g"]
    assert dirs == ["y", "x", tmp_path.name]  # deepest first, root last


def test_fsync_tree_real_calls_succeed(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "f").write_text("1")
    fsync_tree(tmp_path)
