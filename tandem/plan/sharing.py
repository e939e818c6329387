"""Processor sharing of a pool of cores: how fast each busy phase runs while others compute beside it.

On one machine the rollout workers and the learner are processes on the same cores. Each busy phase holds
``threads`` runnable threads (its torch thread count); other jobs on the machine add ``background``
runnable threads (a time average). While the run's busy threads plus the background fit the ``cores``,
each phase gets its threads' worth of cores; beyond that the scheduler splits the cores evenly between
runnable threads, so a phase gets ``cores · threads / total`` (the fair share of Linux's scheduler).

Phase times are calibrated on a run where each phase computed alone (a colocated run: one process, one
phase at a time, ``reference_threads`` threads, beside ``reference_background`` runnable threads of other
jobs: the same background as now unless measured otherwise). A phase then runs at
``share / reference share`` of its calibrated speed: its work is assumed to scale with the cores it gets,
up to its thread count.

Fair sharing of CPU time is not the whole cost of computing side by side: processes on neighbouring cores
also slow each other through shared caches and memory bandwidth. ``interference`` holds, per phase kind
(``"generate"``, ``"update"``), the measured slowdown of that kind while other processes compute beside it,
beyond what fair sharing explains (:func:`interference_factor`; measured by ``bench/plan_interference.py``).
A phase's speed is divided by its kind's factor whenever another of the run's phases is busy at the same
time; 1.0 (the default) is pure processor sharing.

Pure functions over a frozen dataclass; :mod:`tandem.plan.simulate` applies them whenever the set of busy
phases changes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TypeVar

from tandem.errors import ConfigError

K = TypeVar("K")


@dataclass(frozen=True)
class CorePool:
    """``cores`` shared by the run's processes and ``background`` runnable threads of other jobs; phase
    times were calibrated with ``reference_threads`` threads computing alone beside
    ``reference_background`` (None: the same background); ``interference``: slowdown per phase kind while
    another of the run's phases computes beside it, beyond the fair share (a kind not named: 1.0)."""

    cores: float
    background: float = 0.0
    reference_threads: float = 1.0
    reference_background: float | None = None
    interference: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        ref_bg = self.background if self.reference_background is None else self.reference_background
        if not (self.cores > 0 and self.background >= 0 and self.reference_threads > 0 and ref_bg >= 0):
            raise ConfigError(
                f"a core pool needs cores > 0, backgrounds >= 0, reference threads > 0 (got {self.cores}, "
                f"{self.background}, {ref_bg}, {self.reference_threads})",
                where="--cores",
            )
        bad = {k: f for k, f in self.interference.items() if not f > 0}
        if bad:
            raise ConfigError(f"interference factors must be > 0 (got {bad})", where="interference")

    def share(self, threads: float, others: float = 0.0, *, background: float | None = None) -> float:
        """Cores a phase of ``threads`` runnable threads gets while the run's other busy phases hold
        ``others`` threads: its threads when everything fits, else its fair share of the cores."""
        total = (self.background if background is None else background) + threads + others
        if total <= self.cores:
            return float(threads)
        return self.cores * threads / total

    @property
    def reference_share(self) -> float:
        """Cores a calibrated phase got: ``reference_threads`` computing alone beside its background."""
        return self.share(self.reference_threads, background=self.reference_background)

    def speed(self, threads: float, others: float = 0.0, kind: str | None = None) -> float:
        """Speed of a phase of ``kind`` relative to its calibrated speed (1 = as fast as measured alone):
        its core share, divided by the kind's interference factor while ``others`` > 0."""
        slow = self.interference.get(kind, 1.0) if kind is not None and others > 0 else 1.0
        return self.share(threads, others) / self.reference_share / slow


def speeds(
    pool: CorePool | None, busy: Mapping[K, float], kinds: Mapping[K, str] | None = None
) -> dict[K, float]:
    """Speed of each busy phase (``busy``: its runnable threads; ``kinds``: its phase kind, for the
    pool's interference factors) while all of them compute at once; every speed is 1 without a pool
    (each phase on devices of its own)."""
    if pool is None:
        return dict.fromkeys(busy, 1.0)
    total = sum(busy.values())
    kinds = kinds or {}
    return {k: pool.speed(t, total - t, kinds.get(k)) for k, t in busy.items()}


def fair_slowdown(processes: int, cores: float) -> float:
    """How much longer each of ``processes`` single-thread processes computing at once takes than one
    alone, under fair sharing of ``cores`` idle cores: 1 while they fit, else ``processes / cores``."""
    return max(1.0, processes / cores)


def interference_factor(alone_s: float, together_s: float, processes: int, cores: float) -> float:
    """The co-run slowdown beyond fair sharing: a workload took ``alone_s`` alone and ``together_s``
    while ``processes`` single-thread copies (itself included) computed at once on ``cores`` cores."""
    if not (alone_s > 0 and together_s > 0 and processes >= 1):
        raise ValueError(f"need positive times and >= 1 process (got {alone_s}, {together_s}, {processes})")
    return together_s / alone_s / fair_slowdown(processes, cores)
