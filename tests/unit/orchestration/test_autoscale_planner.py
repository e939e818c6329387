"""``architecture.autoscale.target: planner``: the worker count the planner's simulator predicts fastest."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from tandem.config.schema import AutoscaleConfig
from tandem.orchestration.decoupled.autoscale import Autoscaler


def step(generate: float, update: float, *, idle: float = 0.0) -> dict[str, float]:
    """One decoupled step's metrics as the learner logs them."""
    return {
        "timing/generate": generate,
        "timing/reward": 0.0,
        "timing/logprob": 0.0,
        "timing/update": update,
        "timing/weight_sync": 0.0,
        "worker/sync_s": 0.0,
        "timing/step": update / (1 - idle),
        "idle/learner_ratio": idle,
    }


def policy(eta: int = 2, **kw) -> Autoscaler:
    base = {
        "enabled": True,
        "target": "planner",
        "min_workers": 1,
        "max_workers": 4,
        "planner_window": 3,
        "cooldown": 1,
    }
    return Autoscaler(AutoscaleConfig(**{**base, **kw}), staleness=eta)


def feed(p: Autoscaler, metrics: dict[str, float], workers: int, n: int) -> list[int]:
    return [
        p.decide(learner_idle=0, rollout_idle=0, waiting=0, workers=workers, metrics=metrics)
        for _ in range(n)
    ]


def test_rollout_bound_run_scales_up_to_the_planned_count():
    """Generation takes 2× the update: two workers keep the learner busy at η = 2 (a third adds nothing)."""
    p = policy()
    assert feed(p, step(2.0, 1.0, idle=0.5), workers=1, n=3) == [0, 0, 1]
    assert p.last_target == 2
    assert feed(p, step(2.0, 1.0), workers=2, n=4) == [0, 0, 0, 0]  # cooldown, then a fresh window: on target


def test_learner_bound_run_retires_workers_one_at_a_time():
    p = policy()
    assert feed(p, step(0.5, 1.0), workers=3, n=3) == [0, 0, -1]
    assert p.last_target == 1
    assert feed(p, step(0.5, 1.0), workers=2, n=4) == [0, 0, 0, -1]


def test_eta_limits_the_useful_workers():
    """At η = 0 only one ticket is ever admitted: more workers are never planned."""
    p = policy(eta=0)
    assert feed(p, step(3.0, 1.0, idle=0.75), workers=2, n=3) == [0, 0, -1]
    assert p.last_target == 1


def test_signals_remain_the_default_and_the_target_is_checked():
    assert AutoscaleConfig().target == "signals"
    with pytest.raises(ValidationError, match="target"):
        AutoscaleConfig(target="oracle")
    with pytest.raises(ValidationError, match="planner_window"):
        AutoscaleConfig(target="planner", planner_window=1)


class FakeSupervisor:
    def __init__(self, workers: int) -> None:
        self.num_active = workers
        self.added = self.removed = 0

    def add_worker(self) -> int:
        self.added += 1
        return self.num_active

    def remove_worker(self) -> int:
        self.removed += 1
        return 0


def test_the_runtime_hands_the_step_metrics_to_the_planner():
    """The decoupled loop's hook passes each step's metrics; the planner's decision reaches the supervisor."""
    from types import SimpleNamespace

    from tandem.orchestration.decoupled.runtime import _autoscale

    p = policy()
    run = SimpleNamespace(supervisor=FakeSupervisor(1))
    decisions = [_autoscale(run, p, step(2.0, 1.0, idle=0.5)) for _ in range(3)]  # type: ignore[arg-type]
    assert decisions == [0, 0, 1]
    assert run.supervisor.added == 1 and run.supervisor.removed == 0
