"""A small rich progress bar for command-line loops (SFT, DPO, ...)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)


@contextlib.contextmanager
def step_progress(label: str, total: int, *, key: str) -> Iterator[Callable[[int, dict[str, float]], None]]:
    """Yield an ``on_step(step, metrics)`` callback that advances a bar showing ETA and ``metrics[key]``."""
    columns = (
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("eta"),
        TimeRemainingColumn(),
        TextColumn("{task.fields[info]}"),
    )
    with Progress(*columns, transient=False) as bar:
        task = bar.add_task(label, total=total, info="")

        def on_step(step: int, metrics: dict[str, float]) -> None:
            bar.update(
                task, completed=step, info=f"{key.split('/')[-1]} {metrics.get(key, float('nan')):.4f}"
            )

        yield on_step
