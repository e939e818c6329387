"""Discrete-event simulator of one run's steady state, colocated or decoupled.

Colocated: every step runs its phases one after the other on the same devices. Decoupled: it replays the
runtime's protocol (``docs/architectures.md``) ticket by ticket — a worker may start ticket ``k`` only while
``k < consumed + η + 1``; it loads the newest published weights if it does not hold them, generates,
scores and puts the batch on the channel (blocking while ``channel_capacity`` messages wait); the learner
takes the oldest waiting ticket, drops it if its lag exceeds η, trains, publishes version ``v + 1`` and
then announces the consumption (so η = 0 is synchronous), then spends ``overhead`` (logging) before it
waits again. With in-flight weight sync a worker mid-generation pays one more ``weight_load`` for every
version published during its generation. Phase durations are log-normal around the given means with the
given coefficients of variation (seeded), so the tail of ``max(G, T)`` shows.
"""

from __future__ import annotations

import heapq
import math
import random
from collections import Counter
from dataclasses import dataclass, field
from typing import Literal

from tandem.plan.cost import PhaseTimes


@dataclass(frozen=True)
class Layout:
    """How the phases are placed: colocated, or decoupled with ``workers`` rollout workers (each with its
    own devices), staleness bound ``staleness`` (η), a bounded channel and in-flight weight updates."""

    mode: Literal["colocated", "decoupled"] = "colocated"
    workers: int = 1
    staleness: int = 0
    channel_capacity: int | None = None  # messages waiting on the channel; None = unbounded
    in_flight: bool = False

    def describe(self) -> str:
        if self.mode == "colocated":
            return "colocated"
        extra = ", in-flight" if self.in_flight else ""
        return f"decoupled η={self.staleness} workers={self.workers}{extra}"


@dataclass(frozen=True)
class SimResult:
    """Steady-state predictions (the warm-up steps left out)."""

    step_s: float  # mean wall time per trained step
    samples_per_s: float
    learner_util: float  # share of wall time the learner side computes (learn + publish + overhead)
    rollout_util: float  # share of wall time an average rollout worker computes
    learner_idle: float  # share of wall time the learner waits for data
    lag: dict[int, float]  # share of trained batches at each policy lag
    dropped: int  # batches dropped as too stale (0 under the admission rule)
    steps: int

    @property
    def mean_lag(self) -> float:
        return sum(k * v for k, v in self.lag.items())


def _draw(rng: random.Random, mean: float, cv: float) -> float:
    """A log-normal duration with this mean and coefficient of variation (exactly ``mean`` when cv = 0)."""
    if mean <= 0 or cv <= 0:
        return max(0.0, mean)
    sigma = math.sqrt(math.log1p(cv * cv))
    return mean * math.exp(rng.gauss(-sigma * sigma / 2, sigma))


def simulate(
    phases: PhaseTimes,
    layout: Layout,
    *,
    samples_per_step: int,
    steps: int = 200,
    warmup: int = 10,
    seed: int = 0,
) -> SimResult:
    """Simulate ``warmup + steps`` trained steps and summarise the last ``steps``."""
    if steps < 2:
        raise ValueError("simulate needs at least 2 measured steps")
    rng = random.Random(seed)
    if layout.mode == "colocated":
        return _colocated(phases, samples_per_step, steps, warmup, rng)
    return _Decoupled(phases, layout, rng).run(samples_per_step, steps, warmup)


def _colocated(p: PhaseTimes, samples: int, steps: int, warmup: int, rng: random.Random) -> SimResult:
    total = roll = learn = 0.0
    for i in range(warmup + steps):
        r = _draw(rng, p.generate + p.reward, p.rollout_cv)
        t = _draw(rng, p.learn_s, p.learn_cv)
        if i >= warmup:
            roll += r
            learn += t + p.weight_sync + p.overhead
            total += r + t + p.weight_sync + p.overhead
    return SimResult(
        step_s=total / steps,
        samples_per_s=samples * steps / total,
        learner_util=learn / total,
        rollout_util=roll / total,
        learner_idle=0.0,
        lag={0: 1.0},
        dropped=0,
        steps=steps,
    )


@dataclass
class _Worker:
    loaded: int = -1  # weight version it holds
    busy_until: float = 0.0
    token: int = 0  # invalidates a rescheduled completion event
    message: tuple[int, int] | None = None  # (ticket, version) generated, not yet on the channel
    started: float = 0.0
    intervals: list[tuple[float, float]] = field(default_factory=list)


class _Decoupled:
    def __init__(self, phases: PhaseTimes, layout: Layout, rng: random.Random) -> None:
        self.p, self.layout, self.rng = phases, layout, rng
        self.workers = [_Worker() for _ in range(layout.workers)]
        self.events: list[tuple[float, int, str, int, int]] = []  # (time, seq, kind, who, token)
        self.seq = 0
        self.now = 0.0
        self.version = 0
        self.issued = self.consumed = 0
        self.channel: list[tuple[int, int]] = []  # (ticket, version), kept sorted by ticket
        self.idle_workers: list[int] = list(range(layout.workers))
        self.blocked: list[int] = []  # workers holding a batch the full channel cannot take
        self.learner_waiting = True
        self.learner_intervals: list[tuple[float, float]] = []
        self.wait_intervals: list[tuple[float, float]] = []
        self.wait_since = 0.0
        self.done_times: list[float] = []
        self.lags: list[int] = []
        self.dropped = 0

    def _push(self, at: float, kind: str, who: int = 0, token: int = 0) -> None:
        self.seq += 1
        heapq.heappush(self.events, (at, self.seq, kind, who, token))

    # -- rollout side ----------------------------------------------------------------------------------
    def _admit(self) -> None:
        while self.idle_workers and self.issued < self.consumed + self.layout.staleness + 1:
            wid = self.idle_workers.pop(0)
            w = self.workers[wid]
            ticket = self.issued
            self.issued += 1
            load = self.p.weight_load if w.loaded != self.version else 0.0
            w.loaded = self.version
            work = _draw(self.rng, self.p.generate + self.p.reward, self.p.rollout_cv)
            w.message = (ticket, self.version)
            w.started = self.now
            w.busy_until = self.now + load + work + self.p.transfer
            w.token += 1
            self._push(w.busy_until, "worker", wid, w.token)

    def _worker_done(self, wid: int) -> None:
        w = self.workers[wid]
        w.intervals.append((w.started, self.now))
        cap = self.layout.channel_capacity
        if cap is not None and len(self.channel) >= cap:
            self.blocked.append(wid)
            return
        self._put(wid)

    def _put(self, wid: int) -> None:
        w = self.workers[wid]
        assert w.message is not None
        self.channel.append(w.message)
        self.channel.sort()
        w.message = None
        self.idle_workers.append(wid)
        if self.learner_waiting:
            self._push(self.now, "learner_ready")

    # -- learner side ----------------------------------------------------------------------------------
    def _learner_ready(self) -> None:
        if not self.learner_waiting:
            return
        while self.channel:
            ticket, version = self.channel.pop(0)
            while self.blocked and (
                self.layout.channel_capacity is None or len(self.channel) < self.layout.channel_capacity
            ):
                self._put(self.blocked.pop(0))
            lag = self.version - version
            if lag > self.layout.staleness:
                self.dropped += 1
                self.consumed += 1
                continue
            self.learner_waiting = False
            self.wait_intervals.append((self.wait_since, self.now))
            self.lags.append(lag)
            learn = _draw(self.rng, self.p.learn_s, self.p.learn_cv)
            self.learner_intervals.append((self.now, self.now + learn + self.p.weight_sync))
            self._push(self.now + learn + self.p.weight_sync, "learner_done")
            return

    def _learner_done(self) -> None:
        self.version += 1  # publish, then announce the consumption
        self.consumed += 1
        self.done_times.append(self.now)
        if self.layout.in_flight:
            for wid, w in enumerate(self.workers):
                if w.message is not None and w.busy_until > self.now and wid not in self.blocked:
                    w.loaded = self.version
                    w.busy_until += self.p.weight_load
                    w.token += 1
                    self._push(w.busy_until, "worker", wid, w.token)
        self._admit()
        if self.p.overhead > 0:
            self.learner_intervals.append((self.now, self.now + self.p.overhead))
        self._push(self.now + self.p.overhead, "learner_wait")

    def run(self, samples: int, steps: int, warmup: int) -> SimResult:
        self._admit()
        total = warmup + steps
        while len(self.done_times) < total + 1:
            if not self.events:
                raise RuntimeError("simulation deadlocked")  # a bug: the admission rule always admits one
            self.now, _, kind, who, token = heapq.heappop(self.events)
            if kind == "worker":
                if token == self.workers[who].token:
                    self._worker_done(who)
                    self._admit()
            elif kind == "learner_done":
                self._learner_done()
            elif kind == "learner_wait":
                self.learner_waiting, self.wait_since = True, self.now
                self._learner_ready()
            else:
                self._learner_ready()
        start, end = self.done_times[warmup], self.done_times[total]
        wall = end - start
        roll = sum(_overlap(w.intervals, start, end) for w in self.workers) / len(self.workers)
        counts = Counter(self.lags[warmup + 1 : total + 1])
        n = sum(counts.values())
        return SimResult(
            step_s=wall / steps,
            samples_per_s=samples * steps / wall,
            learner_util=_overlap(self.learner_intervals, start, end) / wall,
            rollout_util=roll / wall,
            learner_idle=_overlap(self.wait_intervals, start, end) / wall,
            lag={k: counts[k] / n for k in sorted(counts)},
            dropped=self.dropped,
            steps=steps,
        )


def _overlap(intervals: list[tuple[float, float]], start: float, end: float) -> float:
    """Total length of ``intervals`` inside ``[start, end]``."""
    return sum(max(0.0, min(b, end) - max(a, start)) for a, b in intervals)
