"""Channels of the decoupled architecture: trajectories (workers -> learner) and weights (learner -> workers).

Trajectory backends are registered by name in ``BACKENDS`` and imported lazily, so ``redis`` (or ``ray``)
is needed only when chosen. Adding a backend (e.g. Kafka) = one new module + one line here.
"""

from __future__ import annotations

import importlib
from typing import Any

from tandem.channels.base import Delivery, TrajectoryChannel, TrajectoryMessage
from tandem.errors import ConfigError

BACKENDS: dict[str, str] = {
    "queue": "tandem.channels.queue:QueueChannel",
    "redis": "tandem.channels.redis:RedisStreamChannel",
    "ray": "tandem.channels.ray:RayQueueChannel",
}


def open_channel(backend: str, **options: Any) -> TrajectoryChannel:
    """Construct the trajectory channel ``backend`` with backend-specific ``options``."""
    if backend not in BACKENDS:
        raise ConfigError(
            f"unknown channel backend '{backend}'; valid: {', '.join(sorted(BACKENDS))}",
            where="architecture.channel.backend",
        )
    module, _, cls = BACKENDS[backend].partition(":")
    return getattr(importlib.import_module(module), cls)(**options)


__all__ = ["BACKENDS", "Delivery", "TrajectoryChannel", "TrajectoryMessage", "open_channel"]
