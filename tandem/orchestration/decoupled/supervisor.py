"""Local supervisor of rollout worker processes: start, restart the dead, scale up and down, stop.

A worker that dies (non-zero exit, e.g. killed or out of memory) is restarted in the same slot, and the
replacement first finishes the batch its predecessor was generating (the learner drops a duplicate ticket
should the predecessor have published it just before dying). A worker that fails with a user error
(exit code :data:`~tandem.orchestration.decoupled.worker.EXIT_USER_ERROR`) is not restarted: its one-line
error stops the run. ``max_restarts`` bounds restarts per slot.
"""

from __future__ import annotations

import logging
import queue as std_queue
from multiprocessing.context import BaseContext
from multiprocessing.process import BaseProcess
from multiprocessing.queues import Queue

from tandem.channels.base import TrajectoryChannel, WeightChannel
from tandem.config.schema import TandemConfig
from tandem.errors import TandemError
from tandem.orchestration.decoupled.coordination import MAX_SLOTS, Coordination
from tandem.orchestration.decoupled.worker import EXIT_USER_ERROR, WorkerSpec, worker_main

log = logging.getLogger(__name__)


class WorkerFailedError(TandemError):
    """A rollout worker failed in a way restarting cannot fix."""


class LocalSupervisor:
    """Owns the worker processes of one decoupled run on this machine."""

    def __init__(
        self,
        ctx: BaseContext,
        cfg: TandemConfig,
        channel: TrajectoryChannel,
        weights: WeightChannel,
        coord: Coordination,
    ) -> None:
        self.ctx, self.cfg = ctx, cfg
        self.channel, self.weights, self.coord = channel, weights, coord
        self.errors: Queue[str] = ctx.Queue()
        self.procs: dict[int, BaseProcess] = {}
        self.restarts: dict[int, int] = {}
        self.total_restarts = 0

    # -- lifecycle ----------------------------------------------------------------------------------------
    def _spawn(self, slot: int) -> None:
        spec = WorkerSpec(slot, self.cfg, self.channel, self.weights, self.coord, self.errors)
        proc = self.ctx.Process(target=worker_main, args=(spec,), name=f"tandem-rollout-{slot}", daemon=True)
        proc.start()
        self.procs[slot] = proc

    def start(self, num_workers: int) -> None:
        for _ in range(num_workers):
            self.add_worker()

    def add_worker(self) -> int:
        """Start one more rollout worker (elastic scale-up); returns its slot."""
        slot = next(s for s in range(MAX_SLOTS) if s not in self.procs)
        self.coord.retire(slot, False)
        self.restarts[slot] = 0
        self._spawn(slot)
        return slot

    def remove_worker(self, slot: int | None = None) -> int:
        """Retire one worker (elastic scale-down): it finishes its current batch and exits; the learner
        is not stopped. Returns the slot."""
        live = [s for s, p in self.procs.items() if p.is_alive() and not self.coord.retired(s)]
        if len(live) <= 1:
            raise WorkerFailedError("cannot remove the last rollout worker", where="architecture.num_workers")
        slot = live[-1] if slot is None else slot
        self.coord.retire(slot)
        return slot

    @property
    def num_alive(self) -> int:
        return sum(p.is_alive() for p in self.procs.values())

    @property
    def num_active(self) -> int:
        """Live workers that are not retiring (what elastic scaling counts)."""
        return sum(p.is_alive() and not self.coord.retired(s) for s, p in self.procs.items())

    def poll(self) -> None:
        """Restart dead workers; raise :class:`WorkerFailedError` on a user error or too many restarts."""
        for slot, proc in list(self.procs.items()):
            if proc.is_alive() or self.coord.stop.is_set():
                continue
            code = proc.exitcode
            if self.coord.retired(slot):
                self._reap_retired(slot)
                continue
            if code == EXIT_USER_ERROR:
                raise WorkerFailedError(self._last_error() or f"rollout worker {slot} failed")
            if self.restarts[slot] >= self.cfg.architecture.max_worker_restarts:
                raise WorkerFailedError(
                    f"rollout worker {slot} died {self.restarts[slot] + 1} times (exit code {code}); "
                    f"last error: {self._last_error() or 'none reported'}",
                    where="architecture.max_worker_restarts",
                )
            self.restarts[slot] += 1
            self.total_restarts += 1
            log.warning("rollout worker %d died (exit code %s); restarting it", slot, code)
            self._spawn(slot)

    def _reap_retired(self, slot: int) -> None:
        """A retired worker exited: hand any unfinished ticket to a live worker, forget the slot."""
        proc = self.procs.pop(slot)
        proc.join(timeout=0)
        if self.coord.orphaned(slot) >= 0:
            live = [s for s, p in self.procs.items() if p.is_alive() and not self.coord.retired(s)]
            if live:
                self.coord.reassign(slot, live[0])

    def _last_error(self) -> str | None:
        last = None
        while True:
            try:
                last = self.errors.get_nowait()
            except std_queue.Empty:
                return last

    def shutdown(self, timeout: float = 10.0) -> None:
        """Stop every worker: ask, wait ``timeout`` seconds, then terminate and finally kill stragglers."""
        self.coord.shutdown()
        for proc in self.procs.values():
            proc.join(timeout=timeout)
        for proc in self.procs.values():
            if proc.is_alive():
                proc.terminate()
                proc.join(timeout=2.0)
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=2.0)
        self.errors.cancel_join_thread()
        self.errors.close()

    def pids(self) -> list[int]:
        return [p.pid for p in self.procs.values() if p.pid is not None]
