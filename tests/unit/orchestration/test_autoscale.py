"""The elastic-scaling policy: patience, cooldown, bounds, and no scale-up when η (not speed) limits."""

from __future__ import annotations

from tandem.config.schema import AutoscaleConfig
from tandem.orchestration.decoupled.autoscale import Autoscaler

STARVED = {"learner_idle": 0.8, "rollout_idle": 0.0, "waiting": 0}
FULL = {"learner_idle": 0.0, "rollout_idle": 0.0, "waiting": 3}
BALANCED = {"learner_idle": 0.1, "rollout_idle": 0.1, "waiting": 1}


def _policy(**kw) -> Autoscaler:
    base = {"enabled": True, "min_workers": 1, "max_workers": 3, "patience": 2, "cooldown": 1}
    return Autoscaler(AutoscaleConfig(**{**base, **kw}))


def test_scales_up_after_patience_then_cools_down():
    p = _policy()
    assert p.decide(**STARVED, workers=1) == 0  # 1 of 2 starved steps
    assert p.decide(**STARVED, workers=1) == 1
    assert p.decide(**STARVED, workers=2) == 0  # cooldown
    assert p.decide(**STARVED, workers=2) == 0  # patience restarts after an action
    assert p.decide(**STARVED, workers=2) == 1


def test_never_beyond_max_or_below_min():
    p = _policy(cooldown=0, patience=1)
    assert p.decide(**STARVED, workers=3) == 0
    assert p.decide(**FULL, workers=1) == 0
    assert p.decide(**FULL, workers=2) == -1


def test_a_balanced_run_is_left_alone_and_streaks_reset():
    p = _policy(cooldown=0)
    for _ in range(5):
        assert p.decide(**BALANCED, workers=2) == 0
    assert p.decide(**STARVED, workers=2) == 0
    assert p.decide(**BALANCED, workers=2) == 0  # the streak is broken
    assert p.decide(**STARVED, workers=2) == 0


def test_idle_workers_held_back_by_staleness_do_not_trigger_scale_up():
    """The learner waits, but so do the workers (η admits no batch): another worker would not help."""
    p = _policy(patience=1, cooldown=0)
    assert p.decide(learner_idle=0.9, rollout_idle=0.9, waiting=0, workers=1) == 0


def test_restores_the_minimum():
    p = _policy(min_workers=2, patience=1, cooldown=0)
    assert p.decide(**BALANCED, workers=1) == 1
