"""Trajectory channel for the Ray runtime: a queue held by one Ray actor (``ray.util.queue.Queue``).

Messages travel as safetensors bytes (:mod:`tandem.channels.serialize`), never pickled tensors, so the
actor holds opaque ``bytes`` and a message from any worker node decodes the same way. The queue actor
needs no CPU (``num_cpus=0``) and is pinned to the driver's node, where the learner reads. Not durable: the
queue dies with the run, so ``ack`` is a no-op (use the Redis channel for durability). The object pickles
as the actor handle, so pass it to worker actors as an argument; only the creating process frees the actor.

``ray`` is imported lazily (:func:`import_ray`); this module also holds the two Ray helpers every Ray
component of Tandem uses.
"""

from __future__ import annotations

from typing import Any

from tandem.channels.base import ChannelOptions, ChannelSetting, Delivery, TrajectoryMessage
from tandem.channels.serialize import decode_message, encode_message
from tandem.errors import ConfigError


def import_ray() -> Any:
    """The ``ray`` module, or a one-line ConfigError naming the key that asked for it."""
    try:
        import ray
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ConfigError(
            "the Ray runtime needs the 'ray' package, which is not installed",
            where="architecture.runtime",
            hint="pip install 'tandem-rl[ray]' or use architecture.runtime=embedded",
        ) from exc
    return ray


def driver_node_strategy() -> Any:
    """Scheduling strategy that places a helper actor on the driver's node (hard affinity)."""
    ray = import_ray()
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return NodeAffinitySchedulingStrategy(node_id=ray.get_runtime_context().get_node_id(), soft=False)


def kill_and_wait(actor: Any, timeout_s: float = 10.0) -> bool:
    """Kill ``actor`` (no restart) and wait until calls to it fail; True once it is gone.

    ``ray.kill`` only sends the request, so a call made right after it can still be served; waiting
    means that when this returns the actor's process holds no more work (bounded by ``timeout_s``).
    """
    import time

    ray = import_ray()
    ray.kill(actor, no_restart=True)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            ray.get(actor.__ray_ready__.remote(), timeout=max(0.1, deadline - time.monotonic()))
        except ray.exceptions.RayActorError:
            return True
        except ray.exceptions.GetTimeoutError:
            return False
        time.sleep(0.05)
    return False


def free_queue(queue: Any) -> None:
    """Kill the actor behind a ``ray.util.queue.Queue`` and wait until it is gone (idempotent)."""
    if queue.actor is not None:
        actor, queue.actor = queue.actor, None
        kill_and_wait(actor)


class RayQueueChannel:
    """A :class:`~tandem.channels.base.TrajectoryChannel` over an actor-backed Ray queue."""

    durable = False
    runtimes = ("ray",)  # the queue is an actor of the run's Ray instance

    class Options(ChannelOptions):
        """The Ray queue has no settings."""

    @classmethod
    def from_config(cls, options: Options, setting: ChannelSetting) -> RayQueueChannel:
        return cls()

    def __init__(self, maxsize: int = 0) -> None:
        import_ray()
        from ray.util.queue import Queue

        self._queue = Queue(
            maxsize, actor_options={"num_cpus": 0, "scheduling_strategy": driver_node_strategy()}
        )
        self._owner = True
        self.redelivered = 0  # never: the queue is not durable

    def __getstate__(self) -> dict[str, Any]:
        return {"queue": self._queue}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._queue, self._owner, self.redelivered = state["queue"], False, 0

    def put(self, message: TrajectoryMessage) -> None:
        self._queue.put(encode_message(message))

    def get(self, timeout: float) -> Delivery | None:
        from ray.util.queue import Empty

        try:  # the actor's blocking get cannot time out at 0 s (asyncio.wait_for): ask without waiting
            data = self._queue.get(block=False) if timeout <= 0 else self._queue.get(timeout=timeout)
        except Empty:
            return None
        msg = decode_message(data)
        return Delivery(message=msg, delivery_id=f"ray-{msg.ticket}")

    def ack(self, delivery_ids: list[str]) -> None:
        """No-op: queued messages are not durable, so there is nothing to confirm."""

    def depth(self) -> int:
        return int(self._queue.qsize())

    def recover(self) -> list[Delivery]:
        """Nothing to recover: the queue does not outlive its consumer."""
        return []

    def close(self) -> None:
        """Free the queue actor (creating process only; idempotent). Other processes hold just a handle."""
        if self._owner:
            free_queue(self._queue)
