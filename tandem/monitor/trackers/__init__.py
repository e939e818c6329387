"""Experiment trackers: a run's metrics, samples and config also go to a tracking service
(``monitor.report_to``, TRL's name for it: ``[wandb]``).

A tracker is one module here plus one line in :data:`TRACKERS` (``name -> "module:Class"``, imported
only when a run asks for it, so the service's package stays optional). It receives what
:class:`~tandem.monitor.MetricsLogger` writes to ``metrics.jsonl`` and ``samples.jsonl`` — the same
values, at the same steps — and is closed when the run ends. Only the process that runs the training loop
reports (the colocated driver, the decoupled learner's rank 0), so a multi-process run is one tracked run. The
run's alerts go to the trackers too.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from tandem.errors import ConfigError

# name -> (module:class, the package it needs, the extra that installs it)
TRACKERS: dict[str, tuple[str, str, str]] = {
    "wandb": ("tandem.monitor.trackers.wandb_tracker:WandbTracker", "wandb", "wandb"),
}
KEY = "monitor.report_to"


@dataclass(frozen=True)
class TrackerRun:
    """What a tracker is told about the run it reports: where it lives, what it is called and how it
    was configured. ``start_step`` > 0: a resumed run, which reports from there on."""

    run_dir: Path
    name: str
    config: Mapping[str, Any]
    project: str | None = None
    group: str | None = None
    tags: tuple[str, ...] = ()
    start_step: int = 0


class Tracker(Protocol):
    """One tracking service's run. Values are plain numbers (NaN/inf included) keyed by the stable metric
    names (``reward/mean``, ``eval/accuracy``, …); ``step`` is the number of completed training steps."""

    def log(self, step: int, values: Mapping[str, float]) -> None: ...

    def log_samples(self, step: int, rows: Sequence[Mapping[str, Any]]) -> None: ...

    def alert(self, message: str) -> None:
        """An alert the run raised (``monitor.alerts``, a non-finite metric), as the service shows one."""
        ...

    def close(self, *, failed: bool = False) -> None: ...


def check_trackers(names: Sequence[str]) -> None:
    """Every name is a known tracker whose package is installed; otherwise a ConfigError naming
    ``monitor.report_to`` and what to install, before anything is trained or written."""
    for name in names:
        if name not in TRACKERS:
            raise ConfigError(f"unknown tracker '{name}'; valid: {', '.join(TRACKERS)}", where=KEY)
        _, package, extra = TRACKERS[name]
        if importlib.util.find_spec(package) is None:
            raise ConfigError(
                f"tracker '{name}' needs the {package} package",
                where=KEY,
                hint=f"pip install 'tandem-rl[{extra}]'",
            )


def open_trackers(names: Sequence[str], run: TrackerRun) -> list[Tracker]:
    """Start one run per tracker name (:func:`check_trackers` first); closes the ones already started
    when a later one fails to start."""
    check_trackers(names)
    opened: list[Tracker] = []
    try:
        for name in names:
            module, cls = TRACKERS[name][0].split(":")
            opened.append(getattr(importlib.import_module(module), cls)(run))
    except BaseException:
        for tracker in opened:
            tracker.close(failed=True)
        raise
    return opened
