"""Default trajectory channel: a ``multiprocessing`` queue of serialised messages (one machine, no services).

Messages cross the process boundary as safetensors bytes (:mod:`tandem.channels.serialize`), not pickled
tensors. Not durable: a message in the queue is lost with the run, so ``ack`` is a no-op. Pass the
channel object to worker processes as a ``Process`` argument (the queue is inherited at spawn time).
"""

from __future__ import annotations

import multiprocessing as mp
import queue as std_queue
from multiprocessing.context import BaseContext

from tandem.channels.base import ChannelOptions, ChannelSetting, Delivery, TrajectoryMessage
from tandem.channels.serialize import decode_message, encode_message


class QueueChannel:
    """A :class:`~tandem.channels.base.TrajectoryChannel` over ``multiprocessing.Queue``."""

    durable = False
    runtimes = ("embedded",)  # worker processes inherit the queue; Ray actors cannot reach it

    class Options(ChannelOptions):
        """The queue has no settings."""

    def __init__(self, ctx: BaseContext | None = None, maxsize: int = 0) -> None:
        self._queue = (ctx or mp.get_context("spawn")).Queue(maxsize)
        self.redelivered = 0  # never: the queue is not durable

    @classmethod
    def from_config(cls, options: Options, setting: ChannelSetting) -> QueueChannel:
        """A queue in the context the worker processes are spawned with."""
        return cls(setting.mp_context)

    def put(self, message: TrajectoryMessage) -> None:
        self._queue.put(encode_message(message))

    def get(self, timeout: float) -> Delivery | None:
        try:
            data = self._queue.get(timeout=max(0.0, timeout))
        except std_queue.Empty:
            return None
        msg = decode_message(data)
        return Delivery(message=msg, delivery_id=f"q-{msg.ticket}")

    def ack(self, delivery_ids: list[str]) -> None:
        """No-op: queued messages are not durable, so there is nothing to confirm."""

    def depth(self) -> int:
        try:
            return int(self._queue.qsize())
        except NotImplementedError:  # macOS
            return -1

    def recover(self) -> list[Delivery]:
        """Nothing to recover: the queue does not outlive its consumer."""
        return []

    def close(self) -> None:
        """Detach this process from the queue without waiting for its feeder thread to flush to nobody."""
        self._queue.cancel_join_thread()
        self._queue.close()
