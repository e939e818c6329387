"""Prometheus text-format metrics without a client library: counters, gauges and histograms with labels.

The exposition format (``# TYPE name counter`` then ``name{label="v"} value`` lines, histograms as
cumulative ``_bucket{le=...}`` plus ``_sum`` and ``_count``) is small enough to write directly, which keeps
``prometheus_client``'s process-global registry out of a server that tests start several times.
"""

from __future__ import annotations

import threading
from collections import defaultdict

LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)

Labels = tuple[tuple[str, str], ...]


def _fmt(labels: Labels, extra: tuple[tuple[str, str], ...] = ()) -> str:
    items = labels + extra
    if not items:
        return ""
    escaped = (v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") for _, v in items)
    return "{" + ",".join(f'{k}="{v}"' for (k, _), v in zip(items, escaped, strict=True)) + "}"


class Metrics:
    """Thread-safe metric store; :meth:`render` returns the Prometheus text exposition."""

    def __init__(self, prefix: str = "tandem") -> None:
        self.prefix = prefix
        self._lock = threading.Lock()
        self._counters: dict[str, dict[Labels, float]] = defaultdict(dict)
        self._gauges: dict[str, dict[Labels, float]] = defaultdict(dict)
        self._hists: dict[str, tuple[tuple[float, ...], dict[Labels, list[float]]]] = {}
        self._help: dict[str, str] = {}
        self._keys: dict[tuple[tuple[str, str], ...], Labels] = {}  # labels as passed -> sorted

    def inc(self, name: str, value: float = 1.0, help: str = "", **labels: str) -> None:
        """Add ``value`` to counter ``name``."""
        key = self._key(labels)
        with self._lock:
            self._help.setdefault(name, help)
            self._counters[name][key] = self._counters[name].get(key, 0.0) + value

    def set(self, name: str, value: float, help: str = "", **labels: str) -> None:
        """Set gauge ``name``."""
        key = self._key(labels)
        with self._lock:
            self._help.setdefault(name, help)
            self._gauges[name][key] = value

    def observe(
        self,
        name: str,
        value: float,
        buckets: tuple[float, ...] = LATENCY_BUCKETS,
        help: str = "",
        **labels: str,
    ) -> None:
        """Record ``value`` in histogram ``name`` (bucket counts, then sum and count)."""
        key = self._key(labels)
        with self._lock:
            self._help.setdefault(name, help)
            bounds, series = self._hists.setdefault(name, (buckets, {}))
            row = series.setdefault(key, [0.0] * (len(bounds) + 2))
            for i, bound in enumerate(bounds):
                if value <= bound:
                    row[i] += 1
            row[-2] += value
            row[-1] += 1

    def _key(self, labels: dict[str, str]) -> Labels:
        """The sorted label tuple of ``labels``, remembered by the labels as passed (a call site passes
        them in one order, so this is one dict lookup instead of a sort per update)."""
        given = tuple(labels.items())
        key = self._keys.get(given)
        if key is None:
            key = self._keys[given] = tuple(sorted(given))
        return key

    def counter_value(self, name: str, **labels: str) -> float:
        """Current value of a counter series (0 if never incremented)."""
        with self._lock:
            return self._counters.get(name, {}).get(tuple(sorted(labels.items())), 0.0)

    def render(self) -> str:
        """The Prometheus text exposition of every metric."""
        lines: list[str] = []
        with self._lock:
            for kind, store in (("counter", self._counters), ("gauge", self._gauges)):
                for name, series in sorted(store.items()):
                    full = f"{self.prefix}_{name}"
                    lines += [f"# HELP {full} {self._help.get(name) or name}", f"# TYPE {full} {kind}"]
                    lines += [f"{full}{_fmt(k)} {v:g}" for k, v in sorted(series.items())]
            for name, (bounds, series) in sorted(self._hists.items()):
                full = f"{self.prefix}_{name}"
                lines += [f"# HELP {full} {self._help.get(name) or name}", f"# TYPE {full} histogram"]
                for key, row in sorted(series.items()):
                    for bound, count in zip(bounds, row, strict=False):
                        lines.append(f"{full}_bucket{_fmt(key, (('le', f'{bound:g}'),))} {count:g}")
                    lines.append(f"{full}_bucket{_fmt(key, (('le', '+Inf'),))} {row[-1]:g}")
                    lines.append(f"{full}_sum{_fmt(key)} {row[-2]:g}")
                    lines.append(f"{full}_count{_fmt(key)} {row[-1]:g}")
        return "\n".join(lines) + "\n"
