"""Connection limits for uvicorn: a deadline for each request head, and the options that bound idle and
concurrent connections.

uvicorn closes an idle keep-alive connection after ``timeout_keep_alive`` but has no deadline for a
request head that arrives slowly: a client that sends one header byte every few seconds (slowloris) holds
its connection forever. :class:`HeadTimeoutProtocol` adds that deadline: the head of every request (the
first on a new connection, and each next one on a keep-alive connection) must be complete within
``read_timeout_s`` or the connection is closed. The body has its own deadline in
:class:`tandem.serve.middleware.BodyLimit`; ``limit_concurrency`` caps connections plus running requests
(beyond it uvicorn answers 503).
"""

from __future__ import annotations

import json
import os
from functools import lru_cache

from uvicorn.protocols.http.auto import AutoHTTPProtocol

SPEC_ENV = "TANDEM_SERVE_SPEC"  # the replicas' spec (arms, settings, ...) that run_replicas hands them
DEFAULT_READ_TIMEOUT_S = 30.0  # ServeSettings.read_timeout_s


class HeadTimeoutProtocol(AutoHTTPProtocol):  # type: ignore[misc,valid-type]
    """uvicorn's HTTP protocol with a deadline for every request head (see the module docstring).

    The wait for a head starts when the connection opens and again whenever a response completes. One
    timer per connection checks it: when the timer fires and the connection is still waiting, it closes
    the connection if the wait is ``timeout_s`` old, else it fires again when it will be; when a request
    is running, the timer is dropped and the next completed response arms a new one. A keep-alive
    connection thus re-arms about once per ``timeout_s``, not once per request."""

    timeout_s: float | None = None  # None: the replicas' spec (TANDEM_SERVE_SPEC), else the default

    def connection_made(self, transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._head_timer = None
        self._waiting_since = self.loop.time()
        self._arm_head_deadline(self._head_timeout())

    def connection_lost(self, exc) -> None:  # type: ignore[override]
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
        super().connection_lost(exc)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._waiting_since = self.loop.time()
        if self._head_timer is None:
            self._arm_head_deadline(self._head_timeout())

    def _head_timeout(self) -> float:
        return self.timeout_s if self.timeout_s is not None else _spec_timeout(os.environ.get(SPEC_ENV))

    def _arm_head_deadline(self, delay: float) -> None:
        self._head_timer = self.loop.call_later(delay, self._head_deadline)

    def _head_deadline(self) -> None:
        self._head_timer = None
        if self.transport.is_closing():
            return
        if self.cycle is not None and not self.cycle.response_complete:
            return  # a request is running: its response arms the next deadline
        left = self._waiting_since + self._head_timeout() - self.loop.time()
        if left > 0:
            self._arm_head_deadline(left)
        else:
            self.transport.close()  # connection_lost then tidies the protocol state


@lru_cache(maxsize=4)
def _spec_timeout(spec: str | None) -> float:
    """``read_timeout_s`` of a replica's settings (uvicorn workers rebuild everything from the spec)."""
    if not spec:
        return DEFAULT_READ_TIMEOUT_S
    return float(json.loads(spec).get("settings", {}).get("read_timeout_s", DEFAULT_READ_TIMEOUT_S))


def protocol_for(timeout_s: float) -> type:
    """A :class:`HeadTimeoutProtocol` with deadline ``timeout_s`` (for a single-process server)."""
    return type("HeadTimeout", (HeadTimeoutProtocol,), {"timeout_s": float(timeout_s)})


def uvicorn_limits(settings, *, replicas: bool = False) -> dict:
    """The uvicorn options that bound connections: head deadline, idle keep-alive, concurrency.
    Replicas get the protocol as an import string (uvicorn's workers import it in their own process)."""
    http = (
        "tandem.serve.connections:HeadTimeoutProtocol" if replicas else protocol_for(settings.read_timeout_s)
    )
    return {
        "http": http,
        "timeout_keep_alive": settings.keep_alive_s,
        "limit_concurrency": settings.max_connections,
    }
