"""A small rich progress bar for command-line loops (SFT, DPO, ...); in a pipe or a log file, where a bar
draws nothing until it ends, a plain line every few seconds instead (as ``tandem train`` does)."""

from __future__ import annotations

import contextlib
import time
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


PLAIN_INTERVAL_S = 5.0  # seconds between plain progress lines


class _PlainLines:
    """``label done/total elapsed eta info`` printed at most every :data:`PLAIN_INTERVAL_S` seconds, and
    once at the end: progress that reads in a log file."""

    def __init__(self, console: Console, label: str) -> None:
        # the first update always prints: a monotonic clock starts near 0 at boot, so "last = 0" held back the
        # first line on a machine up for less than PLAIN_INTERVAL_S (a fresh CI machine, with the test's 1 h)
        self.console, self.label, self.t0, self.last = console, label, time.monotonic(), None
        self.done, self.total, self.info = 0, None, ""

    def update(self, done: int, total: int | None, info: str | None = None, *, final: bool = False) -> None:
        self.done, self.total = done, total if total is not None else self.total
        self.info = info if info is not None else self.info
        now = time.monotonic()
        if not final and self.last is not None and now - self.last < PLAIN_INTERVAL_S:
            return
        self.last, elapsed = now, now - self.t0
        eta = ""
        if self.total and 0 < self.done < self.total:
            eta = f" · eta {elapsed / self.done * (self.total - self.done):.0f}s"
        of = f"/{self.total}" if self.total else ""
        info_part = f" · {self.info}" if self.info else ""
        self.console.print(
            f"{self.label} {self.done}{of} · {elapsed:.0f}s{eta}{info_part}", highlight=False, markup=False
        )


@contextlib.contextmanager
def count_progress(label: str, console: Console | None = None) -> Iterator[Callable[[int, int], None]]:
    """Yield ``on_progress(done, total)`` driving a bar with elapsed time and ETA."""
    console = console if console is not None else Console()
    if not console.is_terminal:
        lines = _PlainLines(console, label)
        yield lambda done, total: lines.update(done, total)
        lines.update(lines.done, lines.total, final=True)
        return
    with Progress(*_columns(), console=console, transient=False) as bar:
        task = bar.add_task(label, total=None)
        moved = False

        def update(done: int, total: int) -> None:
            nonlocal moved
            moved = True
            bar.update(task, completed=done, total=total)

        try:
            yield update
        except BaseException:
            # a command that fails before any progress (a missing folder) leaves its error, not an empty bar;
            # one that fails half-way keeps the bar that shows how far it got
            bar.live.transient = not moved
            raise


class StepCallback(Protocol):
    """``on_step(step, metrics, total=None)`` of :func:`step_progress`."""

    def __call__(self, step: int, metrics: dict[str, float], total: int | None = None) -> None: ...


@contextlib.contextmanager
def step_progress(label: str, total: int, *, key: str) -> Iterator[StepCallback]:
    """Yield an ``on_step(step, metrics, total=None)`` callback that advances a bar showing ETA and
    ``metrics[key]`` (kept from the last call when absent); ``total`` re-sizes the bar."""
    console = Console()
    if not console.is_terminal:
        lines = _PlainLines(console, label)
        lines.total = total

        def plain_step(step: int, metrics: dict[str, float], total: int | None = None) -> None:
            info = f"{key.split('/')[-1]} {metrics[key]:.4f}" if key in metrics else None
            lines.update(step, total, info)

        yield plain_step
        lines.update(lines.done, lines.total, final=True)
        return
    with Progress(*_columns(TextColumn("{task.fields[info]}")), console=console, transient=False) as bar:
        task = bar.add_task(label, total=total, info="")

        def on_step(step: int, metrics: dict[str, float], total: int | None = None) -> None:
            info = f"{key.split('/')[-1]} {metrics.get(key, float('nan')):.4f}" if key in metrics else None
            bar.update(task, completed=step, total=total, **({} if info is None else {"info": info}))

        yield on_step
