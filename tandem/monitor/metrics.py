"""One place a training loop sends its metrics: a JSONL file, TensorBoard and a progress display.

Files in the run folder:

- ``metrics.jsonl`` — one object per :meth:`MetricsLogger.log` call, ``{"step", "time", **metrics}``,
  flushed at once; NaN/inf are written as ``null`` (and raise an on-screen alert once per key).
- ``samples.jsonl`` — prompts, completions, rewards and any other fields from
  :meth:`MetricsLogger.log_samples`, so a person can spot reward hacking.
- ``tensorboard/`` — event files with the same scalars (optional dependency).

The same rows also go to experiment trackers (W&B, :mod:`tandem.monitor.trackers`) when given.

Metric names follow the stable scheme ``<group>/<name>`` (``reward/mean``, ``actor/kl``,
``timing/generate``, ``eval/accuracy`` as a fraction in [0, 1], …).
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol

from rich.console import Console

from tandem.monitor.jsonl import JsonlWriter, keep_rows_up_to, read_jsonl
from tandem.monitor.progress import MetricsProgress, ProgressDisplay
from tandem.monitor.tb import TensorBoardWriter
from tandem.monitor.trackers import Tracker

METRICS_FILE = "metrics.jsonl"
SAMPLES_FILE = "samples.jsonl"
TENSORBOARD_DIR = "tensorboard"
DEFAULT_KEY_METRICS = ("reward/mean", "eval/accuracy", "actor/kl", "response/length_mean")
_RESERVED_KEYS = frozenset({"step", "time"})
_MAX_SAMPLE_ROWS_IN_TENSORBOARD = 16


class MetricsListener(Protocol):
    """Also receives what a :class:`MetricsLogger` records (e.g. to forward it to another process)."""

    def log(self, step: int, values: Mapping[str, Any]) -> None: ...

    def alert(self, message: str) -> None: ...


_MAX_CELL_CHARS = 400


class MetricsLogger:
    """Writes metrics to ``run_dir/metrics.jsonl``, TensorBoard and a progress display.

    ``step`` is the number of completed training steps (the first step logs 1; an evaluation before
    training logs 0). With ``start_step > 0`` (resume from a checkpoint at that step) rows that a
    crashed run logged after ``start_step`` are removed from the JSONL files and hidden in TensorBoard,
    so the resumed run's logs match an uninterrupted run's. With ``start_step == 0`` the files start
    empty. Pass ``console`` to share the CLI's rich console (and in tests, to capture output),
    ``listener`` to hand every row and alert on as well, and ``trackers`` (started runs of experiment
    trackers, :func:`tandem.monitor.trackers.open_trackers`) to report every row and sample to them; the
    logger closes them (as failed when its ``with`` block raised).
    """

    def __init__(
        self,
        run_dir: str | Path,
        *,
        total_steps: int,
        key_metrics: Sequence[str] = DEFAULT_KEY_METRICS,
        tensorboard: bool = True,
        progress: bool = True,
        start_step: int = 0,
        console: Console | None = None,
        description: str = "train",
        plain_interval_s: float = 5.0,
        listener: MetricsListener | None = None,
        trackers: Sequence[Tracker] = (),
    ) -> None:
        if total_steps < 0 or start_step < 0:
            raise ValueError(f"total_steps and start_step must be ≥ 0, got {total_steps}, {start_step}")
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.listener = listener
        self.trackers = list(trackers)
        self.latest_samples: list[dict[str, Any]] = []
        self.alerts: deque[str] = deque(maxlen=50)
        self._non_finite_seen: set[str] = set()
        self._closed = False
        self._prepare_files(start_step)
        self._metrics = JsonlWriter(self.run_dir / METRICS_FILE)
        self._samples = JsonlWriter(self.run_dir / SAMPLES_FILE)
        self._tb = (
            TensorBoardWriter(
                self.run_dir / TENSORBOARD_DIR, purge_step=start_step + 1 if start_step else None
            )
            if tensorboard
            else None
        )
        display = (
            ProgressDisplay(
                total_steps=total_steps,
                start_step=start_step,
                console=console if console is not None else Console(),
                description=description,
                plain_interval_s=plain_interval_s,
            )
            if progress
            else None
        )
        self._view = MetricsProgress(display, key_metrics)

    @property
    def latest(self) -> dict[str, float]:
        """The latest number logged for every key."""
        return self._view.latest

    def _prepare_files(self, start_step: int) -> None:
        """Drop rows after ``start_step`` when resuming; start from empty files on a fresh run."""
        for name in (METRICS_FILE, SAMPLES_FILE):
            path = self.run_dir / name
            if start_step > 0:
                keep_rows_up_to(path, start_step)
            elif path.exists():
                path.unlink()

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        """Record ``metrics`` for ``step``: one JSONL line, TensorBoard scalars, progress update.

        Values are numbers (Python, numpy or 0-d torch); other values are written to JSONL only. A
        non-finite value is written as ``null`` and raises an alert the first time each key has one.
        """
        reserved = _RESERVED_KEYS.intersection(metrics)
        if reserved:
            raise ValueError(f"metric names {sorted(reserved)} are reserved by MetricsLogger")
        values = {key: _as_number(value) for key, value in metrics.items()}
        self._metrics.write({"step": step, "time": round(time.time(), 3), **values})
        if self._tb is not None:
            self._tb.scalars(step, values)
        for key, value in values.items():
            if isinstance(value, float) and not math.isfinite(value) and key not in self._non_finite_seen:
                self._non_finite_seen.add(key)
                self.alert(f"{key} is {value} at step {step}")
        self._view.log(step, values)
        for tracker in self.trackers:
            tracker.log(step, values)
        if self.listener is not None:
            self.listener.log(step, values)

    def log_samples(self, step: int, rows: Sequence[Mapping[str, Any]]) -> None:
        """Append sample rows (``prompt``, ``completion``, ``reward``, any other fields) for ``step``.

        The rows are also kept in :attr:`latest_samples` for the CLI's table and sent to TensorBoard
        as a markdown table.
        """
        self.latest_samples = [dict(row) for row in rows]
        for row in self.latest_samples:
            self._samples.write({"step": step, **row})
        if self._tb is not None and rows:
            self._tb.text("samples", _markdown_table(self.latest_samples), step)
        for tracker in self.trackers:
            tracker.log_samples(step, self.latest_samples)

    def alert(self, message: str) -> None:
        """Surface a warning (e.g. reward collapse, NaN loss) in the progress display, or log it."""
        self.alerts.append(message)
        self._view.alert(message)
        for tracker in self.trackers:
            tracker.alert(message)
        if self.listener is not None:
            self.listener.alert(message)

    def close(self, *, failed: bool = False) -> None:
        """Finish the progress display, close all files and end the trackers' runs (``failed``: as
        failed runs); safe to call twice."""
        if self._closed:
            return
        self._closed = True
        self._view.close()
        for tracker in self.trackers:
            tracker.close(failed=failed)
        if self._tb is not None:
            self._tb.close()
        self._metrics.close()
        self._samples.close()

    def __enter__(self) -> MetricsLogger:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close(failed=exc_type is not None)


def read_metrics(run_dir: str | Path) -> list[dict[str, Any]]:
    """Rows of ``run_dir/metrics.jsonl`` in order (``null`` for values that were NaN/inf)."""
    return read_jsonl(Path(run_dir) / METRICS_FILE)


def read_samples(run_dir: str | Path) -> list[dict[str, Any]]:
    """Rows of ``run_dir/samples.jsonl`` in order, each with its ``step``."""
    return read_jsonl(Path(run_dir) / SAMPLES_FILE)


def _as_number(value: Any) -> Any:
    """Python number for numpy/torch scalars; other values unchanged."""
    if isinstance(value, (bool, int, float)) or not hasattr(value, "item"):
        return value
    try:
        return value.item()
    except (TypeError, ValueError, RuntimeError):  # multi-element arrays stay as they are
        return value


def _markdown_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """A markdown table of the first rows, cells truncated and escaped, for TensorBoard's text tab."""
    columns: list[str] = []
    for row in rows:
        columns.extend(key for key in row if key not in columns)
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for row in rows[:_MAX_SAMPLE_ROWS_IN_TENSORBOARD]:
        lines.append("| " + " | ".join(_cell(row.get(key, "")) for key in columns) + " |")
    return "\n".join(lines)


def _cell(value: Any) -> str:
    text = f"{value:.4g}" if isinstance(value, float) else str(value)
    if len(text) > _MAX_CELL_CHARS:
        text = text[:_MAX_CELL_CHARS] + "…"
    return text.replace("|", "\\|").replace("\n", "<br>")
