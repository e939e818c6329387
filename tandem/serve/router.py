"""A/B routing: named arms (each a served model with its own batcher and cache) and a traffic split.

A request goes to the arm picked by hashing its user id (the ``user`` field or the ``X-Tandem-User``
header) onto the cumulative split, so a user keeps seeing the same arm while the split is unchanged;
anonymous requests are spread by a random draw. Changes (and their rollback history) are made to the
shared admin state; the router only shows its current table.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass
from pathlib import Path

from tandem.serve.admin_state import Table
from tandem.serve.batcher import DynamicBatcher
from tandem.serve.cache import LRUCache
from tandem.serve.decode import RowResult
from tandem.serve.engines import EngineRows, load_served, replica_factory
from tandem.serve.model import ServedModel
from tandem.serve.replicas import ReplicaPool


@dataclass
class Arm:
    """One served model version with its batcher (and the batcher's engine replicas) and response cache.
    ``through_engine``: the engine name when rows go through ``engine.generate`` (some OpenAI fields are
    then refused, :func:`tandem.serve.engines.check_request`); None when they run in process."""

    name: str
    model: ServedModel
    batcher: DynamicBatcher
    cache: LRUCache[RowResult]
    through_engine: str | None = None


def build_arm(state, name: str, path: str | Path) -> Arm:
    """Load ``path`` and wrap it in arm ``name`` with its own batcher, ``--min-replicas`` engine replicas
    built through the registry (``--engine``), and a cache (batcher not started); ``state`` is the
    server's (its settings, metrics and served name)."""
    s = state.settings
    model = load_served(str(path), state.name, s.engine)
    pool = ReplicaPool(
        replica_factory(model, s.engine, s.engine_options),
        s.scale_policy(),
        arm=name,
        metrics=state.metrics,
        clock=state.clock,
    )
    batcher = DynamicBatcher(
        max_batch_size=s.max_batch_size,
        max_wait_ms=s.max_wait_ms,
        max_queue=s.max_queue,
        metrics=state.metrics,
        arm=name,
        pool=pool,
    )
    generic = isinstance(pool.replicas[0].runner, EngineRows)
    if generic:  # an engine holding less than the model's context (vLLM's max_model_len): requests past it
        # are the 400 context_length_exceeded, not a generation failure inside the engine
        held = getattr(pool.replicas[0].runner.engine, "max_model_len", None)
        if isinstance(held, int) and 0 < held < model.context_length:
            model.context_length = held
    return Arm(name, model, batcher, LRUCache(s.cache_size), s.engine if generic else None)


def _unit(user: str) -> float:
    """A stable number in [0, 1) for ``user`` (sha256, so it is the same in every process)."""
    return int.from_bytes(hashlib.sha256(user.encode()).digest()[:8], "big") / 2**64


class Router:
    """The arms this replica serves and their traffic split: a view of the admin state's current table
    (:mod:`tandem.serve.admin_state`) over the arms loaded in this process."""

    def __init__(self) -> None:
        self.arms: dict[str, Arm] = {}
        self.split: dict[str, float] = {}

    def show(self, table: Table, loaded: dict[str, Arm]) -> None:
        """Serve ``table``; every load id it names must be in ``loaded`` (load id -> arm)."""
        self.arms = {name: loaded[load] for name, load in table.arms.items()}
        self.split = dict(table.split)

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
