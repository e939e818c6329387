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

Without a core pool every role has devices of its own and a phase lasts its drawn duration. With a
:class:`~tandem.plan.sharing.CorePool` (the roles share one machine's cores) the drawn durations are work
at the calibrated speed, and every busy phase — a worker's rollout, the learner's training or logging —
advances at the speed its share of the cores gives (processor sharing), recomputed whenever a phase starts
or ends.
"""

from __future__ import annotations

import heapq
import math
import random
from collections import Counter
from dataclasses import dataclass, field
from typing import Literal

from tandem.plan.cost import PhaseTimes
from tandem.plan.sharing import CorePool, speeds


@dataclass(frozen=True)
class Layout:
    """How the phases are placed: colocated, or decoupled with ``workers`` rollout workers (each with its
    own devices), staleness bound ``staleness`` (η), a bounded channel and in-flight weight updates."""

    mode: Literal["colocated", "decoupled"] = "colocated"
    workers: int = 1
    staleness: int = 0
    channel_capacity: int | None = None  # messages waiting on the channel; None = unbounded
    in_flight: bool = False
    learner_threads: int = 1  # runnable threads of the learner (colocated: of the one process)
    worker_threads: int = 1  # runnable threads of each rollout worker

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
    pool: CorePool | None = None,
) -> SimResult:
    """Simulate ``warmup + steps`` trained steps and summarise the last ``steps``; ``pool``: the roles share
    these cores (processor sharing), else each has devices of its own."""
    if steps < 2:
        raise ValueError("simulate needs at least 2 measured steps")
    rng = random.Random(seed)
    if layout.mode == "colocated":
        speed = pool.speed(layout.learner_threads) if pool is not None else 1.0
        return _colocated(phases, samples_per_step, steps, warmup, rng, speed)
    return _Decoupled(phases, layout, rng, pool).run(samples_per_step, steps, warmup)


def _colocated(
    p: PhaseTimes, samples: int, steps: int, warmup: int, rng: random.Random, speed: float = 1.0
) -> SimResult:
    """One process, one phase at a time: every phase runs at the same ``speed``."""
    total = roll = learn = 0.0
    for i in range(warmup + steps):
        r = _draw(rng, p.generate + p.reward, p.rollout_cv) / speed
        t = (_draw(rng, p.learn_s, p.learn_cv) + p.weight_sync + p.overhead) / speed
        if i >= warmup:
            roll += r
            learn += t
            total += r + t
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


LEARNER = -1  # the learner's id among the busy phases (workers are 0, 1, …)
_ENDS = ("worker", "learner_done", "learner_wait")  # events that end a busy phase
_PHASE_KIND = {"worker": "generate", "learner_done": "update", "learner_wait": "update"}  # for interference


@dataclass
class _Busy:
    """A phase computing: ``work`` seconds at the calibrated speed left, advancing at ``speed``."""

    work: float
    threads: int
    kind: str  # event fired when it ends: "worker", "learner_done" or "learner_wait"
    speed: float = 1.0
    token: int = 0


@dataclass
class _Worker:
    loaded: int = -1  # weight version it holds
    message: tuple[int, int] | None = None  # (ticket, version) generated, not yet on the channel
    started: float = 0.0
    intervals: list[tuple[float, float]] = field(default_factory=list)


class _Decoupled:
    def __init__(self, phases: PhaseTimes, layout: Layout, rng: random.Random, pool: CorePool | None) -> None:
        self.p, self.layout, self.rng, self.pool = phases, layout, rng, pool
        self.workers = [_Worker() for _ in range(layout.workers)]
        self.busy: dict[int, _Busy] = {}  # computing phases by id (LEARNER or a worker's index)
        self.events: list[tuple[float, int, str, int, int]] = []  # (time, seq, kind, who, token)
        self.seq = self.tokens = 0
        self.now = self.advanced = 0.0
        self.version = 0
        self.issued = self.consumed = 0
        self.channel: list[tuple[int, int]] = []  # (ticket, version), kept sorted by ticket
        self.idle_workers: list[int] = list(range(layout.workers))
        self.blocked: list[int] = []  # workers holding a batch the full channel cannot take
        self.learner_waiting = True
        self.learner_intervals: list[tuple[float, float]] = []
        self.wait_intervals: list[tuple[float, float]] = []
        self.wait_since = self.learn_started = 0.0
        self.done_times: list[float] = []
        self.lags: list[int] = []
        self.dropped = 0

    def _push(self, at: float, kind: str, who: int = 0, token: int = 0) -> None:
        self.seq += 1
        heapq.heappush(self.events, (at, self.seq, kind, who, token))

    # -- processor sharing -----------------------------------------------------------------------------
    def _advance(self) -> None:
        """Take the work done since the last event off every busy phase."""
        dt = self.now - self.advanced
        for b in self.busy.values():
            b.work = max(0.0, b.work - dt * b.speed)
        self.advanced = self.now

    def _start(self, who: int, work: float, threads: int, kind: str) -> None:
        self.busy[who] = _Busy(work, threads, kind)

    def _retime(self) -> None:
        """Speeds of the busy phases under the current sharing; (re)schedule each one's end."""
        rates = speeds(
            self.pool,
            {who: b.threads for who, b in self.busy.items()},
            {who: _PHASE_KIND[b.kind] for who, b in self.busy.items()},
        )
        for who, b in self.busy.items():
            if rates[who] == b.speed and b.token:
                continue  # its scheduled end still holds
            self.tokens += 1
            b.speed, b.token = rates[who], self.tokens
            self._push(self.now + b.work / b.speed, b.kind, who, b.token)

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
            self._start(wid, load + work + self.p.transfer, self.layout.worker_threads, "worker")

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
            self.learn_started = self.now
            self._start(LEARNER, learn + self.p.weight_sync, self.layout.learner_threads, "learner_done")
            return

    def _learner_done(self) -> None:
        self.learner_intervals.append((self.learn_started, self.now))
        self.version += 1  # publish, then announce the consumption
        self.consumed += 1
        self.done_times.append(self.now)
        if self.layout.in_flight:
            for wid, w in enumerate(self.workers):
                if w.message is not None and wid in self.busy:
                    w.loaded = self.version
                    self.busy[wid].work += self.p.weight_load
                    self.busy[wid].token = 0  # its end moves: reschedule
        self._admit()
        if self.p.overhead > 0:
            self.learn_started = self.now
            self._start(LEARNER, self.p.overhead, self.layout.learner_threads, "learner_wait")
        else:
            self._push(self.now, "learner_free")

    def run(self, samples: int, steps: int, warmup: int) -> SimResult:
        self._admit()
        self._retime()
        total = warmup + steps
        while len(self.done_times) < total + 1:
            if not self.events:
                raise RuntimeError("simulation deadlocked")  # a bug: the admission rule always admits one
            at, _, kind, who, token = heapq.heappop(self.events)
            ends = kind in _ENDS
            if ends and (who not in self.busy or self.busy[who].token != token):
                continue  # an end rescheduled since
            self.now = at
            self._advance()
            if ends:
                del self.busy[who]
            if kind == "worker":
                self._worker_done(who)
                self._admit()
            elif kind == "learner_done":
                self._learner_done()
            elif kind in ("learner_wait", "learner_free"):
                if kind == "learner_wait":
                    self.learner_intervals.append((self.learn_started, self.now))  # its logging
                self.learner_waiting, self.wait_since = True, self.now
                self._learner_ready()
            else:
                self._learner_ready()
            self._retime()
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
