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
* a new run must not train on what an earlier run of the same name left (unread and pending entries):
  opened ``fresh`` (``ChannelSetting.fresh``: a run not resuming), the channel deletes the stream and its
  group and creates both anew. Only the learner opens it, before any of its rollout workers exists (they
  get it pickled), so nothing of its own run is lost. A resume keeps them: they are what it re-reads.
* a run token tells this run's entries from another's: opened fresh, the channel draws a new token and
  stores it beside the stream (``<stream>:run``); a resume reads it back. Producers (pickled copies) stamp
  every entry with the token they were opened with, and the consumer deletes, unread, entries stamped with
  another (counted in ``foreign``, logged): what a rollout worker of a crashed earlier run that has not yet
  noticed its learner is gone still writes never reaches the new run. Entries without a token (written
  before tokens existed) are kept.

``redis`` (the client library) is imported lazily: install the ``redis`` extra.
"""

from __future__ import annotations

import logging
import uuid
from collections import deque
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from pydantic import Field, field_validator
from pydantic_core import PydanticCustomError

from tandem.channels.base import ChannelOptions, ChannelSetting, Delivery, TrajectoryMessage
from tandem.channels.serialize import decode_message, encode_message
from tandem.errors import ConfigError, MissingDependencyError, first_line

log = logging.getLogger(__name__)

_URL_KEY = "architecture.channel.options.redis_url"
_URL_FORMS = "redis://[:password@]host:port/db, rediss://... (TLS) or unix:///path/to/socket"


def _redis_module() -> Any:
    try:
        import redis
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise MissingDependencyError("redis", "redis") from exc
    return redis


def shown_url(url: str) -> str:
    """``url`` as it may appear in a message: its password replaced by ``***``."""
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:
        return url
    if not password:
        return url
    user = parts.username or ""
    return parts._replace(netloc=f"{user}:***@{parts.netloc.rpartition('@')[2]}").geturl()


def url_problem(url: str) -> str | None:
    """What makes ``url`` unusable as a Redis URL, or None — the checks the client library makes when it
    parses one (scheme, port range, query values), plus a database that is not a non-negative number
    (which it would silently ignore). Whether the server has that database shows only on connecting."""
    parts = urlsplit(url)
    if parts.scheme not in ("redis", "rediss", "unix"):
        return f"'{shown_url(url)}' is not a Redis URL; use {_URL_FORMS}"
    try:
        parts.port  # noqa: B018 - raises for a port outside 0-65535 or not a number
    except ValueError as exc:
        return f"bad port in '{shown_url(url)}' ({exc})"
    query = parse_qs(parts.query)
    db = query["db"][0] if query.get("db") else unquote(parts.path).replace("/", "")
    if parts.scheme != "unix" and db and not db.isdigit():
        return f"database '{db}' in '{shown_url(url)}' is not a number ≥ 0"
    try:
        from redis.connection import parse_url
    except ImportError:  # pragma: no cover - depends on the environment (opening the channel reports it)
        return None
    try:
        parse_url(url)
    except ValueError as exc:
        return f"{first_line(exc)} ('{shown_url(url)}')"
    return None


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

        @field_validator("redis_url")
        @classmethod
        def _valid_url(cls, value: str) -> str:
            """A malformed URL is refused with the options (a decoupled run's pre-flight), before any work."""
            problem = url_problem(value)
            if problem is not None:
                raise PydanticCustomError("redis_url", problem)
            return value

    @classmethod
    def from_config(cls, options: Options, setting: ChannelSetting) -> RedisStreamChannel:
        """The run's stream (``tandem:<run.name>`` unless ``stream`` is set) on the server ``redis_url``.

        Only the learner opens the channel (its rollout workers get it pickled, after it is open); a new run
        (``setting.fresh``) starts on an empty stream, a resumed one finds what it left."""
        stream = options.stream or f"tandem:{setting.run_name}"
        fresh = setting.fresh
        return cls(
            options.redis_url,
            stream,
            None,
            "learner",
            options.max_len,
            options.trim_acked,
            options.max_age_s,
            fresh=fresh,
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
        *,
        fresh: bool = False,
    ) -> None:
        """Open ``stream`` and its consumer group ``group`` (created when missing). ``fresh``: first delete
        the stream and its group — a new run must not consume what an earlier one left; only the consumer
        side may pass it, and only before any producer of its own run has written."""
        self.url, self.stream, self.consumer = url, stream, consumer
        self.group = group or f"{stream}:learner"
        self.max_len, self.trim_acked, self.batch = max_len, trim_acked, batch
        self.max_age_s = max_age_s
        self.redelivered = 0  # messages handed out again after a consumer died without acknowledging
        self.foreign = 0  # entries of another run (another token) deleted unread
        self.run_token = ""  # set by _open: this run's token, stamped on every entry put
        self._client: Any = None
        self._ready: deque[Delivery] = deque()
        self._recovered = False
        self._open(fresh)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_client"], state["_ready"] = None, deque()
        return state

    @property
    def client(self) -> Any:
        if self._client is None:
            redis = _redis_module()
            try:
                self._client = redis.Redis.from_url(self.url)
            except ValueError as exc:  # a malformed URL given to the constructor directly
                raise ConfigError(f"{first_line(exc)} ('{shown_url(self.url)}')", where=_URL_KEY) from None
        return self._client

    def _open(self, fresh: bool) -> None:
        """Create the group (and the stream), after deleting both when ``fresh``; a server that cannot be
        reached or refuses (no such database, authentication, a key of another type) is a ConfigError."""
        redis = _redis_module()
        url = shown_url(self.url)
        try:
            if fresh:
                self._reset()
            else:
                self._ensure_group()
        except redis.ConnectionError as exc:
            raise ConfigError(
                f"cannot reach Redis at {url} ({first_line(exc)})",
                where=_URL_KEY,
                hint="start redis-server or fix the URL",
            ) from None
        except redis.ResponseError as exc:
            if "WRONGTYPE" in str(exc):
                raise ConfigError(
                    f"key '{self.stream}' on {url} is not a stream",
                    where="architecture.channel.options.stream",
                    hint="name another stream",
                ) from None
            raise ConfigError(f"Redis at {url} refused: {first_line(exc)}", where=_URL_KEY) from None

    @property
    def token_key(self) -> str:
        """The key beside the stream that holds the token of the run writing to it."""
        return f"{self.stream}:run"

    def _ensure_group(self) -> None:
        """Create the group when missing and adopt the stream's run token (drawn here when it has none)."""
        redis = _redis_module()
        try:
            self.client.xgroup_create(self.stream, self.group, id="0", mkstream=True)
        except redis.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise
        self.client.set(self.token_key, uuid.uuid4().hex, nx=True)
        token = self.client.get(self.token_key)
        self.run_token = token.decode() if isinstance(token, bytes) else str(token)

    def _reset(self) -> None:
        """Delete the stream with its groups and create it anew with an empty group, in one transaction."""
        kind = self.client.type(self.stream)
        if (kind.decode() if isinstance(kind, bytes) else kind) not in ("none", "stream"):
            raise _redis_module().ResponseError("WRONGTYPE")  # reported by _open; never deleted
        self.run_token = uuid.uuid4().hex
        with self.client.pipeline(transaction=True) as pipe:
            pipe.xlen(self.stream)
            pipe.delete(self.stream)
            pipe.xgroup_create(self.stream, self.group, id="0", mkstream=True)
            pipe.set(self.token_key, self.run_token)
            left = int(pipe.execute()[0])
        if left:
            log.info("stream %s: discarded %d entries an earlier run left (a fresh run)", self.stream, left)

    # -- producer ---------------------------------------------------------------------------------------------
    def put(self, message: TrajectoryMessage) -> None:
        fields = {"data": encode_message(message), "ticket": str(message.ticket), "run": self.run_token}
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
        for entry_id, fields in self._ours(self._read("0")):
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

    def _ours(self, entries: list[tuple[Any, dict]]) -> list[tuple[Any, dict]]:
        """``entries`` less those stamped with another run's token, which are deleted unread."""
        ours, theirs = [], []
        for entry_id, fields in entries:
            token = fields.get(b"run")
            (ours if token is None or token.decode() == self.run_token else theirs).append((entry_id, fields))
        if theirs:
            ids = [entry_id for entry_id, _ in theirs]
            self.client.xack(self.stream, self.group, *ids)
            self.client.xdel(self.stream, *ids)
            self.foreign += len(theirs)
            log.warning(
                "stream %s: deleted %d entries another run wrote (%d so far; a rollout worker of an earlier "
                "run that is still running?)",
                self.stream,
                len(theirs),
                self.foreign,
            )
        return ours

    def _delivery(self, entry_id: Any, fields: dict, *, redelivered: bool) -> Delivery:
        eid = entry_id.decode() if isinstance(entry_id, bytes) else str(entry_id)
        return Delivery(message=decode_message(fields[b"data"]), delivery_id=eid, redelivered=redelivered)

    def get(self, timeout: float) -> Delivery | None:
        if not self._recovered:
            self._recover()
        block = int(timeout * 1000) if timeout > 0 else None  # BLOCK 0 would wait forever
        while not self._ready:
            entries = self._read(">", block_ms=block)
            for entry_id, fields in self._ours(entries):
                self._ready.append(self._delivery(entry_id, fields, redelivered=False))
            if not entries:
                break
            block = None  # a read of another run's entries only: read on, without waiting
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
