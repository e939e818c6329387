"""Where environment steps run: an event loop for their coroutines plus worker threads for plain steps.

:class:`EnvLoop` runs on the caller's thread (lockstep episodes) or in a thread of its own (async
episodes, so steps go on while the engine generates); :func:`call` awaits a step however it is written
(``async def``, plain and blocking, or plain and ``inline``); :func:`one_at_a_time` serialises steps.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any


class DaemonPool(ThreadPoolExecutor):
    """Up to ``max_workers`` daemon threads running submitted calls in turn, started as calls arrive.

    A ``ThreadPoolExecutor`` (asyncio's default executor must be one) whose threads are daemons: Python
    joins a plain one's threads when it exits, so one environment step that never returns (past
    ``env.timeout_s``, the episode long given up) kept a finished run's process alive forever. Only
    ``submit`` and ``shutdown`` are used, and both are its own."""

    def __init__(self, max_workers: int) -> None:
        super().__init__(max_workers=max(1, max_workers))  # no thread starts here
        self.max_workers = max(1, max_workers)
        self._jobs: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._closed = False

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future:
        future: Future = Future()
        with self._lock:
            if self._closed:
                raise RuntimeError("cannot submit to a pool that is shut down")
            self._jobs.put((future, fn, args, kwargs))
            if len(self._threads) < self.max_workers:
                thread = threading.Thread(target=self._work, name="tandem-env-step", daemon=True)
                self._threads.append(thread)
                thread.start()
        return future

    def _work(self) -> None:
        while (job := self._jobs.get()) is not None:
            future, fn, args, kwargs = job
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn(*args, **kwargs))
            except BaseException as err:
                future.set_exception(err)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self._lock:
            self._closed = True
            threads = list(self._threads)
        for _ in threads:
            self._jobs.put(None)  # each idle thread ends; a stuck one is left behind (a daemon)
        if wait:
            for thread in threads:
                thread.join()


class EnvLoop:
    """The event loop environment coroutines run on, with the worker threads of plain steps. Lockstep:
    on the caller's thread, between engine calls (no step is in flight while the engine generates; an
    ``inline`` environment then spawns no thread at all). ``threaded`` (async episodes): in a thread of
    its own, so steps go on while the caller's thread generates; the engine stays on the caller's
    thread (its CUDA device, vLLM's state)."""

    def __init__(self, workers: int, threaded: bool) -> None:
        self.loop = asyncio.new_event_loop()
        self.pool = DaemonPool(workers)  # threads start only when a plain step runs
        self.loop.set_default_executor(self.pool)
        self.jobs: list[Any] = []  # submitted coroutines and those they hold; the loop's tasks (see close)
        self.tasks: list[asyncio.Task] = []
        self.loop.set_task_factory(self._task)
        self.thread: threading.Thread | None = None
        if threaded:
            self.thread = threading.Thread(target=self.loop.run_forever, name="tandem-env-loop", daemon=True)
            self.thread.start()

    def _task(self, loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> asyncio.Task:
        task = asyncio.Task(coro, loop=loop, **kwargs)
        self.tasks.append(task)
        return task

    def submit(self, job: Any) -> Any:
        """Start coroutine ``job``: a future (``done``, ``result``, ``cancel``)."""
        self.jobs += _held(job)
        if self.thread is None:
            return self.loop.create_task(job)  # runs while :meth:`wait` runs the loop
        return asyncio.run_coroutine_threadsafe(job, self.loop)

    def wait(self, futures: list[Any], timeout: float | None, when: str) -> set[Any]:
        """The ``futures`` done once ``when`` (FIRST_COMPLETED, FIRST_EXCEPTION) holds or ``timeout`` passes."""
        if self.thread is None:
            done, _ = self.loop.run_until_complete(asyncio.wait(futures, timeout=timeout, return_when=when))
        else:
            done, _ = wait(futures, timeout=timeout, return_when=when)
        return done

    def close(self) -> None:
        """Cancel what still runs (an error ended the call), stop the loop and close it. Quietly: a job
        that never started (waiting its turn behind ``one_at_a_time``'s lock) is closed with the
        coroutine it was given, and the errors of jobs that failed after the first one (which the
        caller raised) are taken, not left for asyncio to log as "never retrieved"."""

        async def cancel() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        if self.thread is None:
            self.loop.run_until_complete(cancel())
        else:
            with contextlib.suppress(Exception):  # a step that ignores cancellation is dropped with the loop
                asyncio.run_coroutine_threadsafe(cancel(), self.loop).result(timeout=5.0)
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join()
        self.loop.close()
        self.pool.shutdown(wait=False)  # a timed-out step's thread is not waited for
        for job in self.jobs:  # never ran: a task cancelled before it started, or never made (threaded)
            if inspect.getcoroutinestate(job) == inspect.CORO_CREATED:
                job.close()  # else collecting it warns "coroutine ... was never awaited"
        for task in self.tasks:
            if task.done() and not task.cancelled():
                task.exception()  # marks it retrieved: the call has already raised its first error
        self.jobs, self.tasks = [], []


def _held(job: Any) -> list[Any]:
    """Coroutine ``job`` and, while it has not started, the coroutines it was given, recursively (an
    unstarted ``one_at_a_time(step)`` holds ``step``: cancelling it before it starts never awaits
    ``step``)."""
    if not inspect.iscoroutine(job) or inspect.getcoroutinestate(job) != inspect.CORO_CREATED:
        return []
    held = [job]
    for arg in job.cr_frame.f_locals.values():  # an unstarted coroutine's locals are its arguments
        held += _held(arg)
    return held


async def one_at_a_time(job: Any, lock: asyncio.Lock | None) -> Any:
    """Await ``job``, holding ``lock`` when there is one (serial environment steps, in order)."""
    if lock is None:
        return await job
    async with lock:
        return await job


async def call(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)``: awaited when async, in a worker thread when plain (so blocking steps overlap),
    inline when its environment says its plain methods never block (``inline = True``)."""
    if inspect.iscoroutinefunction(fn):
        return await fn(*args)
    if getattr(getattr(fn, "__self__", None), "inline", False):
        return fn(*args)
    out = await asyncio.to_thread(fn, *args)
    return await out if inspect.isawaitable(out) else out
