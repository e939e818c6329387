"""Staleness control for the decoupled architecture: a small pure component (stdlib only).

Notation: ``B`` samples per learner step (one *batch*), ``η`` the staleness bound, ``c`` the number of
batches the learner has consumed (trained or dropped), ``u`` the learner's policy version (updates done),
``v`` the version of the weights a sample was generated with, ``k`` the 0-based index of a batch in the
order generation of it started ("ticket").

* **Admission (capacity)** — AReaL-style: a rollout worker may start batch ``k`` only while

      k < c + η + 1        (equivalently: produced samples + B ≤ (η + c + 1)·B)

  so at most ``(η + c + 1)·B`` samples exist that the learner has not consumed yet, and a worker that
  starts batch ``k`` after loading the newest weights ``v ≥ u ≥ k − η`` samples with a policy at most
  ``η`` versions behind the version that will train it when batches are trained in order.
* **Freshness (the invariant the learner enforces)** — a sample generated with version ``v`` may train
  the learner at version ``u`` only if ``u − v ≤ η``; otherwise it is dropped and counted.

``η = 0`` is synchronous on-policy training: batch ``k`` can only start after the learner consumed batch
``k − 1`` and published version ``k``, exactly the colocated schedule.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


@dataclass(frozen=True)
class StalenessController:
    """The two staleness rules; holds no mutable state, so any process may evaluate it."""

    eta: int
    batch_size: int = 1

    def __post_init__(self) -> None:
        if self.eta < 0:
            raise ValueError(f"staleness η must be >= 0, got {self.eta}")
        if self.batch_size < 1:
            raise ValueError(f"batch size must be >= 1, got {self.batch_size}")

    def capacity(self, issued_batches: int, consumed_batches: int) -> int:
        """How many more batches may start now: ``(η + c + 1) − issued`` (never negative)."""
        return max(0, self.eta + consumed_batches + 1 - issued_batches)

    def capacity_samples(self, produced_samples: int, consumed_batches: int) -> int:
        """The same bound in samples: ``(η + c + 1)·B − produced`` (never negative)."""
        return max(0, (self.eta + consumed_batches + 1) * self.batch_size - produced_samples)

    def may_start(self, ticket: int, consumed_batches: int) -> bool:
        """True when batch ``ticket`` (0-based) may start generating: ``k < c + η + 1``."""
        return ticket < consumed_batches + self.eta + 1

    def lag(self, sample_version: int, learner_version: int) -> int:
        """Policy lag ``u − v`` of a sample generated with ``v`` and trained at ``u``."""
        return learner_version - sample_version

    def is_fresh(self, sample_version: int, learner_version: int) -> bool:
        """True when the sample may train the learner: ``0 ≤ u − v ≤ η``."""
        return 0 <= learner_version - sample_version <= self.eta


@dataclass
class LagHistogram:
    """Counts of trained samples per policy lag ``u − v``; ``metrics()`` gives ``staleness/*`` values."""

    counts: Counter[int] = field(default_factory=Counter)

    def add(self, lag: int, n: int = 1) -> None:
        self.counts[int(lag)] += int(n)

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def mean(self) -> float:
        return sum(k * v for k, v in self.counts.items()) / max(1, self.total)

    def metrics(self) -> dict[str, float]:
        """``staleness/mean``, ``staleness/max`` and ``staleness/lag_<k>`` (fraction of samples at lag k)."""
        if not self.total:
            return {}
        out = {"staleness/mean": self.mean(), "staleness/max": float(max(self.counts))}
        for lag in sorted(self.counts):
            out[f"staleness/lag_{lag}"] = self.counts[lag] / self.total
        return out

    def as_dict(self) -> dict[str, int]:
        """JSON-friendly ``{"lag": count}``."""
        return {str(k): v for k, v in sorted(self.counts.items())}
