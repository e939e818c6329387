"""`tandem report` on a damaged run folder: a non-integer ``step`` (in metrics, samples or alerts) or a
line nested too deeply is one line naming file:line and exit 2, not a traceback while plotting."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from tandem.cli.main import app
from tandem.errors import DataError
from tandem.report.data import load_run


def _run_folder(tmp_path, metrics, **files):
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in metrics))
    for name, rows in files.items():
        (run / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return run


GOOD = [{"step": 0, "eval/accuracy": 0.1}, {"step": 1, "reward/mean": 0.5}]


def test_report_non_integer_step_in_metrics_names_file_and_line(tmp_path):
    run = _run_folder(tmp_path, [*GOOD, {"step": "two", "reward/mean": 0.6}])
    result = CliRunner().invoke(app, ["report", str(run)])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert f"error: {run}/metrics.jsonl:3: 'step' must be an integer, got 'two'" in result.output


@pytest.mark.parametrize("step", [None, 1.5, True, [1], {"n": 1}])
def test_report_rejects_every_non_integer_step(tmp_path, step):
    run = _run_folder(tmp_path, [GOOD[0], {"step": step}])
    with pytest.raises(DataError, match=r"metrics.jsonl:2: 'step' must be an integer"):
        load_run(run)


def test_report_non_integer_step_in_samples_and_alerts_is_named(tmp_path):
    run = _run_folder(tmp_path, GOOD, samples=[{"step": "1", "prompt": "p", "completion": "c"}])
    with pytest.raises(DataError, match=r"samples.jsonl:1: 'step' must be an integer, got '1'"):
        load_run(run)
    (run / "samples.jsonl").unlink()
    (run / "alerts.jsonl").write_text(json.dumps({"step": "x", "rule": "r"}) + "\n")
    with pytest.raises(DataError, match=r"alerts.jsonl:1: 'step' must be an integer"):
        load_run(run)


def test_report_metrics_line_nested_too_deeply_names_file_and_line(tmp_path):
    run = _run_folder(tmp_path, GOOD)
    with (run / "metrics.jsonl").open("a") as fh:
        fh.write('{"step": 2, "x": ' + "[" * 100_000 + "]" * 100_000 + "}\n")
    with pytest.raises(DataError, match=r"metrics.jsonl:3: JSON nested too deeply"):
        load_run(run)


def test_report_of_a_sound_folder_still_loads(tmp_path):
    run = _run_folder(tmp_path, GOOD, alerts=[{"rule": "no step"}])
    data = load_run(run)
    assert [r["step"] for r in data.rows] == [0, 1] and data.alerts == [{"rule": "no step"}]
