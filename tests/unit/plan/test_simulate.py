"""The simulator on cases with known answers: sequential sums, max of the phases, utilisation identities."""

from __future__ import annotations

import pytest

from tandem.plan.cost import PhaseTimes
from tandem.plan.simulate import Layout, simulate

B = 128


def dec(eta: int, workers: int = 1, **kw) -> Layout:
    return Layout(mode="decoupled", staleness=eta, workers=workers, **kw)


def test_colocated_step_is_the_sum_of_its_phases():
    p = PhaseTimes(generate=2.0, reward=0.5, logprob=0.25, update=1.0, weight_sync=0.2, overhead=0.05)
    r = simulate(p, Layout(), samples_per_step=B)
    assert r.step_s == pytest.approx(p.colocated_step_s)
    assert r.samples_per_s == pytest.approx(B / p.colocated_step_s)
    assert r.lag == {0: 1.0}


def test_eta0_decoupled_is_sequential():
    p = PhaseTimes(
        generate=2.0, reward=0.5, logprob=0.25, update=1.0, weight_sync=0.25, weight_load=0.1, transfer=0.05
    )
    r = simulate(p, dec(0), samples_per_step=B)
    assert r.step_s == pytest.approx(0.1 + 2.0 + 0.5 + 0.05 + 0.25 + 1.0 + 0.25)
    assert r.lag == {0: 1.0}
    assert r.dropped == 0


def test_eta0_overhead_overlaps_the_next_generation():
    """The learner logs after announcing the consumption, so the worker already generates."""
    short = PhaseTimes(generate=2.0, update=1.0, overhead=0.5)
    assert simulate(short, dec(0), samples_per_step=B).step_s == pytest.approx(3.0)
    long = PhaseTimes(generate=2.0, update=1.0, overhead=5.0)  # now the overhead is the critical path
    assert simulate(long, dec(0), samples_per_step=B).step_s == pytest.approx(6.0)


@pytest.mark.parametrize("eta", [1, 2, 4])
def test_equal_phases_overlap_to_the_max(eta):
    p = PhaseTimes(generate=1.0, update=1.0)
    r = simulate(p, dec(eta), samples_per_step=B)
    assert r.step_s == pytest.approx(1.0)
    assert max(r.lag) <= eta


@pytest.mark.parametrize("eta", [1, 2, 4])
def test_a_faster_rollout_side_runs_ahead_to_the_bound(eta):
    """The worker runs ahead until the bound stops it, so every batch waits η versions (measured: the
    η = 2 CPU runs train 99 % of their samples at lag 2, docs/benchmarks.md); the learner sets the pace."""
    r = simulate(PhaseTimes(generate=0.5, update=1.0), dec(eta), samples_per_step=B)
    assert r.lag == {eta: 1.0}
    assert r.step_s == pytest.approx(1.0)
    assert r.learner_idle == pytest.approx(0.0)


@pytest.mark.parametrize(("gen", "learn", "expected"), [(3.0, 1.0, 3.0), (1.0, 3.0, 3.0), (0.5, 2.0, 2.0)])
def test_eta1_one_worker_is_bounded_by_the_slower_side(gen, learn, expected):
    r = simulate(PhaseTimes(generate=gen, update=learn), dec(1), samples_per_step=B)
    assert r.step_s == pytest.approx(expected)


def test_more_workers_help_only_while_the_bound_admits_them():
    p = PhaseTimes(generate=2.0, update=1.0)
    assert simulate(p, dec(1, workers=1), samples_per_step=B).step_s == pytest.approx(2.0)
    # η = 1 admits two unconsumed tickets, one of them in training: one worker generates at a time mostly
    assert simulate(p, dec(1, workers=2), samples_per_step=B).step_s == pytest.approx(1.5)
    assert simulate(p, dec(2, workers=2), samples_per_step=B).step_s == pytest.approx(1.0)
    slow = PhaseTimes(generate=3.0, update=1.0)
    # η = 2 admits three tickets but two workers make 2 batches per 3 s
    assert simulate(slow, dec(2, workers=2), samples_per_step=B).step_s == pytest.approx(1.5)
    # η = 0 admits one ticket at a time: the second worker never helps
    assert simulate(slow, dec(0, workers=2), samples_per_step=B).step_s == pytest.approx(4.0)


@pytest.mark.parametrize(
    "layout", [dec(0), dec(1), dec(2, workers=2), dec(3, workers=3), dec(1, workers=2, channel_capacity=1)]
)
@pytest.mark.parametrize("gen", [0.5, 1.0, 2.5])
def test_utilisation_identities(layout, gen):
    p = PhaseTimes(
        generate=gen, reward=0.1, update=1.0, logprob=0.2, weight_sync=0.1, weight_load=0.05, overhead=0.05
    )
    r = simulate(p, layout, samples_per_step=B, steps=100)
    learner_busy = p.learn_s + p.weight_sync + p.overhead
    assert r.learner_util * r.step_s == pytest.approx(learner_busy, rel=1e-6)
    assert r.learner_util + r.learner_idle == pytest.approx(1.0, abs=1e-6)
    assert r.samples_per_s * r.step_s == pytest.approx(B)
    # every worker cycle pays the load (a new version each time) except when it already holds the newest
    assert r.rollout_util * layout.workers * r.step_s <= p.rollout_s + 1e-9
    assert r.rollout_util * layout.workers * r.step_s >= p.rollout_s - p.weight_load - 1e-9


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("eta", [0, 1, 2])
@pytest.mark.parametrize("workers", [1, 3])
def test_lag_never_exceeds_eta(seed, eta, workers):
    p = PhaseTimes(generate=1.3, update=1.0, weight_load=0.1, rollout_cv=0.8, learn_cv=0.5)
    r = simulate(p, dec(eta, workers=workers), samples_per_step=B, seed=seed)
    assert max(r.lag) <= eta
    assert sum(r.lag.values()) == pytest.approx(1.0)
    if workers == 1 or eta == 0:  # batches arrive in ticket order: the admission rule keeps them all fresh
        assert r.dropped == 0


def test_out_of_order_batches_are_dropped_like_the_runtime_does():
    """Three jittery workers: a slow ticket overtaken by later ones ages past η and is dropped (the
    learner trains the oldest *waiting* ticket, as ChannelSource does)."""
    p = PhaseTimes(generate=1.3, update=1.0, rollout_cv=0.8)
    r = simulate(p, dec(1, workers=3), samples_per_step=B, seed=0)
    assert r.dropped > 0


def test_jitter_makes_the_overlap_slower_than_the_max_of_means():
    """E[max(G, T)] > max(E[G], E[T]): variation costs an overlapped layout, not a sequential one."""
    steady = simulate(PhaseTimes(generate=1.0, update=1.0), dec(1), samples_per_step=B)
    noisy = simulate(
        PhaseTimes(generate=1.0, update=1.0, rollout_cv=0.5, learn_cv=0.5),
        dec(1),
        samples_per_step=B,
        steps=2000,
    )
    assert noisy.step_s > steady.step_s * 1.05


def test_in_flight_updates_pay_a_load_per_publish_during_generation():
    """Two workers, a starved learner publishing twice per 10 s generation: between generations a worker
    loads once per ticket (10.5 s per 2 batches), in flight once per publish (11 s per 2 batches)."""
    p = PhaseTimes(generate=10.0, update=1.0, weight_load=0.5)
    between = simulate(p, dec(3, workers=2), samples_per_step=B, steps=50)
    in_flight = simulate(p, dec(3, workers=2, in_flight=True), samples_per_step=B, steps=50)
    assert between.step_s == pytest.approx(5.25)
    assert in_flight.step_s == pytest.approx(5.5)
    assert in_flight.lag == between.lag  # a batch's version is the one its generation started with
