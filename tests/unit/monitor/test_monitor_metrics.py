"""MetricsLogger: JSONL lines, TensorBoard events, progress output, samples, resume and bad input."""

from __future__ import annotations

import io
import json
import logging
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from rich.console import Console

from tandem.errors import DataError
from tandem.monitor import MetricsLogger, read_metrics, read_samples
from tandem.monitor.progress import ProgressDisplay, format_duration, format_key_metrics


def _console(terminal: bool) -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, force_terminal=terminal, width=200, color_system=None), out


def test_log_writes_one_json_line_per_call(tmp_path: Path) -> None:
    with MetricsLogger(tmp_path, total_steps=3, tensorboard=False, progress=False) as logger:
        logger.log(1, {"reward/mean": 0.5, "actor/kl": np.float32(0.25)})
        logger.log(1, {"eval/accuracy": torch.tensor(0.75)})
        logger.log(2, {"reward/mean": 0.6, "note": "text"})
        lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
        assert len(lines) == 3  # flushed before close
    rows = read_metrics(tmp_path)
    assert [row["step"] for row in rows] == [1, 1, 2]
    assert rows[0]["reward/mean"] == 0.5 and rows[0]["actor/kl"] == 0.25
    assert rows[1]["eval/accuracy"] == 0.75 and rows[2]["note"] == "text"
    assert all(isinstance(row["time"], float) for row in rows)


def test_non_finite_values_become_null_and_alert_once(tmp_path: Path) -> None:
    with MetricsLogger(tmp_path, total_steps=3, tensorboard=False, progress=False) as logger:
        logger.log(1, {"actor/pg_loss": float("nan"), "x": float("inf")})
        logger.log(2, {"actor/pg_loss": float("nan")})
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert json.loads(lines[0]) | {"time": 0} == {"step": 1, "time": 0, "actor/pg_loss": None, "x": None}
    assert list(logger.alerts) == ["actor/pg_loss is nan at step 1", "x is inf at step 1"]


def test_reserved_metric_names_are_rejected(tmp_path: Path) -> None:
    logger = MetricsLogger(tmp_path, total_steps=1, tensorboard=False, progress=False)
    with logger, pytest.raises(ValueError, match="reserved"):
        logger.log(1, {"step": 3})


def test_tensorboard_event_files_are_written(tmp_path: Path) -> None:
    with MetricsLogger(tmp_path, total_steps=2, progress=False) as logger:
        logger.log(1, {"reward/mean": 0.5, "flag": True, "name": "skip me"})
        logger.log_samples(1, [{"prompt": "1+1=", "completion": "2 | ok", "reward": 1.0}])
    events = list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    assert len(events) == 1 and events[0].stat().st_size > 0


def test_missing_tensorboard_warns_once_and_logging_continues(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)
    with caplog.at_level(logging.WARNING), MetricsLogger(tmp_path, total_steps=2, progress=False) as logger:
        logger.log(1, {"reward/mean": 0.5})
        logger.log(2, {"reward/mean": 0.6})
    assert sum("TensorBoard logging disabled" in r.message for r in caplog.records) == 1
    assert len(read_metrics(tmp_path)) == 2
    assert not (tmp_path / "tensorboard").exists()


def test_plain_progress_lines_when_not_a_terminal(tmp_path: Path) -> None:
    console, out = _console(terminal=False)
    logger = MetricsLogger(tmp_path, total_steps=10, tensorboard=False, console=console)
    logger.log(1, {"reward/mean": 0.53, "eval/accuracy": 0.71, "actor/kl": 0.002})
    logger.log(2, {"reward/mean": 0.6})  # within the print interval: no new line
    logger.alert("reward collapsed")
    logger.log(10, {"reward/mean": 0.9})  # final step always prints
    logger.close()
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("train 1/10 (10%) · elapsed 0:00:00 · eta ")
    assert lines[0].endswith("reward 0.53 · acc 71.0% · kl 0.002")
    assert lines[1] == "⚠ reward collapsed"
    assert lines[2].startswith("train 10/10 (100%)") and "reward 0.9 · acc 71.0%" in lines[2]
    assert len(lines) == 3
    assert "\x1b[" not in out.getvalue()


def test_plain_progress_prints_again_after_interval_and_on_close() -> None:
    console, out = _console(terminal=False)
    now = [100.0]
    display = ProgressDisplay(total_steps=100, start_step=40, console=console, clock=lambda: now[0])
    now[0] = 110.0
    display.update(50, "reward 1")  # first update prints: 10 steps in 10 s → 50 s left
    now[0] = 112.0
    display.update(51, "")  # 2 s later: suppressed
    now[0] = 116.0
    display.update(52, "")  # 6 s after the last print: printed
    now[0] = 117.0
    display.update(53, "")
    display.close()  # prints the unprinted final state
    lines = out.getvalue().splitlines()
    assert lines[0] == "train 50/100 (50%) · elapsed 0:00:10 · eta 0:00:50 · reward 1"
    assert [line.split(" · ")[0] for line in lines] == [
        "train 50/100 (50%)",
        "train 52/100 (52%)",
        "train 53/100 (53%)",
    ]


def test_live_progress_bar_on_a_terminal(tmp_path: Path) -> None:
    console, out = _console(terminal=True)
    with MetricsLogger(tmp_path, total_steps=4, tensorboard=False, console=console) as logger:
        for step in range(1, 5):
            logger.log(step, {"reward/mean": 0.25 * step})
    text = out.getvalue()
    assert "4/4" in text and "reward 1" in text


def test_progress_false_prints_nothing_and_alerts_are_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    console, out = _console(terminal=False)
    with (
        caplog.at_level(logging.WARNING),
        MetricsLogger(tmp_path, total_steps=2, tensorboard=False, progress=False, console=console) as logger,
    ):
        logger.log(1, {"reward/mean": 0.5})
        logger.alert("something odd")
    assert out.getvalue() == ""
    assert any(r.message == "something odd" for r in caplog.records)


def test_log_samples_appends_rows_and_keeps_latest(tmp_path: Path) -> None:
    with MetricsLogger(tmp_path, total_steps=2, tensorboard=False, progress=False) as logger:
        logger.log_samples(1, [{"prompt": "a", "completion": "b", "reward": 0.0}])
        logger.log_samples(2, [{"prompt": "c", "completion": "d", "reward": 1.0, "answer": "d"}] * 2)
        assert logger.latest_samples == [{"prompt": "c", "completion": "d", "reward": 1.0, "answer": "d"}] * 2
    rows = read_samples(tmp_path)
    assert [row["step"] for row in rows] == [1, 2, 2]
    assert rows[1]["answer"] == "d"


def test_resume_drops_rows_after_start_step_and_fresh_run_starts_empty(tmp_path: Path) -> None:
    with MetricsLogger(tmp_path, total_steps=5, tensorboard=False, progress=False) as logger:
        for step in range(1, 6):
            logger.log(step, {"reward/mean": float(step)})
            logger.log_samples(step, [{"prompt": "p", "completion": str(step)}])
    with MetricsLogger(tmp_path, total_steps=5, tensorboard=False, progress=False, start_step=3) as logger:
        logger.log(4, {"reward/mean": 40.0})
    assert [(r["step"], r["reward/mean"]) for r in read_metrics(tmp_path)] == [
        (1, 1),
        (2, 2),
        (3, 3),
        (4, 40),
    ]
    assert [r["step"] for r in read_samples(tmp_path)] == [1, 2, 3]
    MetricsLogger(tmp_path, total_steps=5, tensorboard=False, progress=False).close()
    assert read_metrics(tmp_path) == []


def test_read_metrics_skips_torn_last_line_but_rejects_corrupt_middle(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1}\n{"step": 2, "re')
    assert read_metrics(tmp_path) == [{"step": 1}]
    path.write_text('{"step": 1}\nnot json\n{"step": 3}\n')
    with pytest.raises(DataError, match=r"metrics.jsonl:2: malformed JSON"):
        read_metrics(tmp_path)
    with pytest.raises(DataError, match="file not found"):
        read_metrics(tmp_path / "nowhere")


def test_format_helpers() -> None:
    latest = {"reward/mean": 0.5312, "eval/accuracy": 0.71, "actor/kl": 0.002, "response/length_mean": 31.25}
    keys = ("reward/mean", "eval/accuracy", "actor/kl", "response/length_mean", "missing/key")
    assert format_key_metrics(latest, keys) == "reward 0.531 · acc 71.0% · kl 0.002 · len 31.2"
    assert format_key_metrics({"actor/entropy": float("nan")}, ["actor/entropy"]) == "entropy nan"
    assert format_duration(3725.4) == "1:02:05"
    assert format_duration(float("nan")) == "-:--:--"
