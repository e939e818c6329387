"""A small rich progress bar for command-line loops (SFT, DPO, ...)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Protocol

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)


def _columns(*extra: TextColumn) -> tuple:
    """Description, bar, done/total, elapsed, ETA, then ``extra``."""
    return (
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("eta"),
        TimeRemainingColumn(),
        *extra,
    )


@contextlib.contextmanager
def count_progress(label: str, console: Console | None = None) -> Iterator[Callable[[int, int], None]]:
    """Yield ``on_progress(done, total)`` driving a bar with elapsed time and ETA."""
    with Progress(*_columns(), console=console, transient=False) as bar:
        task = bar.add_task(label, total=None)
        yield lambda done, total: bar.update(task, completed=done, total=total)


class StepCallback(Protocol):
    """``on_step(step, metrics, total=None)`` of :func:`step_progress`."""

    def __call__(self, step: int, metrics: dict[str, float], total: int | None = None) -> None: ...


@contextlib.contextmanager
def step_progress(label: str, total: int, *, key: str) -> Iterator[StepCallback]:
    """Yield an ``on_step(step, metrics, total=None)`` callback that advances a bar showing ETA and
    ``metrics[key]`` (kept from the last call when absent); ``total`` re-sizes the bar."""
    with Progress(*_columns(TextColumn("{task.fields[info]}")), transient=False) as bar:
        task = bar.add_task(label, total=total, info="")

        def on_step(step: int, metrics: dict[str, float], total: int | None = None) -> None:
            info = f"{key.split('/')[-1]} {metrics.get(key, float('nan')):.4f}" if key in metrics else None
            bar.update(task, completed=step, total=total, **({} if info is None else {"info": info}))

        yield on_step
