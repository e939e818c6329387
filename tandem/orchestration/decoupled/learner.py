"""The decoupled learner's strategies for the shared :class:`~tandem.orchestration.trainer.Trainer`: a batch
source that pulls scored batches from the trajectory channel under the staleness bound, and a weight
publisher that puts each update on the weight channel.

Order: among the batches available, the oldest ticket first (lowest policy lag). A batch generated with
version ``v`` trains at learner version ``u`` only if ``u − v ≤ η`` (else it is dropped and counted);
after a rollback every batch generated before the restored weights is dropped too. A ticket already
consumed is a duplicate (counted, acknowledged, never trained). After each update the new weights are
published *before* the consumption is announced, so a worker admitted by that announcement always samples
with them (η = 0 is then exactly synchronous).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from typing import Any, ClassVar

import torch

from tandem.channels.base import Delivery, TrajectoryChannel, TrajectoryMessage, WeightChannel
from tandem.errors import TandemError
from tandem.models.lora import publishable_entries, publishable_state_dict
from tandem.orchestration.decoupled.controls import LearnerControls
from tandem.orchestration.decoupled.ledger import TicketLedger
from tandem.orchestration.decoupled.seams import Admission
from tandem.orchestration.learner import LearnerStep
from tandem.orchestration.rollout_step import ScoredBatch, rollout_metrics
from tandem.orchestration.staleness import StalenessController
from tandem.types import RolloutBatch


class LearnerStarvedError(TandemError):
    """No trajectory arrived within ``architecture.learner_timeout_s``."""


class ChannelWeights:
    """Weight publisher of a decoupled run: the policy's state dict goes on the weight channel (merged,
    under the base model's names, for a LoRA policy: workers hold plain models). When ``learn`` keeps no
    whole policy (an FSDP2 learner's rank 0) the tensors are gathered from the shards one at a time and
    each is copied into the channel as it arrives (:meth:`LearnerStep.weights`). ``controls``: what the
    learner steers for its workers (sampling temperature, prompt statistics), published with every
    version (:mod:`.controls`)."""

    def __init__(
        self,
        weights: WeightChannel,
        learn: LearnerStep | None = None,
        controls: LearnerControls | None = None,
    ) -> None:
        self.weights, self.learn, self.controls = weights, learn, controls

    def publish(self, policy: torch.nn.Module, version: int) -> float:
        controls = {} if self.controls is None else self.controls.tensors()
        stream = None if self.learn is None else self.learn.weights()
        if stream is not None:  # gathered from the shards one tensor at a time (a LoRA layer's: merged)
            entries = itertools.chain(publishable_entries(policy, stream), controls.items())
            return float(self.weights.publish_stream(entries, version))
        state = {**publishable_state_dict(policy), **controls}
        self.weights.publish(state, version)
        return float(sum(t.numel() * t.element_size() for t in state.values()))


class ChannelSource:
    """Batch source of a decoupled run: intake from the trajectory channel, staleness filter, ticket ledger,
    pending acknowledgements and idle time."""

    state_key: ClassVar[str] = "decoupled"

    def __init__(
        self,
        channel: TrajectoryChannel,
        coord: Admission,
        controller: StalenessController,
        *,
        ledger: TicketLedger,
        poll_workers: Callable[[], None],
        timeout_s: float,
        controls: LearnerControls | None = None,
    ) -> None:
        self.channel, self.coord, self.controller, self.ledger = channel, coord, controller, ledger
        self.controls = controls  # updated on each batch taken for training, before its publish
        self.poll_workers, self.timeout_s = poll_workers, timeout_s
        self.buffer: dict[int, Delivery] = {}
        self.pending_acks: list[str] = []
        self.started = time.perf_counter()
        self.idle_s = 0.0  # since start (includes waiting for the workers to start)
        self.step_idle_s = 0.0  # in the current step
        self.floor = 0  # batches sampled with older weights were made before a rollback: stale
        self._taken: tuple[TrajectoryMessage, int, float] | None = None  # message, lag, step start

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
        """At (re)start: buffer what a durable channel still holds for this consumer (pending re-deliveries
        first, then unread messages); returns the tickets now waiting to be consumed."""
        for delivery in self.channel.recover():  # [] unless the channel is durable
            self._take(delivery)
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
    def next_batch(self, step: int, version: int) -> ScoredBatch:
        """The next fresh batch for the learner at ``version`` (stale ones are dropped on the way)."""
        t0, self.step_idle_s = time.perf_counter(), 0.0
        while True:
            delivery = self._next()
            msg = delivery.message
            self.pending_acks.append(delivery.delivery_id)
            empty = msg.batch.batch_size == 0  # dynamic sampling kept no group: a step without an update
            sample_version = version if empty else int(msg.batch.policy_version.min())
            if self.controller.is_fresh(sample_version, version) and sample_version >= self.floor:
                break
            self.ledger.record_dropped(msg.ticket, msg.num_samples)
            self.coord.consume(1)
            if self.controls is not None and sample_version >= self.floor:  # not from before a rollback
                self.controls.observe_dropped(msg)
        self._taken = (msg, self.controller.lag(sample_version, version), t0)
        if self.controls is not None:
            self.controls.observe(msg)
        return ScoredBatch(msg.batch, msg.scores, worker_metrics(msg.meta, msg.batch, msg.scores))

    def settle(self, scored: ScoredBatch, version: int) -> dict[str, float]:
        """The update is published: announce the consumption, count the batch; the step's metrics."""
        assert self._taken is not None, "settle() follows next_batch()"
        msg, lag, t0 = self._taken
        self._taken = None
        self.coord.consume(1)
        self.ledger.record_trained(msg.ticket, msg.num_samples, lag)
        wall = max(1e-9, time.perf_counter() - self.started)
        step_s = time.perf_counter() - t0
        return {
            **self.ledger.metrics(),
            "staleness/step_lag": float(lag),
            "channel/depth": float(self.channel.depth()),
            "channel/buffered": float(len(self.buffer)),
            "perf/samples_per_s": self.ledger.trained_samples / wall,
            "idle/learner_ratio": self.step_idle_s / max(1e-9, step_s),  # this step: waiting for data
            "idle/learner_ratio_total": self.idle_s / wall,
            "idle/rollout_ratio": msg.meta.get("worker/idle_ratio", 0.0),
            "decoupled/ticket": float(msg.ticket),
            "decoupled/worker": float(msg.worker_id),
        }

    # -- state ------------------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        controls = {} if self.controls is None else {"rollout": self.controls.state_dict()}
        return {"ledger": self.ledger.state_dict(), **controls}

    def restore(self, state: dict[str, Any], version: int, *, rollback: bool) -> None:
        """Resume: the ledger of the checkpoint. Rollback: the ledger stays (it counts what really went
        through the channel) and everything sampled before the restored weights (``version``) is stale.
        Both: the checkpoint's sampling temperature and prompt statistics (published with the restored
        weights)."""
        if self.controls is not None:
            self.controls.load_state_dict(state.get("rollout", {}))
        if rollback:
            self.floor = version
        else:
            self.ledger = TicketLedger.from_state(state["ledger"])

    def checkpointed(self) -> None:
        self.acknowledge()

    def acknowledge(self) -> int:
        """Acknowledge every consumed message (right after a checkpoint); returns how many."""
        ids, self.pending_acks = self.pending_acks, []
        if ids:
            self.channel.ack(ids)
        return len(ids)

    def summary(self) -> dict[str, Any]:
        return {"accounting": self.ledger.state_dict()["counts"]}


def worker_metrics(meta: dict[str, float], batch: RolloutBatch, scores: torch.Tensor) -> dict[str, float]:
    """What the worker reported with a batch, under the colocated names: its phase times as
    ``timing/generate``, ...; the reward of everything it sampled (before a dynamic-sampling filter); and
    the batch's response metrics."""
    out: dict[str, Any] = {k: v for k, v in meta.items() if not k.startswith("worker/timing/")}
    for k, v in meta.items():
        if k.startswith("worker/timing/"):
            out[k.removeprefix("worker/")] = v
    out["worker/sync_s"] = meta.get("worker/timing/weight_sync", 0.0)
    out["reward/mean"] = meta.get("reward/mean", float(scores.mean()) if scores.numel() else 0.0)
    out["reward/std"] = meta.get("reward/std", float(scores.std()) if scores.numel() > 1 else 0.0)
    out.update(rollout_metrics(batch, meta.get("worker/timing/generate", 0.0)))
    return out
