"""The trajectory-channel interface between rollout workers (producers) and the learner (consumer).

A channel moves :class:`TrajectoryMessage` objects — one scored batch of samples each — serialised
explicitly (:mod:`tandem.channels.serialize`: safetensors bytes + JSON, never pickled tensors). Each backend
is one module whose class implements :class:`TrajectoryChannel` and :class:`ChannelBackend` (its options
model, the runtimes it serves, ``from_config``), plus one line in ``BACKENDS`` (``tandem/channels/__init__.py``);
a Kafka backend would be a new ``kafka.py`` whose ``put`` produces to a topic, ``get`` polls a consumer group
and ``ack`` commits offsets after the checkpoint, with ``Options`` holding its brokers and topic.

Delivery semantics: ``get`` returns a :class:`Delivery` whose ``delivery_id`` the learner passes to ``ack``
once the update that used the sample is durable (checkpointed). Non-durable backends (the in-process
queue) treat ``ack`` as a no-op; durable ones (Redis Streams) re-deliver un-acknowledged messages to the
next consumer after a crash and report them through ``redelivered``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from multiprocessing.context import BaseContext
from typing import Any, ClassVar, Protocol, runtime_checkable

import torch
from pydantic import BaseModel, ConfigDict

from tandem.types import RolloutBatch


@dataclass
class TrajectoryMessage:
    """One scored batch produced by a rollout worker.

    ``ticket`` is the batch's index in the admission order (see ``tandem.orchestration.staleness``): the
    learner never trains the same ticket twice. Every sample also carries its own id, policy version and
    behaviour log-probs inside ``batch``.
    """

    batch: RolloutBatch
    scores: torch.Tensor  # [B] float32, sequence rewards after shaping
    ticket: int
    worker_id: int
    meta: dict[str, float] = field(default_factory=dict)  # worker timings and reward metrics
    # a prompt curriculum's report of this ticket: {"drawn": [row, ...], "observed": [[row, mean, all_equal],
    # ...]} (tandem.algos.PromptStats.apply); None without a curriculum
    curriculum: dict[str, list] | None = None

    @property
    def num_samples(self) -> int:
        return self.batch.batch_size


@dataclass
class Delivery:
    """A message as handed to the consumer; ``delivery_id`` is what ``ack`` takes."""

    message: TrajectoryMessage
    delivery_id: str
    redelivered: bool = False  # True when a previous consumer received it but never acknowledged it


@runtime_checkable
class TrajectoryChannel(Protocol):
    """Producer/consumer channel of trajectory messages (see the module docstring for semantics).

    ``durable``: un-acknowledged messages survive the consumer (a restarted learner re-reads them)."""

    durable: bool

    def put(self, message: TrajectoryMessage) -> None:
        """Append one message (called by rollout workers; must be safe from several processes)."""
        ...

    def get(self, timeout: float) -> Delivery | None:
        """The next message, or ``None`` after ``timeout`` seconds without one."""
        ...

    def ack(self, delivery_ids: list[str]) -> None:
        """Mark messages as durably consumed (after the checkpoint of the update that used them)."""
        ...

    def depth(self) -> int:
        """Messages waiting to be consumed (-1 when the backend cannot tell)."""
        ...

    def recover(self) -> list[Delivery]:
        """At a consumer's (re)start: what a restarted learner must consume first — messages an earlier
        consumer took but never acknowledged (``redelivered``), then unread ones. ``[]`` when not
        ``durable`` (nothing outlives the consumer)."""
        ...

    def close(self) -> None:
        """Release this process's handles (idempotent)."""
        ...


@runtime_checkable
class WeightChannel(Protocol):
    """Versioned weights from the learner to the rollout workers: the learner ``publish``es after each
    update, a worker ``fetch``es a private copy when a version newer than its own exists. Created in the
    learner's process and passed to the workers (picklable). Implementations: shared memory on one machine
    (:mod:`tandem.channels.weights`), the Ray object store (:mod:`tandem.channels.ray_weights`)."""

    @property
    def version(self) -> int:
        """The newest published version (-1 before the first publish)."""
        ...

    def publish(self, state: dict[str, torch.Tensor], version: int) -> None:
        """Make ``state`` (the policy's state dict) the newest weights, as ``version``."""
        ...

    def publish_stream(self, items: Iterable[tuple[str, torch.Tensor]], version: int) -> int:
        """As :meth:`publish`, from ``(name, tensor)`` pairs taken one at a time (a sharded learner gathers
        each just before, so it never holds the whole state dict); returns the bytes published."""
        ...

    def fetch(self, known_version: int) -> tuple[dict[str, torch.Tensor], int] | None:
        """A private copy of the newest weights and their version, or None when not newer than known."""
        ...

    def close(self) -> None:
        """Release this process's handle (a worker, at exit)."""
        ...

    def unlink(self) -> None:
        """Free the channel (the creating process, at shutdown)."""
        ...


class ChannelOptions(BaseModel):
    """Base of a backend's options model: unknown keys and non-finite floats are errors."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


@dataclass(frozen=True)
class ChannelSetting:
    """What a backend may need from the run besides its options."""

    run_name: str = "run"  # run.name, e.g. for a default stream or topic name
    runtime: str = "embedded"  # architecture.runtime
    mp_context: BaseContext | None = None  # embedded runtime: the context worker processes are spawned with
    # a new run, not a resume: a durable channel may discard what an earlier run with the same name left
    # there (trajectories it would otherwise train on); False keeps everything (the default for tools/tests)
    fresh: bool = False


class ChannelBackend(Protocol):
    """What a ``BACKENDS`` entry points at: a :class:`TrajectoryChannel` class that declares its options
    (``Options``, validated from ``architecture.channel.options``), the ``architecture.runtime`` values it
    can serve, whether it is durable, and how to build itself from validated options."""

    Options: ClassVar[type[ChannelOptions]]
    runtimes: ClassVar[tuple[str, ...]]
    durable: bool

    def from_config(self, options: Any, setting: ChannelSetting) -> TrajectoryChannel: ...
