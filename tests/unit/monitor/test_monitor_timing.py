"""PhaseTimer accumulates wall time per phase, including blocks that raise."""

from __future__ import annotations

import pytest

from tandem.monitor.timing import PhaseTimer


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_phases_accumulate_until_reset() -> None:
    clock = FakeClock()
    timer = PhaseTimer(clock=clock)
    with timer.phase("generate"):
        clock.now += 1.5
    with timer.phase("update"):
        clock.now += 0.25
    with timer.phase("generate"):
        clock.now += 2.0
    clock.now += 10.0  # time outside any phase is not counted
    assert timer.metrics() == {"timing/generate": 3.5, "timing/update": 0.25}
    timer.reset()
    assert timer.metrics() == {}


def test_phase_that_raises_is_still_counted() -> None:
    clock = FakeClock()
    timer = PhaseTimer(clock=clock)
    with pytest.raises(ZeroDivisionError), timer.phase("reward"):
        clock.now += 0.5
        _ = 1 / 0
    assert timer.metrics() == {"timing/reward": 0.5}


def test_synchronize_runs_at_both_ends_of_a_phase() -> None:
    calls: list[str] = []
    timer = PhaseTimer(clock=FakeClock(), synchronize=lambda: calls.append("sync"))
    with timer.phase("logprob"):
        calls.append("body")
    assert calls == ["sync", "body", "sync"]


def test_real_clock_measures_positive_time() -> None:
    timer = PhaseTimer()
    with timer.phase("sleep"):
        sum(range(10_000))
    assert timer.metrics()["timing/sleep"] > 0.0


def test_cpu_time_is_accumulated_per_phase_beside_wall_time() -> None:
    wall, cpu = FakeClock(), FakeClock()
    timer = PhaseTimer(clock=wall, cpu_clock=cpu)
    with timer.phase("generate"):
        wall.now += 2.0
        cpu.now += 0.5  # the process got a quarter of a core
    with timer.phase("update"):
        wall.now += 1.0
        cpu.now += 1.0
    with timer.phase("generate"):
        wall.now += 1.0
        cpu.now += 0.25
    cpu.now += 7.0  # outside any phase: not counted
    assert timer.cpu_metrics() == {"cpu/generate": 0.75, "cpu/update": 1.0}
    assert timer.metrics() == {"timing/generate": 3.0, "timing/update": 1.0}  # wall keys unchanged
    timer.reset()
    assert timer.cpu_metrics() == {}


def test_real_cpu_clock_counts_computation_not_sleep() -> None:
    import time

    timer = PhaseTimer()
    with timer.phase("sleep"):
        time.sleep(0.05)
    with timer.phase("work"):
        sum(range(200_000))
    cpu = timer.cpu_metrics()
    assert cpu["cpu/sleep"] < 0.04 and cpu["cpu/work"] > 0.0
