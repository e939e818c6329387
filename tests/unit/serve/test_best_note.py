"""``tandem serve runs/NAME`` serves the latest checkpoint; when the run kept a ``best/`` model it says so."""

from __future__ import annotations

import json
from pathlib import Path

from tandem.cli.serve import best_model_note


def _run(tmp_path: Path, record: object | None) -> Path:
    run = tmp_path / "run"
    (run / "checkpoints" / "step-300" / "model").mkdir(parents=True)
    if record is not None:
        (run / "best").mkdir()
        text = record if isinstance(record, str) else json.dumps(record)
        (run / "best" / "best.json").write_text(text)
    return run


def test_note_names_best_metric_step_and_folder(tmp_path: Path) -> None:
    run = _run(tmp_path, {"step": 250, "metric": "eval/accuracy", "mode": "max", "value": 0.905})
    note = best_model_note(str(run))
    assert note is not None
    assert "eval/accuracy 0.905 at step 250" in note and str(run / "best") in note


def test_no_note_without_best_or_for_a_model_folder(tmp_path: Path) -> None:
    run = _run(tmp_path, None)
    assert best_model_note(str(run)) is None
    assert best_model_note(str(run / "checkpoints" / "step-300" / "model")) is None


def test_unreadable_record_gives_no_note(tmp_path: Path) -> None:
    assert best_model_note(str(_run(tmp_path, "{not json"))) is None
    assert best_model_note(str(_run(tmp_path / "b", {"step": 1}))) is None
