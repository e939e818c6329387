"""Dynamic batching: requests that arrive within ``max_wait_ms`` are generated together.

The collector (an asyncio task on the server's event loop) takes the first waiting request, then keeps
taking requests until ``max_batch_size`` rows are gathered or ``max_wait_ms`` has passed since the first,
and hands the batch to one generation thread (:func:`tandem.serve.decode.decode_rows`, one shared forward
per step, per-row sampling parameters). The waiting queue is bounded: when it is full, :meth:`submit`
raises :class:`QueueFullError` and the server answers 429 instead of letting latency grow without bound.
While one batch generates, the next one gathers, so a busy server runs full batches back to back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from tandem.errors import first_line
from tandem.serve.decode import RowRequest, RowResult, TokenCallback
from tandem.serve.metrics import BATCH_BUCKETS, Metrics

logger = logging.getLogger(__name__)

Runner = Callable[[list[RowRequest], TokenCallback], list[RowResult]]


MAX_WAIT_FACTOR = 4  # a batch waits at most this many max_wait windows after its first request


class QueueFullError(Exception):
    """The bounded request queue is full (answer 429)."""


class RowFailedError(Exception):
    """Generating this request's row failed (answer 500); the other rows of its batch are unaffected."""


@dataclass
class Job:
    """One queued row: its future result and, when streaming, a queue of new token ids (None = done)."""

    row: RowRequest
    future: asyncio.Future
    tokens: asyncio.Queue | None = None
    enqueued: float = field(default_factory=time.perf_counter)
    sent: int = 0  # tokens already streamed to the client


class DynamicBatcher:
    """Gathers queued rows into batches and runs them on one generation thread."""

    def __init__(
        self,
        runner: Runner,
        *,
        max_batch_size: int,
        max_wait_ms: float,
        max_queue: int,
        metrics: Metrics | None = None,
        arm: str = "main",
    ) -> None:
        if max_batch_size < 1 or max_queue < 1 or max_wait_ms < 0:
            raise ValueError("max_batch_size and max_queue must be >= 1, max_wait_ms >= 0")
        self.runner = runner
        self.max_batch_size = max_batch_size
        self.max_wait_s = max_wait_ms / 1000.0
        self.max_queue = max_queue
        self.metrics = metrics or Metrics()
        self.arm = arm
        self._queue: asyncio.Queue[Job] | None = None
        self._task: asyncio.Task | None = None
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"tandem-gen-{arm}")

    def start(self) -> None:
        """Start the collector on the running event loop."""
        self._queue = asyncio.Queue(maxsize=self.max_queue)
        self._task = asyncio.get_running_loop().create_task(self._collect())

    async def stop(self) -> None:
        """Stop collecting and fail waiting jobs; the generation thread finishes its batch."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        while self._queue is not None and not self._queue.empty():
            job = self._queue.get_nowait()
            if not job.future.done():
                job.future.set_exception(RuntimeError("server shutting down"))
        self._executor.shutdown(wait=True)

    @property
    def depth(self) -> int:
        """Rows waiting to be batched."""
        return 0 if self._queue is None else self._queue.qsize()

    def submit(self, row: RowRequest, *, stream: bool = False) -> Job:
        """Queue ``row``; raises QueueFullError when ``max_queue`` rows are already waiting."""
        if self._queue is None:
            raise RuntimeError("batcher not started")
        loop = asyncio.get_running_loop()
        job = Job(row=row, future=loop.create_future(), tokens=asyncio.Queue() if stream else None)
        try:
            self._queue.put_nowait(job)
        except asyncio.QueueFull:
            raise QueueFullError(f"request queue is full ({self.max_queue} waiting)") from None
        self.metrics.set("queue_depth", self.depth, "Rows waiting to be batched.", arm=self.arm)
        return job

    async def _gather(self) -> list[Job]:
        """The first waiting job, plus every job that arrives less than ``max_wait`` after the previous
        one, up to ``max_batch_size`` rows and at most ``MAX_WAIT_FACTOR * max_wait`` after the first.

        The window slides with each arrival: when a batch finishes, its clients send their next requests
        over a few milliseconds; a fixed window from the first arrival would split them into two half
        batches that then alternate forever (measured: mean batch 16 of 32), a sliding one reunites them.
        """
        assert self._queue is not None
        batch = [await self._queue.get()]
        first = time.perf_counter()
        hard_deadline = first + MAX_WAIT_FACTOR * self.max_wait_s
        deadline = min(first + self.max_wait_s, hard_deadline)
        while len(batch) < self.max_batch_size:
            while not self._queue.empty() and len(batch) < self.max_batch_size:
                batch.append(self._queue.get_nowait())
                deadline = min(time.perf_counter() + self.max_wait_s, hard_deadline)
            remaining = deadline - time.perf_counter()
            if len(batch) >= self.max_batch_size or remaining <= 0:
                break
            try:
                batch.append(await asyncio.wait_for(self._queue.get(), remaining))
                deadline = min(time.perf_counter() + self.max_wait_s, hard_deadline)
            except asyncio.TimeoutError:
                break
        return [job for job in batch if not job.future.cancelled()]

    async def _collect(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            batch = await self._gather()
            self.metrics.set("queue_depth", self.depth, "Rows waiting to be batched.", arm=self.arm)
            if not batch:
                continue
            await self._run(loop, batch)

    async def _run(self, loop: asyncio.AbstractEventLoop, batch: list[Job]) -> None:
        """Generate ``batch`` on the generation thread; stream tokens and resolve futures.

        When the batch fails, the failure is isolated instead of failing every request in it: the rows
        are generated again in two halves, recursively, so a row that fails on its own fails alone (with
        :class:`RowFailedError`) and every other row still gets its answer. A streaming row that already
        sent tokens cannot be replayed and fails with the batch."""
        self.metrics.observe(
            "batch_size", len(batch), BATCH_BUCKETS, "Rows per generated batch.", arm=self.arm
        )
        started = time.perf_counter()
        try:
            results = await loop.run_in_executor(
                self._executor, self.runner, [j.row for j in batch], _sender(loop, batch)
            )
        except Exception as err:  # a generation failure fails only the rows that cause it
            await self._isolate(loop, batch, err)
            return
        elapsed = max(time.perf_counter() - started, 1e-9)
        produced = sum(len(r.token_ids) for r in results)
        self.metrics.inc("generated_tokens_total", produced, "Tokens generated.", arm=self.arm)
        self.metrics.set("tokens_per_second", produced / elapsed, "Tokens/s of the last batch.", arm=self.arm)
        for job, result in zip(batch, results, strict=True):
            _finish(job, result=result)

    async def _isolate(self, loop: asyncio.AbstractEventLoop, batch: list[Job], err: Exception) -> None:
        if len(batch) == 1:
            logger.error("generation failed for one request: %s", first_line(err), exc_info=err)
            _finish(batch[0], error=RowFailedError(f"generation failed for this request: {first_line(err)}"))
            return
        retry = []
        for job in batch:
            if job.sent:
                _finish(job, error=RowFailedError(f"generation failed mid-stream: {first_line(err)}"))
            elif not job.future.done() and not job.row.cancelled():
                retry.append(job)
            else:
                _finish(job, result=RowResult(token_ids=[], finish_reason="cancelled"))
        half = (len(retry) + 1) // 2
        for part in (retry[:half], retry[half:]):
            if part:
                await self._run(loop, part)


def _sender(loop: asyncio.AbstractEventLoop, batch: list[Job]) -> TokenCallback:
    """The ``on_token`` callback of ``batch`` (runs on the generation thread)."""

    def on_token(row: int, token: int) -> None:
        job = batch[row]
        if job.tokens is not None:
            job.sent += 1
            loop.call_soon_threadsafe(job.tokens.put_nowait, token)

    return on_token


def _finish(job: Job, *, result: RowResult | None = None, error: BaseException | None = None) -> None:
    if job.tokens is not None:
        job.tokens.put_nowait(None)
    if job.future.done():
        return
    if error is not None:
        job.future.set_exception(error)
    else:
        job.future.set_result(result)
