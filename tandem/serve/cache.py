"""A bounded LRU cache for deterministic (temperature-0) responses.

Keys are built by :func:`cache_key` from the model version, the prompt token ids and every parameter that
changes greedy output (token limit, stop strings), so a new checkpoint never serves an old answer.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable
from typing import Generic, TypeVar

V = TypeVar("V")


def cache_key(model_version: str, prompt_ids: list[int], max_tokens: int, stop: list[str]) -> Hashable:
    """Key of a greedy request: same key ⇔ the same greedy output from the same weights."""
    return (model_version, tuple(prompt_ids), int(max_tokens), tuple(stop))


class LRUCache(Generic[V]):
    """At most ``capacity`` entries; the least recently used one is evicted first. ``capacity == 0``
    disables caching. Thread-safe."""

    def __init__(self, capacity: int) -> None:
        if capacity < 0:
            raise ValueError(f"cache capacity must be >= 0, got {capacity}")
        self.capacity = capacity
        self._data: OrderedDict[Hashable, V] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Hashable) -> V | None:
        """The cached value (marked most recently used), or None."""
        with self._lock:
            if key not in self._data:
                return None
            self._data.move_to_end(key)
            return self._data[key]

    def put(self, key: Hashable, value: V) -> None:
        """Insert or refresh ``key``; evicts the oldest entry beyond capacity."""
        if self.capacity == 0:
            return
        with self._lock:
            self._data[key] = value
            self._data.move_to_end(key)
            while len(self._data) > self.capacity:
                self._data.popitem(last=False)

    def __len__(self) -> int:
        return len(self._data)
