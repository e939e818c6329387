"""Assertions shared by the end-to-end and integration tests of training runs (imported by test modules;
``tests/`` is on ``sys.path`` through its ``conftest.py``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tandem.monitor import read_metrics


def step_rows(run_dir: Path) -> list[dict[str, Any]]:
    """The metric rows of training steps (step ≥ 1; step 0 holds the evaluation before training)."""
    return [r for r in read_metrics(run_dir) if r["step"] >= 1]


def check_accounting(result: Any, steps: int, batch: int = 8) -> dict[str, Any]:
    """A decoupled run's sample accounting is exact and no ticket was trained twice; returns it."""
    acc = json.loads((result.run_dir / "summary.json").read_text())["accounting"]
    assert acc["trained_samples"] == steps * batch and acc["trained_batches"] == steps
    assert (
        acc["received_samples"] == acc["trained_samples"] + acc["dropped_samples"] + acc["duplicate_samples"]
    )
    tickets = [r["decoupled/ticket"] for r in step_rows(result.run_dir)]
    assert len(tickets) == len(set(tickets)) == steps, "a ticket was trained twice"
    return acc
