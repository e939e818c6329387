"""``tandem distill --targets FILE``: the file is a cache keyed by what made it (teacher folder and files,
the pairs, top-k). Another teacher, a teacher retrained in place or other task options recompute it instead
of reusing stale targets (or crashing on their shape); its folder is created when missing."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from tandem.cli.main import app
from tandem.errors import DataError
from tandem.models import init_tiny_model
from tandem.train.distill import stored_fingerprint, targets_fingerprint

TASK = ["--task", "arith", "--task-option", "ops=+", "--train-size", "16"]
FAST = ["--student", "hidden_size=16,num_heads=2", "--steps", "1", "--batch-size", "8", "--top-k", "4"]


def _distill(teacher: Path, targets: Path, out: Path, *task: str):
    argv = ["distill", str(teacher), *FAST, *task, "--targets", str(targets), "--out", str(out)]
    return CliRunner().invoke(app, argv)


def test_targets_follow_teacher_and_data(tmp_path):
    teacher = init_tiny_model(tmp_path / "teacher", hidden_size=32, num_layers=1, num_heads=2, seed=0)
    targets = tmp_path / "missing" / "folder" / "targets.safetensors"  # parent created on write
    first = _distill(teacher, targets, tmp_path / "s1", *TASK, "--task-option", "digits=1")
    assert first.exit_code == 0, first.output
    made = stored_fingerprint(targets)
    assert made is not None

    reused = _distill(teacher, targets, tmp_path / "s2", *TASK, "--task-option", "digits=1")
    assert reused.exit_code == 0, reused.output
    assert "teacher top-k logits" not in reused.output and stored_fingerprint(targets) == made

    other_task = _distill(teacher, targets, tmp_path / "s3", *TASK, "--task-option", "digits=2")
    assert other_task.exit_code == 0, other_task.output  # was: ValueError (targets' shape vs the mask)
    assert "recomputing" in other_task.output and stored_fingerprint(targets) != made

    other = init_tiny_model(tmp_path / "other", hidden_size=32, num_layers=1, num_heads=2, seed=1)
    by_other = stored_fingerprint(targets)
    swapped = _distill(other, targets, tmp_path / "s4", *TASK, "--task-option", "digits=2")
    assert swapped.exit_code == 0, swapped.output  # was: the first teacher's targets, silently
    assert "recomputing" in swapped.output and stored_fingerprint(targets) != by_other


def test_fingerprint_covers_teacher_files_pairs_and_top_k(tmp_path):
    teacher = tmp_path / "teacher"
    teacher.mkdir()
    (teacher / "model.safetensors").write_bytes(b"weights")
    pairs = [("1+1=", "2"), ("2+2=", "4")]
    base = targets_fingerprint(teacher, pairs, 4)
    assert targets_fingerprint(teacher, pairs, 4) == base
    assert targets_fingerprint(teacher, pairs, 5) != base
    assert targets_fingerprint(teacher, pairs[:1], 4) != base
    assert targets_fingerprint(teacher, [("1+1=", "3"), ("2+2=", "4")], 4) != base
    (teacher / "model.safetensors").write_bytes(b"retrained")  # same path, new weights
    assert targets_fingerprint(teacher, pairs, 4) != base


def test_a_file_that_is_not_targets_is_one_line_and_kept(tmp_path):
    path = tmp_path / "notes.safetensors"
    path.write_text("not a safetensors file")
    with pytest.raises(DataError, match="notes.safetensors: not a targets file") as err:
        stored_fingerprint(path)
    assert "\n" not in str(err.value)
    assert path.read_text() == "not a safetensors file"
