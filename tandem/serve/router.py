"""A/B routing: named arms (each a served model with its own batcher and cache) and a traffic split.

A request goes to the arm picked by hashing its user id (the ``user`` field or the ``X-Tandem-User``
header) onto the cumulative split, so a user keeps seeing the same arm while the split is unchanged;
anonymous requests are spread by a random draw. Every change of arms or split is pushed on a history
stack so :meth:`Router.rollback` restores the previous state.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass

from tandem.serve.batcher import DynamicBatcher
from tandem.serve.cache import LRUCache
from tandem.serve.decode import RowResult
from tandem.serve.model import ServedModel


@dataclass
class Arm:
    """One served model version with its batcher and response cache."""

    name: str
    model: ServedModel
    batcher: DynamicBatcher
    cache: LRUCache[RowResult]


def _unit(user: str) -> float:
    """A stable number in [0, 1) for ``user`` (sha256, so it is the same in every process)."""
    return int.from_bytes(hashlib.sha256(user.encode()).digest()[:8], "big") / 2**64


class Router:
    """Arms, their traffic split, and the history needed to roll back."""

    def __init__(self) -> None:
        self.arms: dict[str, Arm] = {}
        self.split: dict[str, float] = {}
        self._history: list[tuple[dict[str, Arm], dict[str, float]]] = []

    def _push(self) -> None:
        self._history.append((dict(self.arms), dict(self.split)))

    def add(self, arm: Arm, weight: float | None = None) -> Arm | None:
        """Add or replace an arm; returns the arm it replaced (its batcher must be stopped by the caller).
        The first arm gets all traffic; later arms get ``weight`` (default 0) until the split changes."""
        self._push()
        old = self.arms.get(arm.name)
        self.arms[arm.name] = arm
        if not self.split:
            self.split = {arm.name: 1.0}
        else:
            self.split.setdefault(arm.name, 0.0)
            if weight is not None:
                self.set_split({**self.split, arm.name: weight}, record=False)
        return old

    def set_split(self, weights: dict[str, float], *, record: bool = True) -> None:
        """Set the traffic split (normalised); every arm named must exist, weights must be >= 0."""
        unknown = sorted(set(weights) - set(self.arms))
        if unknown:
            raise KeyError(f"unknown arm(s) {unknown}; arms: {sorted(self.arms)}")
        if any(w < 0 for w in weights.values()) or sum(weights.values()) <= 0:
            raise ValueError("weights must be >= 0 and sum to more than 0")
        if record:
            self._push()
        total = sum(weights.values())
        self.split = {name: weights.get(name, 0.0) / total for name in self.arms}

    def promote(self, name: str) -> None:
        """Send all traffic to arm ``name``."""
        self.set_split({name: 1.0})

    def rollback(self) -> None:
        """Restore the arms and split before the last change; raises IndexError if there is none."""
        if not self._history:
            raise IndexError("nothing to roll back")
        self.arms, self.split = self._history.pop()

    def pick(self, user: str | None, forced: str | None = None) -> Arm:
        """The arm for a request: ``forced`` if given, else by the user's sticky hash (or at random)."""
        if forced is not None:
            return self.arms[forced]
        u = _unit(user) if user else random.random()
        cumulative = 0.0
        live = [(n, w) for n, w in self.split.items() if w > 0]
        for name, weight in live:
            cumulative += weight
            if u < cumulative:
                return self.arms[name]
        return self.arms[live[-1][0]]
