"""One server's settings and shared state: :class:`ServeSettings` (the ``tandem serve`` flags, checked
when built), :class:`ServerState` (what routes, admin handlers and the batchers share) and the key check
both the settings and the CLI use.

Kept apart from :mod:`tandem.serve.app` (request checks, error handlers) so every module that only needs
the state's type can import it without the web framework.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tandem.agents.tool_calls import get_format
from tandem.errors import ConfigError
from tandem.rollout.registry import DEFAULT_ENGINE
from tandem.serve.metrics import Metrics
from tandem.serve.replicas import ScalePolicy
from tandem.serve.router import Router


@dataclass
class ServeSettings:
    """Limits and keys of one server (``tandem serve`` flags)."""

    max_batch_size: int = 32
    max_wait_ms: float = 10.0
    max_queue: int = 256
    cache_size: int = 1024
    max_tokens_limit: int = 512
    max_n: int = 8
    max_prompts: int = 32
    max_body_bytes: int = 1 << 20
    api_keys: list[str] = field(default_factory=list)
    admin_key: str | None = None
    feedback_db: str | None = None
    read_timeout_s: float = 30.0  # a request's head, and then its body, must arrive within this
    keep_alive_s: int = 5  # an idle keep-alive connection is closed after this
    max_connections: int = 1024  # open connections (or running requests) beyond which requests get 503
    state_dir: str | None = None  # replicas: folder of the shared admin state (set by run_replicas)
    engine: str = DEFAULT_ENGINE  # rollout engine every arm replica is built with (registry name)
    engine_options: dict[str, Any] = field(default_factory=dict)  # EngineSpec.options of those engines
    min_replicas: int = 1  # engine replicas per arm, kept at least
    max_replicas: int = 1  # engine replicas per arm, at most (more than min: autoscaling)
    scale_up_queue: int | None = None  # rows waiting per replica that add one (None: max_batch_size)
    scale_down_idle_s: float = 60.0  # a replica idle this long is released (down to min_replicas)
    tool_format: str = "hermes"  # how tool calls are written when the chat template does not render tools

    def __post_init__(self) -> None:
        """ConfigError naming the flag of the first out-of-range limit: checked here, when the flags are
        read, so a bad value is refused before any model loads (the batcher, cache and replica pool
        built later would otherwise fail mid-start with a ValueError naming their own parameter)."""
        for flag, value, least in (
            ("--max-batch-size", self.max_batch_size, 1),
            ("--max-queue", self.max_queue, 1),
            ("--cache-size", self.cache_size, 0),
            ("--max-tokens-limit", self.max_tokens_limit, 1),
            ("--max-body-bytes", self.max_body_bytes, 1),
        ):
            if value < least:
                raise ConfigError(f"must be >= {least}, got {value}", where=flag)
        if not 0 <= self.max_wait_ms < math.inf:  # also refuses NaN
            raise ConfigError(f"must be a finite number >= 0, got {self.max_wait_ms}", where="--max-wait-ms")
        if self.feedback_db is not None and Path(self.feedback_db).is_dir():
            raise ConfigError(
                f"{self.feedback_db} is a directory, not a database file", where="--feedback-db"
            )
        get_format(self.tool_format, key="--tool-format")
        for key in self.api_keys:
            check_key(key, "--api-key")
        if self.admin_key is not None:
            check_key(self.admin_key, "--admin-key")
        if not self.read_timeout_s > 0:
            raise ConfigError(f"must be > 0, got {self.read_timeout_s}", where="--read-timeout")
        if self.max_connections < 1:
            raise ConfigError(f"must be >= 1, got {self.max_connections}", where="--max-connections")
        if self.min_replicas < 1:
            raise ConfigError(f"must be >= 1, got {self.min_replicas}", where="--min-replicas")
        if self.max_replicas < self.min_replicas:
            raise ConfigError(
                f"must be >= --min-replicas ({self.min_replicas}), got {self.max_replicas}",
                where="--max-replicas",
            )
        if self.scale_up_queue is not None and self.scale_up_queue < 1:
            raise ConfigError(f"must be >= 1, got {self.scale_up_queue}", where="--scale-up-queue")
        if not self.scale_down_idle_s > 0:
            raise ConfigError(f"must be > 0, got {self.scale_down_idle_s}", where="--scale-down-idle-s")

    def scale_policy(self) -> ScalePolicy:
        """The replica bounds and thresholds of every arm."""
        return ScalePolicy(
            min_replicas=self.min_replicas,
            max_replicas=self.max_replicas,
            scale_up_queue=self.scale_up_queue or self.max_batch_size,
            scale_down_idle_s=self.scale_down_idle_s,
        )


def check_key(key: str, where: str) -> None:
    """ConfigError for a key that can never be presented safely: empty, or containing whitespace
    (HTTP strips header values, so a key of spaces would be matched by an empty header)."""
    if not key or any(c.isspace() for c in key):
        raise ConfigError(
            "an API key must be non-empty and contain no whitespace",
            where=where,
            hint="e.g. python -c 'import secrets; print(secrets.token_urlsafe(32))'",
        )


class ServerState:
    """Everything the routes share: settings, router (arms), metrics, readiness, feedback store, and the
    admin state this replica serves: ``store`` (:mod:`tandem.serve.admin_state`), ``applied`` (the
    version the router shows) and ``loaded`` (load id -> arm loaded in this process)."""

    def __init__(self, settings: ServeSettings, name: str) -> None:
        self.settings = settings
        self.name = name
        self.router = Router()
        self.metrics = Metrics()
        self.ready = False
        self.batchers: list = []  # every batcher ever started (replaced arms stay alive for rollback)
        self.feedback = None
        self.started = time.time()
        self.store = None  # MemoryStore or FileStore
        self.applied = -1
        self.loaded: dict = {}
        self.loading: set[str] = set()  # load ids being loaded in the background
        self.failed: dict[str, str] = {}  # load id -> why this replica could not load it
        self.clock = time.monotonic  # what engine-replica scaling measures idle time with (tests: a fake)
