"""Channels of the decoupled architecture: trajectories (workers -> learner) and weights (learner -> workers).

Trajectory backends are registered by name in ``BACKENDS`` (``name -> "module:Class"``) and imported
lazily, so ``redis`` (or ``ray``) is needed only when chosen. A backend class declares its own options model
(``Options``, validated from ``architecture.channel.options``), the ``architecture.runtime`` values it
serves (``runtimes``) and ``from_config``; nothing else names it. Adding a backend (e.g. Kafka) = one new
module + one line in ``BACKENDS``.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ValidationError

from tandem.channels.base import (
    ChannelBackend,
    ChannelOptions,
    ChannelSetting,
    Delivery,
    TrajectoryChannel,
    TrajectoryMessage,
)
from tandem.errors import ConfigError

BACKENDS: dict[str, str] = {
    "queue": "tandem.channels.queue:QueueChannel",
    "redis": "tandem.channels.redis:RedisStreamChannel",
    "ray": "tandem.channels.ray:RayQueueChannel",
}

_KEY = "architecture.channel"


def channel_class(backend: str) -> ChannelBackend:
    """The class registered as ``backend``, imported now; an unknown name is a one-line ConfigError at
    ``architecture.channel.backend`` listing the valid ones."""
    if backend not in BACKENDS:
        raise ConfigError(
            f"unknown channel backend '{backend}'; valid: {', '.join(sorted(BACKENDS))}",
            where=f"{_KEY}.backend",
        )
    module, _, cls = BACKENDS[backend].partition(":")
    return getattr(importlib.import_module(module), cls)


def channel_options(backend: str, options: Mapping[str, Any] | None = None) -> ChannelOptions:
    """``options`` validated by the backend's own ``Options`` model; the first problem is a one-line
    ConfigError at ``architecture.channel.options.<key>`` (an unknown key lists the valid ones)."""
    model = channel_class(backend).Options
    try:
        return model.model_validate(dict(options or {}))
    except ValidationError as err:
        first = err.errors()[0]
        key = ".".join(str(p) for p in first["loc"])
        where = f"{_KEY}.options.{key}" if key else f"{_KEY}.options"
        if first["type"] == "extra_forbidden":
            valid = ", ".join(model.model_fields) or "none"
            raise ConfigError(
                f"unknown option of channel '{backend}'; its options: {valid}", where=where
            ) from None
        raise ConfigError(first["msg"], where=where) from None


def check_channel(backend: str, options: Mapping[str, Any] | None, runtime: str) -> ChannelOptions:
    """Pre-flight of ``architecture.channel`` for ``architecture.runtime``: the backend exists, its options
    are valid and it serves that runtime (from its ``runtimes``). Returns the validated options."""
    parsed = channel_options(backend, options)
    runtimes = channel_class(backend).runtimes
    if runtime not in runtimes:
        usable = [name for name in BACKENDS if runtime in channel_class(name).runtimes]
        raise ConfigError(
            f"channel '{backend}' cannot serve architecture.runtime={runtime} (it serves: "
            f"{', '.join(runtimes)}); use {' or '.join(usable)}",
            where=f"{_KEY}.backend",
        )
    return parsed


def open_channel(
    backend: str, options: Mapping[str, Any] | None = None, setting: ChannelSetting | None = None
) -> TrajectoryChannel:
    """The trajectory channel ``backend`` built by its ``from_config`` from validated ``options`` (whether it
    serves the run's runtime is :func:`check_channel`'s pre-flight question)."""
    parsed = channel_options(backend, options)
    return channel_class(backend).from_config(parsed, setting or ChannelSetting())


def option_models() -> list[tuple[str, type[BaseModel] | None]]:
    """Each registered backend's options model, for the config reference (``tandem config docs``)."""
    models = [(name, channel_class(name).Options) for name in BACKENDS]
    return [(name, model if model.model_fields else None) for name, model in models]


__all__ = [
    "BACKENDS",
    "ChannelBackend",
    "ChannelOptions",
    "ChannelSetting",
    "Delivery",
    "TrajectoryChannel",
    "TrajectoryMessage",
    "channel_class",
    "channel_options",
    "check_channel",
    "open_channel",
    "option_models",
]
