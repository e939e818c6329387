"""The decoupled learner: pulls scored batches from the trajectory channel, enforces the staleness bound,
runs the shared learner phases (:class:`~tandem.orchestration.learner.LearnerStep`) and publishes weights.

Order: among the batches available, the oldest ticket first (lowest policy lag). A batch generated with
version ``v`` trains at learner version ``u`` only if ``u − v ≤ η`` (else it is dropped and counted);
a ticket already consumed is a duplicate (counted, acknowledged, never trained). After each update the
new weights are published *before* the consumption is announced, so a worker admitted by that
announcement always samples with them (η = 0 is then exactly synchronous).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from tandem.channels.base import Delivery, TrajectoryChannel
from tandem.channels.weights import SharedMemoryWeights
from tandem.errors import TandemError
from tandem.monitor import PhaseTimer
from tandem.orchestration.colocated import rollout_metrics
from tandem.orchestration.decoupled.coordination import Coordination
from tandem.orchestration.decoupled.ledger import TicketLedger
from tandem.orchestration.learner import LearnerStep
from tandem.orchestration.rollout_step import sample_rows
from tandem.orchestration.staleness import StalenessController
from tandem.types import RolloutBatch


class LearnerStarvedError(TandemError):
    """No trajectory arrived within ``architecture.learner_timeout_s``."""


class DecoupledLearner:
    """Learner state of a decoupled run (version, ledger, pending acknowledgements, idle time)."""

    def __init__(
        self,
        learn: LearnerStep,
        channel: TrajectoryChannel,
        weights: SharedMemoryWeights,
        coord: Coordination,
        controller: StalenessController,
        *,
        version: int,
        ledger: TicketLedger,
        poll_workers: Callable[[], None],
        timeout_s: float,
    ) -> None:
        self.learn, self.channel, self.weights, self.coord = learn, channel, weights, coord
        self.controller, self.ledger, self.version = controller, ledger, version
        self.poll_workers, self.timeout_s = poll_workers, timeout_s
        self.timer: PhaseTimer = learn.timer
        self.buffer: dict[int, Delivery] = {}
        self.pending_acks: list[str] = []
        self.started = time.perf_counter()
        self.idle_s = 0.0  # since start (includes waiting for the workers to start)
        self.step_idle_s = 0.0  # in the current step
        self.last: tuple[RolloutBatch, torch.Tensor] | None = None
        # Alert hook (action ``skip``): sees the batch's reward metrics plus each mini-batch's loss and
        # grad norm before every optimizer.step(); False drops the update (as in the colocated trainer).
        self.pre_update: Callable[[dict[str, float]], bool] | None = None

    # -- intake ---------------------------------------------------------------------------------------------
    def _take(self, delivery: Delivery) -> None:
        msg = delivery.message
        if delivery.redelivered:
            self.ledger.redelivered_samples += msg.num_samples
        if self.ledger.seen(msg.ticket) or msg.ticket in self.buffer:
            self.ledger.record_duplicate(msg.num_samples)
            self.pending_acks.append(delivery.delivery_id)
            return
        self.buffer[msg.ticket] = delivery

    def drain(self, timeout: float = 0.0) -> int:
        """Move every message available within ``timeout`` into the buffer; returns how many arrived."""
        n = 0
        while (d := self.channel.get(timeout if n == 0 else 0.0)) is not None:
            self._take(d)
            n += 1
        return n

    def recover(self) -> list[int]:
        """At (re)start on a durable channel: buffer every un-acknowledged message (pending re-deliveries
        first, then unread ones); returns the tickets now waiting to be consumed."""
        while self.drain(timeout=0.2):
            pass
        return sorted(self.buffer)

    def _next(self) -> Delivery:
        """The buffered delivery with the oldest ticket, waiting (and supervising workers) if none."""
        waited = time.perf_counter()
        while not self.buffer:
            self.poll_workers()
            self.drain(timeout=0.2)
            if not self.buffer and time.perf_counter() - waited > self.timeout_s:
                raise LearnerStarvedError(
                    f"no trajectory arrived for {self.timeout_s:.0f} s",
                    where="architecture.learner_timeout_s",
                    hint="check the rollout workers' log; raise the timeout for slow generation",
                )
        self.idle_s += time.perf_counter() - waited
        self.step_idle_s += time.perf_counter() - waited
        self.drain()
        return self.buffer.pop(min(self.buffer))

    # -- one step -------------------------------------------------------------------------------------------
    def step(self) -> dict[str, float]:
        """Train on the next fresh batch (dropping stale ones on the way); returns the step's metrics."""
        self.timer.reset()
        t0, self.step_idle_s = time.perf_counter(), 0.0
        while True:
            delivery = self._next()
            msg = delivery.message
            self.pending_acks.append(delivery.delivery_id)
            empty = msg.batch.batch_size == 0  # dynamic sampling kept no group: a step without an update
            sample_version = self.version if empty else int(msg.batch.policy_version.min())
            if self.controller.is_fresh(sample_version, self.version):
                break
            self.ledger.record_dropped(msg.ticket, msg.num_samples)
            self.coord.consume(1)
        lag = self.controller.lag(sample_version, self.version)
        scored = float(msg.scores.mean()) if msg.scores.numel() else 0.0
        hook, known = (
            self.pre_update,
            {"reward/mean": scored, **msg.meta},
        )  # the worker's value if it sent one
        self.learn.pre_step = None if hook is None else (lambda m: hook({**known, **m}))
        metrics = self.learn(msg.batch, msg.scores) if msg.batch.batch_size > 0 else {}
        self.version += 1
        with self.timer.phase("sync"):
            self.weights.publish(self.learn.policy.state_dict(), self.version)
        self.coord.consume(1)
        self.ledger.record_trained(msg.ticket, msg.num_samples, lag)
        self.last = (msg.batch, msg.scores)
        metrics.update(self._step_metrics(msg.meta, msg.batch, msg.scores, lag, t0))
        metrics["decoupled/ticket"] = float(msg.ticket)
        metrics["decoupled/worker"] = float(msg.worker_id)
        return metrics

    def _step_metrics(
        self, meta: dict[str, float], batch: RolloutBatch, scores: torch.Tensor, lag: int, t0: float
    ) -> dict[str, float]:
        wall = max(1e-9, time.perf_counter() - self.started)
        out: dict[str, Any] = {k: v for k, v in meta.items() if not k.startswith("worker/timing/")}
        for k, v in meta.items():  # worker phase times keep the colocated names: timing/generate, ...
            if k.startswith("worker/timing/"):
                out[k.removeprefix("worker/")] = v
        out["worker/sync_s"] = meta.get("worker/timing/sync", 0.0)
        # the worker reports the reward of everything it sampled (before a dynamic-sampling filter)
        out["reward/mean"] = meta.get("reward/mean", float(scores.mean()) if scores.numel() else 0.0)
        out["reward/std"] = meta.get("reward/std", float(scores.std()) if scores.numel() > 1 else 0.0)
        out.update(rollout_metrics(batch, meta.get("worker/timing/generate", 0.0)))
        out.update(self.ledger.metrics())
        out.update(self.timer.metrics())
        out["staleness/step_lag"] = float(lag)
        out["channel/depth"] = float(self.channel.depth())
        out["channel/buffered"] = float(len(self.buffer))
        out["perf/samples_per_s"] = self.ledger.trained_samples / wall
        step_s = time.perf_counter() - t0
        out["idle/learner_ratio"] = self.step_idle_s / max(1e-9, step_s)  # this step: waiting for data
        out["idle/learner_ratio_total"] = self.idle_s / wall
        out["idle/rollout_ratio"] = meta.get("worker/idle_ratio", 0.0)
        out["timing/step"] = step_s
        return out

    def acknowledge(self) -> int:
        """Acknowledge every consumed message (call right after a checkpoint); returns how many."""
        ids, self.pending_acks = self.pending_acks, []
        if ids:
            self.channel.ack(ids)
        return len(ids)

    def last_samples(self, n: int, group_size: int) -> list[dict[str, Any]]:
        """A few prompts with completions and rewards from the last trained batch."""
        return [] if self.last is None else sample_rows(*self.last, n, group_size)
