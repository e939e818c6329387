"""Durable trajectory channel on Redis Streams with a consumer group.

* ``put``: ``XADD <stream> * data <safetensors bytes> ticket <k>`` (optionally ``MAXLEN ~ max_len``).
* ``get``: first, once per consumer, ``XAUTOCLAIM`` every pending entry of the group (messages a crashed
  learner received but never acknowledged) and re-read them (``XREADGROUP ... 0``) — these are
  re-deliveries; then new entries with ``XREADGROUP ... >`` (blocking up to ``timeout``).
* ``ack``: ``XACK`` — the runtime calls it only after the checkpoint holding the update that used the
  messages, so a crash between an update and its checkpoint loses nothing; with ``trim_acked`` the entries
  are then deleted (``XDEL``): retention after acknowledgement.
* retention by age (``max_age_s``): each ``put`` also trims entries older than that (``XTRIM MINID``;
  stream ids are millisecond timestamps), like Kafka's ``retention.ms``. It deletes old entries whether or
  not they were acknowledged — a learner down for longer than ``max_age_s`` loses them (counted by the
  learner as never received), so set it well above the checkpoint interval.

``redis`` (the client library) is imported lazily: install the ``redis`` extra.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from pydantic import Field

from tandem.channels.base import ChannelOptions, ChannelSetting, Delivery, TrajectoryMessage
from tandem.channels.serialize import decode_message, encode_message
from tandem.errors import ConfigError, MissingDependencyError


def _redis_module() -> Any:
    try:
        import redis
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise MissingDependencyError("redis", "redis") from exc
    return redis


class RedisStreamChannel:
    """A :class:`~tandem.channels.base.TrajectoryChannel` on one Redis stream and consumer group."""

    durable = True
    runtimes = ("embedded", "ray")  # any process that reaches the server

    class Options(ChannelOptions):
        """``architecture.channel.options`` of the Redis backend."""

        redis_url: str = Field("redis://127.0.0.1:6379/0", description="Redis server URL.")
        stream: str | None = Field(
            None, description="Redis stream / consumer group name (default: tandem:<run.name>)."
        )
        max_len: int | None = Field(
            None,
            ge=1,
            description="Retention: trim the stream to about this many entries (acknowledged ones first).",
        )
        trim_acked: bool = Field(
            True, description="Retention: delete stream entries once acknowledged (after their checkpoint)."
        )
        max_age_s: float | None = Field(
            None,
            gt=0,
            description="Retention: trim stream entries older than this many seconds (null = keep).",
        )

    @classmethod
    def from_config(cls, options: Options, setting: ChannelSetting) -> RedisStreamChannel:
        """The run's stream (``tandem:<run.name>`` unless ``stream`` is set) on the server ``redis_url``."""
        stream = options.stream or f"tandem:{setting.run_name}"
        return cls(
            options.redis_url, stream, None, "learner", options.max_len, options.trim_acked, options.max_age_s
        )

    def __init__(
        self,
        url: str,
        stream: str,
        group: str | None = None,
        consumer: str = "learner",
        max_len: int | None = None,
        trim_acked: bool = True,
        max_age_s: float | None = None,
        batch: int = 16,
    ) -> None:
        self.url, self.stream, self.consumer = url, stream, consumer
        self.group = group or f"{stream}:learner"
        self.max_len, self.trim_acked, self.batch = max_len, trim_acked, batch
        self.max_age_s = max_age_s
        self.redelivered = 0  # messages handed out again after a consumer died without acknowledging
        self._client: Any = None
        self._ready: deque[Delivery] = deque()
        self._recovered = False
        self._ensure_group()

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_client"], state["_ready"] = None, deque()
        return state

    @property
    def client(self) -> Any:
        if self._client is None:
            redis = _redis_module()
            self._client = redis.Redis.from_url(self.url)
        return self._client

    def _ensure_group(self) -> None:
        redis = _redis_module()
        try:
            self.client.xgroup_create(self.stream, self.group, id="0", mkstream=True)
        except redis.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise
        except redis.ConnectionError as exc:
            raise ConfigError(
                f"cannot reach Redis at {self.url} ({exc})",
                where="architecture.channel.options.redis_url",
                hint="start redis-server or fix the URL",
            ) from exc

    # -- producer ---------------------------------------------------------------------------------------------
    def put(self, message: TrajectoryMessage) -> None:
        fields = {"data": encode_message(message), "ticket": str(message.ticket)}
        if self.max_len is not None:
            self.client.xadd(self.stream, fields, maxlen=self.max_len, approximate=True)
        else:
            self.client.xadd(self.stream, fields)
        if self.max_age_s is not None:
            self.trim_older_than(self.max_age_s)

    def trim_older_than(self, seconds: float) -> int:
        """Delete entries added more than ``seconds`` ago (by stream id); returns how many went."""
        sec, usec = self.client.time()  # the server's clock: stream ids are stamped with it
        now_ms = int(sec) * 1000 + int(usec) // 1000
        minid = f"{now_ms - int(seconds * 1000)}-0"  # exact (not ~): a batch per entry, streams are short
        return int(self.client.xtrim(self.stream, minid=minid, approximate=False))

    # -- consumer ---------------------------------------------------------------------------------------------
    def _recover(self) -> None:
        """Claim every pending entry of the group for this consumer and queue it as a re-delivery."""
        start = "0-0"
        while True:
            reply = self.client.xautoclaim(self.stream, self.group, self.consumer, 0, start, count=100)
            start = reply[0]
            if start in (b"0-0", "0-0"):
                break
        for entry_id, fields in self._read("0"):
            self.redelivered += 1
            self._ready.append(self._delivery(entry_id, fields, redelivered=True))
        self._recovered = True

    def _read(self, last_id: str, block_ms: int | None = None) -> list[tuple[Any, dict]]:
        reply = self.client.xreadgroup(
            self.group,
            self.consumer,
            {self.stream: last_id},
            count=self.batch if last_id == ">" else None,
            block=block_ms,
        )
        return [(eid, fields) for _, entries in (reply or []) for eid, fields in entries if fields]

    def _delivery(self, entry_id: Any, fields: dict, *, redelivered: bool) -> Delivery:
        eid = entry_id.decode() if isinstance(entry_id, bytes) else str(entry_id)
        return Delivery(message=decode_message(fields[b"data"]), delivery_id=eid, redelivered=redelivered)

    def get(self, timeout: float) -> Delivery | None:
        if not self._recovered:
            self._recover()
        if not self._ready:
            block = int(timeout * 1000) if timeout > 0 else None  # BLOCK 0 would wait forever
            for entry_id, fields in self._read(">", block_ms=block):
                self._ready.append(self._delivery(entry_id, fields, redelivered=False))
        return self._ready.popleft() if self._ready else None

    def recover(self) -> list[Delivery]:
        """Every pending entry of the group, claimed for this consumer (re-deliveries), then every unread
        one: what a restarted learner consumes before anything new."""
        out = []
        while (delivery := self.get(0.2)) is not None:
            out.append(delivery)
        return out

    def ack(self, delivery_ids: list[str]) -> None:
        if not delivery_ids:
            return
        self.client.xack(self.stream, self.group, *delivery_ids)
        if self.trim_acked:
            self.client.xdel(self.stream, *delivery_ids)

    def depth(self) -> int:
        """Entries not yet delivered to the group (Redis ≥ 7 reports it as the group's ``lag``)."""
        for info in self.client.xinfo_groups(self.stream):
            name = info.get("name")
            if (name.decode() if isinstance(name, bytes) else name) == self.group:
                lag = info.get("lag")
                return int(lag) if lag is not None else -1
        return -1

    def stats(self) -> dict[str, int]:
        """Stream counters for accounting: entries ever added, entries present, pending (un-acknowledged)."""
        info = self.client.xinfo_stream(self.stream)
        pending = self.client.xpending(self.stream, self.group)["pending"]
        return {
            "added": int(info.get("entries-added", info["length"])),
            "length": int(info["length"]),
            "pending": int(pending),
        }

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None
