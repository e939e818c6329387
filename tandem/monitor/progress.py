"""Training progress on the console: a live rich bar on a terminal, periodic plain lines elsewhere.

On a terminal the bar shows description, bar, step/total, elapsed, ETA and the latest key metrics
(``reward 0.53 · acc 71.0% · kl 0.002``). When stdout is not a terminal (CI logs, ``nohup``, pipes) a
live bar would either vanish or spam control codes, so the same information is printed as one plain
line at most every ``plain_interval_s`` seconds, plus the first and final steps.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterable, Mapping

from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.text import Text

log = logging.getLogger(__name__)

SHORT_LABELS: Mapping[str, str] = {
    "reward/mean": "reward",
    "eval/accuracy": "acc",
    "actor/kl": "kl",
    "response/length_mean": "len",
}


def format_metric_value(key: str, value: float) -> str:
    """Compact text for one metric: accuracies (fractions in [0, 1]) as percent, else 3 significant digits."""
    if not math.isfinite(value):
        return str(value)
    if key.endswith("accuracy"):
        return f"{100.0 * value:.1f}%"
    return f"{value:.3g}"


def format_key_metrics(latest: Mapping[str, float], keys: Iterable[str]) -> str:
    """``reward 0.53 · acc 71.0% · kl 0.002`` for those ``keys`` present in ``latest``, in key order."""
    parts = []
    for key in keys:
        if key in latest:
            label = SHORT_LABELS.get(key, key.rsplit("/", 1)[-1])
            parts.append(f"{label} {format_metric_value(key, latest[key])}")
    return " · ".join(parts)


def format_duration(seconds: float) -> str:
    """``H:MM:SS`` for a non-negative number of seconds, ``-:--:--`` when unknown."""
    if not math.isfinite(seconds) or seconds < 0:
        return "-:--:--"
    whole = int(round(seconds))
    return f"{whole // 3600}:{whole % 3600 // 60:02d}:{whole % 60:02d}"


class ProgressDisplay:
    """Shows step/total, elapsed, ETA and a metrics summary; live bar on a terminal, plain lines otherwise.

    ``step`` counts completed steps, so the display starts at ``start_step`` when resuming and the ETA
    uses only the speed measured in this process.
    """

    def __init__(
        self,
        *,
        total_steps: int,
        start_step: int = 0,
        console: Console,
        description: str = "train",
        plain_interval_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.total_steps = total_steps
        self.start_step = start_step
        self.console = console
        self.description = description
        self.plain_interval_s = plain_interval_s
        self._clock = clock
        self._started = clock()
        self._step = start_step
        self._summary = ""
        self._last_print: float | None = None
        self._printed_step: int | None = None
        self._progress: Progress | None = None
        if console.is_terminal:
            self._progress = _make_progress(console)
            self._task = self._progress.add_task(
                escape(description), total=total_steps, completed=start_step, metrics=""
            )
            self._progress.start()

    @property
    def live(self) -> bool:
        """True when a live rich bar is shown (terminal), False for plain periodic lines."""
        return self._progress is not None

    def update(self, step: int, summary: str) -> None:
        """Move to ``step`` completed steps and show ``summary`` (formatted key metrics)."""
        self._step = step
        self._summary = summary
        if self._progress is not None:
            self._progress.update(self._task, completed=step, metrics=summary)
            return
        now = self._clock()
        due = self._last_print is None or now - self._last_print >= self.plain_interval_s
        if due or step >= self.total_steps:
            self._print_plain(now)

    def alert(self, message: str) -> None:
        """Show a warning line above the bar (or as a plain line) right away."""
        self.console.print(Text(f"⚠ {message}", style="bold yellow"), soft_wrap=True)

    def close(self) -> None:
        """Stop the live bar, or print the final plain line if the last step was not printed yet."""
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
        elif self._printed_step != self._step and self._last_print is not None:
            self._print_plain(self._clock())

    def plain_line(self, now: float) -> str:
        """The non-terminal progress line for the current state at clock time ``now``."""
        elapsed = now - self._started
        done = self._step - self.start_step
        remaining = max(self.total_steps - self._step, 0)
        eta = elapsed / done * remaining if done > 0 else math.nan
        percent = 100.0 * self._step / self.total_steps if self.total_steps > 0 else 100.0
        parts = [
            f"{self.description} {self._step}/{self.total_steps} ({percent:.0f}%)",
            f"elapsed {format_duration(elapsed)}",
            f"eta {format_duration(eta)}",
        ]
        if self._summary:
            parts.append(self._summary)
        return " · ".join(parts)

    def _print_plain(self, now: float) -> None:
        self.console.print(self.plain_line(now), markup=False, highlight=False, soft_wrap=True)
        self._last_print = now
        self._printed_step = self._step


class MetricsProgress:
    """Metric rows shown on a :class:`ProgressDisplay`: keeps the latest number of every key and shows the
    ``key_metrics`` among them. With ``display=None`` nothing is shown and alerts go to the log.

    :class:`~tandem.monitor.metrics.MetricsLogger` feeds one in the training process; the Ray runtime's
    driver feeds one with the rows its learner actor forwards, so the bar shows where the user is.
    """

    def __init__(self, display: ProgressDisplay | None, key_metrics: Iterable[str]) -> None:
        self.display = display
        self.key_metrics = tuple(key_metrics)
        self.latest: dict[str, float] = {}

    def log(self, step: int, values: Mapping[str, object]) -> None:
        """Record the numbers of one row (``bool`` and non-numbers are skipped) and update the display."""
        for key, value in values.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                self.latest[key] = float(value)
        if self.display is not None:
            self.display.update(step, format_key_metrics(self.latest, self.key_metrics))

    def alert(self, message: str) -> None:
        if self.display is not None:
            self.display.alert(message)
        else:
            log.warning("%s", message)

    def close(self) -> None:
        if self.display is not None:
            self.display.close()


def _make_progress(console: Console) -> Progress:
    return Progress(
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("eta"),
        TimeRemainingColumn(),
        TextColumn("{task.fields[metrics]}", markup=False),
        console=console,
    )
