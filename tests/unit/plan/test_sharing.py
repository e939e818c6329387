"""Processor sharing of a core pool, and the simulator under it, on hand-computed cases."""

from __future__ import annotations

import pytest

from tandem.errors import ConfigError
from tandem.plan.cost import PhaseTimes
from tandem.plan.sharing import (
    CorePool,
    fair_slowdown,
    interference_factor,
    speeds,
)
from tandem.plan.simulate import Layout, simulate

B = 128


def dec(eta: int, workers: int = 1, **kw) -> Layout:
    return Layout(mode="decoupled", staleness=eta, workers=workers, **kw)


# -- the pool -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("threads", "others", "background", "cores_got"),
    [
        (1, 0, 0.0, 1.0),  # fits: its threads' worth
        (1, 1, 0.0, 1.0),  # two threads on two cores: still a core each
        (1, 2, 0.0, 2 / 3),  # three threads on two cores: 2 · 1/3
        (2, 1, 0.0, 4 / 3),  # a two-thread phase beside one thread: 2 · 2/3
        (1, 0, 2.0, 2 / 3),  # alone beside two threads of other jobs: 2 · 1/3
        (1, 0, 1.0, 1.0),  # one other job's thread: still fits
        (4, 0, 0.0, 2.0),  # more threads than cores: all the cores, no more
    ],
)
def test_share_is_threads_when_everything_fits_else_the_fair_share(threads, others, background, cores_got):
    assert CorePool(2, background=background).share(threads, others) == pytest.approx(cores_got)


def test_speed_is_relative_to_the_calibrated_share():
    # calibrated beside one other job's thread (fits: 1 core); now three: 2 · 1/4 = 1/2 a core
    pool = CorePool(2, background=3, reference_background=1)
    assert pool.reference_share == pytest.approx(1.0)
    assert pool.speed(1) == pytest.approx(0.5)
    # calibrated under the same background (2/4 of a core) and alone: speed 1; beside a second phase of
    # the run 2 · 1/5 of a core: speed (2/5) / (2/4)
    same = CorePool(2, background=3)
    assert same.speed(1) == pytest.approx(1.0)
    assert same.speed(1, 1) == pytest.approx(0.8)


def test_speeds_of_a_busy_set():
    pool = CorePool(2)
    assert speeds(pool, {"learner": 1, "w0": 1}) == {"learner": 1.0, "w0": 1.0}
    assert speeds(pool, {"learner": 1, "w0": 1, "w1": 1}) == pytest.approx(
        {"learner": 2 / 3, "w0": 2 / 3, "w1": 2 / 3}
    )
    assert speeds(None, {"learner": 1, "w0": 1, "w1": 1}) == {"learner": 1.0, "w0": 1.0, "w1": 1.0}


def test_bad_pools_are_config_errors():
    with pytest.raises(ConfigError, match="cores > 0"):
        CorePool(0)
    with pytest.raises(ConfigError, match="backgrounds >= 0"):
        CorePool(2, background=-1)
    with pytest.raises(ConfigError, match="interference factors must be > 0"):
        CorePool(2, interference={"generate": 0.0})


# -- co-run interference --------------------------------------------------------------------------------------
def test_interference_divides_the_speed_only_while_another_phase_computes():
    pool = CorePool(2, interference={"generate": 2.0, "update": 1.5})
    kinds = {"w0": "generate", "learner": "update"}
    # side by side on two cores (fair share: a core each), each slowed by its kind's factor
    assert speeds(pool, {"w0": 1, "learner": 1}, kinds) == pytest.approx({"w0": 0.5, "learner": 1 / 1.5})
    # alone: no neighbour, no interference
    assert speeds(pool, {"w0": 1}, kinds) == {"w0": 1.0}
    # no kinds given, or a kind without a factor: pure processor sharing
    assert speeds(pool, {"w0": 1, "learner": 1}) == {"w0": 1.0, "learner": 1.0}
    assert pool.speed(1, 1, "logging") == pytest.approx(1.0)
    # on top of the fair share: three threads on two cores get 2/3 of a core, then / 2
    assert pool.speed(1, 2, "generate") == pytest.approx(1 / 3)


def test_the_default_pool_has_no_interference():
    assert CorePool(2).speed(1, 1, "generate") == pytest.approx(1.0)


@pytest.mark.parametrize(
    ("processes", "cores", "fair"), [(1, 2, 1.0), (2, 2, 1.0), (3, 2, 1.5), (4, 2, 2.0), (2, 1, 2.0)]
)
def test_fair_slowdown_is_one_while_the_processes_fit(processes, cores, fair):
    assert fair_slowdown(processes, cores) == pytest.approx(fair)


def test_interference_factor_is_the_slowdown_beyond_the_fair_share():
    assert interference_factor(1.0, 1.5, 2, 2) == pytest.approx(1.5)  # two fit two cores: all of it
    assert interference_factor(1.0, 3.0, 4, 2) == pytest.approx(1.5)  # 2x of the 3x is fair sharing
    assert interference_factor(2.0, 2.0, 2, 2) == pytest.approx(1.0)  # no slowdown
    with pytest.raises(ValueError, match="positive times"):
        interference_factor(0.0, 1.0, 2, 2)


def test_interference_lengthens_the_overlapped_step():
    """η = 1, one worker, G = T = 1, two cores, generation 1.5× and the update 1.2× slower side by side.
    From the second step on the update (1.2 s beside the worker) and the next generation start together;
    when the update ends the worker has 1.2 / 1.5 = 0.8 s of its 1 s done, and its last 0.2 s runs alone:
    a step is 1.4 s (1.0 s without interference)."""
    p = PhaseTimes(generate=1.0, update=1.0)
    pool = CorePool(2, interference={"generate": 1.5, "update": 1.2})
    assert simulate(p, dec(1), samples_per_step=B, pool=pool).step_s == pytest.approx(1.4)
    assert simulate(p, dec(1), samples_per_step=B, pool=CorePool(2)).step_s == pytest.approx(1.0)


# -- the simulator on a shared pool ---------------------------------------------------------------------------
def test_two_cores_fit_one_worker_and_the_learner():
    """Two single-thread processes on two cores: no slowdown, the overlap gives max(G, T)."""
    p = PhaseTimes(generate=1.0, update=1.0)
    assert simulate(p, dec(1), samples_per_step=B, pool=CorePool(2)).step_s == pytest.approx(1.0)


def test_one_core_makes_the_overlap_worthless():
    """One core, G = T = 1 at η = 1: the worker generates ticket 0 alone (1 s); from then on the learner
    and the worker always compute together at half speed, so each pair ends 2 s later: a step is 2 s =
    G + T, as colocated."""
    p = PhaseTimes(generate=1.0, update=1.0)
    r = simulate(p, dec(1), samples_per_step=B, pool=CorePool(1))
    assert r.step_s == pytest.approx(2.0)
    assert r.lag == {1: 1.0}


def test_logging_overlapped_with_generation_is_no_longer_free_on_one_core():
    """η = 0, G = 2, T = 1, overhead 0.5. Own devices: the overhead hides behind the next generation, a
    step is 3 s. One core: overhead and generation share it (1 s of wall for the 0.5 s overhead, the
    worker gets 0.5 s done), the worker's remaining 1.5 s runs alone, then the 1 s update: 3.5 s."""
    p = PhaseTimes(generate=2.0, update=1.0, overhead=0.5)
    assert simulate(p, dec(0), samples_per_step=B).step_s == pytest.approx(3.0)
    assert simulate(p, dec(0), samples_per_step=B, pool=CorePool(1)).step_s == pytest.approx(3.5)


def test_three_processes_on_two_cores_share_them():
    """η = 2, two workers, G = 2, T = 1. Own devices: the learner sets the pace (1 s). Two cores: the
    three processes stay busy at 2/3 speed, so the learner takes 1.5 s a step and the two workers make
    two 3-s batches per 3 s: 1.5 s a step, the pool's 3 core-seconds of work per step over 2 cores."""
    p = PhaseTimes(generate=2.0, update=1.0)
    assert simulate(p, dec(2, workers=2), samples_per_step=B).step_s == pytest.approx(1.0)
    r = simulate(p, dec(2, workers=2), samples_per_step=B, pool=CorePool(2))
    assert r.step_s == pytest.approx(1.5)


def test_background_load_slows_every_phase_alike_when_colocated():
    """Calibrated alone on an idle 2-core machine; now 2 threads of other jobs: one thread gets 2/3 of a
    core, so every phase is 1.5× as long."""
    p = PhaseTimes(generate=1.0, update=1.0)
    idle = CorePool(2, background=0)
    busy = CorePool(2, background=2, reference_background=0)
    assert simulate(p, Layout(), samples_per_step=B, pool=idle).step_s == pytest.approx(2.0)
    assert simulate(p, Layout(), samples_per_step=B, pool=busy).step_s == pytest.approx(3.0)


def test_a_worker_with_more_threads_gets_more_of_the_pool():
    """2 cores, one thread of another job; phases calibrated alone with one thread (2 runnable threads:
    a whole core). A 2-thread worker beside the 1-thread learner: 4 runnable threads, the worker gets
    2 · 2/4 = 1 core (speed 1), the learner 2 · 1/4 = 1/2 a core (speed 0.5)."""
    pool = CorePool(2, background=1)
    rates = speeds(pool, {"worker": 2, "learner": 1})
    assert rates == pytest.approx({"worker": 1.0, "learner": 0.5})


def test_no_pool_is_the_old_simulator():
    """Jittered two-worker run: the pool-less path draws and schedules as before (same seed, same result)."""
    p = PhaseTimes(generate=1.3, update=1.0, weight_load=0.1, rollout_cv=0.8, learn_cv=0.5)
    a = simulate(p, dec(2, workers=2), samples_per_step=B, seed=3)
    b = simulate(p, dec(2, workers=2), samples_per_step=B, seed=3, pool=CorePool(64))
    assert a.step_s == pytest.approx(b.step_s)
    assert a.lag == b.lag
