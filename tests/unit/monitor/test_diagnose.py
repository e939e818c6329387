"""``tandem.monitor.diagnose``: each finding fires on metric rows built to show it, and only then."""

from __future__ import annotations

import math

import pytest

from tandem.monitor.diagnose import diagnose, noise


def _run(evals, steps=50, **series):
    """Metric rows: ``evals`` {step: accuracy} (step 0 = before training), and per-step metrics given as
    (first value, last value) pairs interpolated linearly over ``steps`` steps."""
    rows = [{"step": 0, "eval/accuracy": evals[0]}] if 0 in evals else []
    for s in range(1, steps + 1):
        row = {"step": s}
        for key, (a, b) in series.items():
            row[key] = a + (b - a) * (s - 1) / (steps - 1)
        if s in evals:
            row["eval/accuracy"] = evals[s]
        rows.append(row)
    return rows


def codes(findings):
    return [f.code for f in findings]


HEALTHY = {"groups/all_equal_frac": (0.3, 0.3), "reward/mean": (0.3, 0.35), "actor/entropy": (1.0, 0.9)}


def test_learned_and_degraded():
    got = diagnose(_run({0: 0.30, 25: 0.70, 50: 0.68}, **HEALTHY), eval_size=300)
    assert codes(got) == ["learned"] and "best 70.0% at step 25" in got[0].message
    got = diagnose(_run({0: 0.30, 25: 0.70, 50: 0.55}, **HEALTHY), eval_size=300)
    assert codes(got) == ["learned", "degraded"] and "checkpoint.best_metric" in got[1].hint


def test_flat_with_all_fail_groups_points_at_difficulty():
    rows = _run(
        {0: 0.05, 50: 0.06},
        **{
            "groups/all_equal_frac": (0.9, 0.85),
            "groups/all_equal_low_frac": (0.9, 0.85),
            "groups/all_equal_high_frac": (0.0, 0.0),
            "reward/mean": (0.01, 0.01),
            "actor/entropy": (1.0, 1.0),
        },
    )
    got = diagnose(rows, eval_size=300)
    assert codes(got) == ["flat", "no_signal"]
    assert (
        "too hard" in got[1].hint and "adaptive_group" in got[1].hint and "reference_answers" in got[1].hint
    )


def test_flat_with_all_pass_groups_points_at_easy_prompts():
    rows = _run(
        {0: 0.40, 50: 0.41},
        **{
            "groups/all_equal_frac": (0.8, 0.8),
            "groups/all_equal_low_frac": (0.1, 0.1),
            "groups/all_equal_high_frac": (0.7, 0.7),
            "reward/mean": (0.9, 0.9),
        },
    )
    assert "too easy" in diagnose(rows, eval_size=300)[1].hint


def test_train_reward_up_held_out_flat_is_train_only():
    rows = _run(
        {0: 0.40, 25: 0.41, 50: 0.40},
        **{
            **HEALTHY,
            "reward/mean": (0.3, 0.8),
            "reward/std": (0.3, 0.3),
            "prompts/seen_before_mean": (0, 9.0),
        },
    )
    got = diagnose(rows, eval_size=300)
    assert codes(got) == ["flat", "train_only"] and "9.0 times" in got[1].message


def test_entropy_collapse_replaces_no_update():
    rows = _run({0: 0.40, 50: 0.40}, **{**HEALTHY, "actor/entropy": (1.0, 0.1)})
    assert codes(diagnose(rows, eval_size=300)) == ["flat", "entropy_collapse"]


def test_signal_without_movement_is_no_update():
    got = diagnose(_run({0: 0.40, 50: 0.41}, **HEALTHY), eval_size=300)
    assert codes(got) == ["flat", "no_update"] and "trainer.lr" in got[1].hint


def test_truncation_is_reported_in_any_run_and_without_evaluations():
    rows = _run({}, **{"response/clip_ratio": (0.5, 0.5)})
    assert codes(diagnose(rows)) == ["truncated"]
    assert diagnose([]) == [] and diagnose([{"step": 0, "eval/accuracy": 0.3}]) == []


def test_noise_threshold():
    assert noise(0.5, 100) == pytest.approx(0.1)
    assert noise(0.0, 10_000) == 0.02  # never below two points
    assert noise(0.5, None) == 0.05
    # a 5-point gain is noise on 100 prompts, real on 10,000
    assert codes(diagnose(_run({0: 0.50, 50: 0.55}, **HEALTHY), eval_size=100))[0] == "flat"
    assert codes(diagnose(_run({0: 0.50, 50: 0.55}, **HEALTHY), eval_size=10_000))[0] == "learned"
    assert not math.isnan(noise(1.0, 50))


def test_noise_uses_the_prompts_the_run_evaluated():
    """A run that logged ``eval/num_prompts`` (a whole eval file) is judged on that count, not on the
    configured ``data.eval_size``: +6 points is noise on 100 prompts at 40 % (±9.8), not on 2000 (±2.2)."""
    rows = _run({0: 0.40, 50: 0.46}, **HEALTHY)
    assert codes(diagnose(rows, eval_size=2000)) == ["learned"]
    for r in rows:
        if "eval/accuracy" in r:
            r["eval/num_prompts"] = 100.0
    got = diagnose(rows, eval_size=2000)
    assert codes(got)[0] == "flat" and "on 100 prompts" in got[0].message


CURVE_UP = {0: 0.35, 50: 0.42, 100: 0.46, 150: 0.52, 200: 0.57, 250: 0.61, 300: 0.66}
CURVE_PLATEAU = {0: 0.35, 50: 0.42, 100: 0.46, 150: 0.48, 200: 0.47, 250: 0.49, 300: 0.48}


def test_plateau_with_all_fail_groups_points_at_the_policys_reach():
    """``countdown-mid``'s shape: a gain in the first half, nothing beyond noise after it, and a third of
    the groups still failing every sample at the end."""
    fail = {"groups/all_equal_low_frac": (0.35, 0.35)}
    got = diagnose(_run(CURVE_PLATEAU, steps=300, **HEALTHY, **fail), eval_size=300)
    assert codes(got) == ["learned", "plateau"]
    assert "stopped rising at 48.0% (step 150)" in got[1].message and "after step 150" in got[1].message
    assert "35% of the last steps' groups had no success" in got[1].hint and "adaptive_group" in got[1].hint
    # the same curve with the groups solved: the later steps were not needed
    solved = {"groups/all_equal_low_frac": (0.2, 0.05)}
    got = diagnose(_run(CURVE_PLATEAU, steps=300, **HEALTHY, **solved), eval_size=300)
    assert codes(got) == ["learned", "plateau"] and "fewer trainer.total_steps" in got[1].hint
    # ... while the train reward keeps rising (the recipe on countdown-mid: 0.40 -> 0.50 over the second
    # half, held-out +3.3 points): the training prompts are being fitted
    rising = {**HEALTHY, "reward/mean": (0.3, 0.5), "prompts/seen_before_mean": (0.0, 9.0)}
    got = diagnose(_run(CURVE_PLATEAU, steps=300, **rising, **solved), eval_size=300)
    assert codes(got) == ["learned", "plateau"]
    assert "train reward kept rising" in got[1].hint and "drawn 9.0 times" in got[1].hint


def test_no_plateau_while_still_rising_or_without_enough_evaluations():
    fail = {"groups/all_equal_low_frac": (0.45, 0.35)}
    assert codes(diagnose(_run(CURVE_UP, steps=300, **HEALTHY, **fail), eval_size=300)) == ["learned"]
    few = {k: v for k, v in CURVE_PLATEAU.items() if k in (0, 100, 200, 300)}
    assert codes(diagnose(_run(few, steps=300, **HEALTHY, **fail), eval_size=300)) == ["learned"]
    # a gain just above the noise of the first half's best counts as still rising
    rising = {**CURVE_PLATEAU, 300: 0.48 + noise(0.48, 300) + 0.005}
    assert codes(diagnose(_run(rising, steps=300, **HEALTHY, **fail), eval_size=300)) == ["learned"]
    # a degraded run is reported as such, not as a plateau
    fell = {**CURVE_PLATEAU, 300: 0.38}
    assert codes(diagnose(_run(fell, steps=300, **HEALTHY, **fail), eval_size=300)) == ["learned", "degraded"]
