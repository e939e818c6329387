"""What ``tandem train`` prints at the end: the held-out table only when an evaluation ran."""

from __future__ import annotations

from rich.console import Console

from tandem.cli.report import print_run_result
from tandem.orchestration.runfolder import RunResult


def _printed(result: RunResult) -> str:
    (result.run_dir / "metrics.jsonl").write_text('{"step": 1, "loss": 0.5}\n')
    console = Console(record=True, width=120)
    print_run_result(console, result)
    return console.export_text()


def test_a_run_without_held_out_data_prints_no_empty_table(tmp_path):
    text = _printed(RunResult(run_dir=tmp_path, steps=3))
    assert "held-out evaluation" not in text
    assert "(3 steps)" in text


def test_a_run_with_an_evaluation_prints_before_and_after(tmp_path):
    result = RunResult(
        run_dir=tmp_path, steps=3, eval_before={"eval/accuracy": 0.25}, eval_after={"eval/accuracy": 0.5}
    )
    text = _printed(result)
    assert "held-out evaluation" in text
    assert "25.0%" in text and "50.0%" in text
