"""Wall-time (and process CPU-time) accounting for the named phases of a training step (generate, reward,
update, …)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator


class PhaseTimer:
    """Accumulates wall time per phase name until :meth:`reset`.

    ``with timer.phase("generate"): ...`` adds the block's duration (also when it raises) to
    ``timing/generate``. GPU work is asynchronous, so pass ``synchronize=torch.cuda.synchronize`` to
    charge each phase with the device work it launched instead of the next phase. Phases are not
    meant to nest; nested blocks would each count their full duration.

    It also adds the process's CPU time over each block (``cpu_clock``: all its threads; the planner
    divides it by wall time to see what share of the cores a phase got on a shared machine), reported
    apart by :meth:`cpu_metrics` as ``cpu/<phase>``.
    """

    def __init__(
        self,
        *,
        clock: Callable[[], float] = time.perf_counter,
        synchronize: Callable[[], None] | None = None,
        cpu_clock: Callable[[], float] = time.process_time,
    ) -> None:
        self._clock = clock
        self._cpu_clock = cpu_clock
        self._synchronize = synchronize
        self._totals: dict[str, float] = {}
        self._cpu: dict[str, float] = {}

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Time the enclosed block and add it to phase ``name``."""
        if self._synchronize is not None:
            self._synchronize()
        start, cpu_start = self._clock(), self._cpu_clock()
        try:
            yield
        finally:
            if self._synchronize is not None:
                self._synchronize()
            self._totals[name] = self._totals.get(name, 0.0) + (self._clock() - start)
            self._cpu[name] = self._cpu.get(name, 0.0) + (self._cpu_clock() - cpu_start)

    def metrics(self) -> dict[str, float]:
        """Seconds per phase since the last reset, as ``{"timing/<phase>": seconds}`` in first-use order."""
        return {f"timing/{name}": seconds for name, seconds in self._totals.items()}

    def cpu_metrics(self) -> dict[str, float]:
        """Process CPU seconds per phase since the last reset, as ``{"cpu/<phase>": seconds}``."""
        return {f"cpu/{name}": seconds for name, seconds in self._cpu.items()}

    def reset(self) -> None:
        """Forget all accumulated times (call once per step after logging)."""
        self._totals.clear()
        self._cpu.clear()
