"""Exact sample accounting of a decoupled run: which tickets were consumed, and how.

Every batch (ticket) that reaches the learner ends in exactly one bucket — trained, dropped (too stale:
``u − v > η``) or duplicate (a ticket already consumed, e.g. re-published by the replacement of a worker
that died just after publishing, or re-delivered by a durable channel after it was checkpointed) — so
``received == trained + dropped + duplicates`` holds in samples and in batches. The ledger is part of the
learner checkpoint, so the accounting (and duplicate detection) survives a learner restart.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tandem.orchestration.staleness import LagHistogram


@dataclass
class TicketLedger:
    consumed: set[int] = field(default_factory=set)  # tickets trained or dropped (never trained again)
    received_samples: int = 0
    trained_samples: int = 0
    dropped_samples: int = 0
    duplicate_samples: int = 0
    redelivered_samples: int = 0
    trained_batches: int = 0
    dropped_batches: int = 0
    lags: LagHistogram = field(default_factory=LagHistogram)

    def seen(self, ticket: int) -> bool:
        return ticket in self.consumed

    def record_duplicate(self, n: int) -> None:
        self.received_samples += n
        self.duplicate_samples += n

    def record_trained(self, ticket: int, n: int, lag: int) -> None:
        self.consumed.add(ticket)
        self.received_samples += n
        self.trained_samples += n
        self.trained_batches += 1
        self.lags.add(lag, n)

    def record_dropped(self, ticket: int, n: int) -> None:
        self.consumed.add(ticket)
        self.received_samples += n
        self.dropped_samples += n
        self.dropped_batches += 1

    def metrics(self) -> dict[str, float]:
        out = {
            "decoupled/received_samples": float(self.received_samples),
            "decoupled/trained_samples": float(self.trained_samples),
            "decoupled/dropped_samples": float(self.dropped_samples),
            "decoupled/duplicate_samples": float(self.duplicate_samples),
            "decoupled/redelivered_samples": float(self.redelivered_samples),
        }
        out.update(self.lags.metrics())
        return out

    def state_dict(self) -> dict[str, Any]:
        return {
            "consumed": sorted(self.consumed),
            "counts": {
                k: getattr(self, k)
                for k in (
                    "received_samples",
                    "trained_samples",
                    "dropped_samples",
                    "duplicate_samples",
                    "redelivered_samples",
                    "trained_batches",
                    "dropped_batches",
                )
            },
            "lags": self.lags.as_dict(),
        }

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> TicketLedger:
        ledger = cls(consumed={int(t) for t in state["consumed"]}, **state["counts"])
        for lag, n in state["lags"].items():
            ledger.lags.add(int(lag), int(n))
        return ledger
