"""``tandem loadtest``: a bounded closed-loop load generator for an OpenAI-compatible endpoint.

``concurrency`` clients each send a request, wait for the answer and send the next, until
``max_requests`` are sent or ``duration_s`` has passed, whichever is first. Targets are restricted to
loopback unless the caller names the host explicitly (``allow_host``), so a typo cannot load-test
someone else's server. httpx is used (part of the ``serve`` extra).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from urllib.parse import urlparse

from tandem.errors import ConfigError, MissingDependencyError
from tandem.utils.net import is_loopback_host


@dataclass
class LoadResult:
    """Outcome of one load test."""

    url: str
    concurrency: int
    requests: int
    ok: int
    duration_s: float
    qps: float
    p50_ms: float
    p95_ms: float
    p99_ms: float
    errors_by_status: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict:
        return asdict(self)


def check_target(url: str, allow_host: str | None) -> None:
    """ConfigError unless ``url`` is http(s) on loopback or on exactly ``allow_host``."""
    parsed = urlparse(url)
    host = parsed.hostname or ""
    if parsed.scheme not in ("http", "https") or not host:
        raise ConfigError(f"'{url}' is not an http(s) URL", where="URL")
    if allow_host is not None and host == allow_host:
        return
    if not is_loopback_host(host):
        raise ConfigError(
            f"refusing to load-test non-loopback host {host}",
            where="URL",
            hint=f"pass --allow-host {host} if it is yours",
        )


def _percentile(sorted_ms: list[float], q: float) -> float:
    if not sorted_ms:
        return float("nan")
    return sorted_ms[min(len(sorted_ms) - 1, int(q * len(sorted_ms)))]


async def run_load(
    url: str,
    *,
    concurrency: int,
    max_requests: int,
    duration_s: float,
    body: dict,
    path: str = "/v1/completions",
    api_key: str | None = None,
    on_done: Callable[[int], None] | None = None,
) -> LoadResult:
    """Drive ``url + path`` with ``concurrency`` closed-loop clients; see the module docstring."""
    try:
        import httpx
    except ImportError as err:
        raise MissingDependencyError("httpx", "serve") from err
    if concurrency < 1 or max_requests < 1 or duration_s <= 0:
        raise ConfigError("concurrency and requests must be >= 1 and duration > 0", where="loadtest")
    latencies: list[float] = []
    errors: dict[str, int] = {}
    sent = 0
    stop_at = time.perf_counter() + duration_s
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}

    async def client(http) -> None:
        nonlocal sent
        while sent < max_requests and time.perf_counter() < stop_at:
            sent += 1
            started = time.perf_counter()
            try:
                r = await http.post(path, json=body)
                status = None if r.status_code == 200 else str(r.status_code)
            except httpx.HTTPError as err:
                status = type(err).__name__
            if status is None:
                latencies.append((time.perf_counter() - started) * 1000)
            else:
                errors[status] = errors.get(status, 0) + 1
            if on_done is not None:
                on_done(1)

    limits = httpx.Limits(max_connections=concurrency)
    async with httpx.AsyncClient(
        base_url=url.rstrip("/"), headers=headers, timeout=120, limits=limits, verify=False
    ) as http:
        started = time.perf_counter()
        await asyncio.gather(*(client(http) for _ in range(concurrency)))
        elapsed = time.perf_counter() - started
    ms = sorted(latencies)
    return LoadResult(
        url,
        concurrency,
        sent,
        len(ms),
        elapsed,
        len(ms) / elapsed,
        _percentile(ms, 0.5),
        _percentile(ms, 0.95),
        _percentile(ms, 0.99),
        errors,
    )
