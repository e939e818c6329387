"""Candidate layouts and the recommendation."""

from __future__ import annotations

from tandem.plan.cost import Efficiency, LengthDist, ModelShape, PhaseTimes, Workload, min_train_devices
from tandem.plan.devices import DEVICES
from tandem.plan.layouts import Candidate, candidates, recommend, settings_for, target_workers
from tandem.plan.simulate import Layout, SimResult

H100 = DEVICES["h100"]


def result(samples_per_s: float, lag: int) -> SimResult:
    return SimResult(1 / samples_per_s, samples_per_s, 0.5, 0.5, 0.0, {lag: 1.0}, 0, 10)


def cand(samples_per_s: float, eta: int | None) -> Candidate:
    layout = Layout() if eta is None else Layout(mode="decoupled", staleness=eta, workers=1)
    return Candidate(layout, 4, 4, PhaseTimes(generate=1.0, update=1.0), result(samples_per_s, eta or 0))


def test_candidates_respect_memory_and_are_sorted():
    w = Workload(ModelShape.from_params(7e9), 512, LengthDist(mean=4096, max_len=8192), 512)
    cands = candidates(w, H100, 64, etas=(0, 1, 2))
    assert sum(c.layout.mode == "colocated" for c in cands) == 1
    need = min_train_devices(w.model, H100, Efficiency())
    assert all(c.train_devices >= need for c in cands)
    assert all(c.rollout_devices + c.train_devices == 64 for c in cands if c.layout.mode == "decoupled")
    rates = [c.result.samples_per_s for c in cands]
    assert rates == sorted(rates, reverse=True)
    assert all(c.layout.workers <= c.layout.staleness + 1 for c in cands if c.layout.mode == "decoupled")


def test_a_smaller_eta_within_tolerance_wins():
    close = recommend([cand(10.0, 4), cand(9.7, 1), cand(5.0, None)])
    assert close is not None and close.best.layout.staleness == 1
    assert close.speedup == 9.7 / 5.0
    far = recommend([cand(10.0, 4), cand(9.0, 1), cand(5.0, None)])
    assert far is not None and far.best.layout.staleness == 4
    assert recommend([]) is None


def test_settings_name_the_loss_staleness_needs():
    assert settings_for(cand(1.0, None)) == ["architecture.mode=colocated"]
    assert "algorithm.name=decoupled_ppo" not in settings_for(cand(1.0, 1))
    s = settings_for(cand(1.0, 2))
    assert "architecture.staleness=2" in s and "algorithm.name=decoupled_ppo" in s


def test_target_workers_is_the_fewest_near_the_best():
    rollout_bound = PhaseTimes(generate=2.0, update=1.0)
    assert target_workers(rollout_bound, 2, min_workers=1, max_workers=4) == 2
    assert target_workers(rollout_bound, 0, min_workers=1, max_workers=4) == 1  # η = 0: one ticket at a time
    learner_bound = PhaseTimes(generate=0.5, update=1.0)
    assert target_workers(learner_bound, 2, min_workers=1, max_workers=4) == 1
    assert target_workers(learner_bound, 2, min_workers=2, max_workers=4) == 2
