"""A/B statistics: sign test against the binomial distribution, bootstrap interval, decision rule."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tandem.evaluate.stats import bootstrap_ci, decide, sign_test, win_rate


def brute_sign_test(wins: int, losses: int) -> float:
    """Two-sided exact binomial test by enumerating every outcome as likely or less likely."""
    n = wins + losses
    if n == 0:
        return 1.0
    probs = [math.comb(n, i) / 2**n for i in range(n + 1)]
    observed = probs[wins]
    return min(1.0, sum(p for p in probs if p <= observed * (1 + 1e-12)))


@given(st.integers(0, 40), st.integers(0, 40))
@settings(max_examples=200, deadline=None)
def test_sign_test_matches_binomial_enumeration(wins, losses):
    assert sign_test(wins, losses) == pytest.approx(brute_sign_test(wins, losses), rel=1e-9)
    assert sign_test(wins, losses) == sign_test(losses, wins)


def test_sign_test_known_values():
    assert sign_test(10, 0) == pytest.approx(2 / 1024)
    assert sign_test(0, 0) == 1.0
    assert sign_test(5, 5) == 1.0


def test_win_rate_counts_ties_half():
    assert win_rate(np.array([1, 1, 0, -1])) == pytest.approx(0.625)


def test_bootstrap_interval_contains_rate_and_narrows_with_n():
    rng = np.random.default_rng(0)
    small = rng.choice([-1, 0, 1], size=40, p=[0.3, 0.2, 0.5])
    big = rng.choice([-1, 0, 1], size=4000, p=[0.3, 0.2, 0.5])
    lo_s, hi_s = bootstrap_ci(small, seed=1)
    lo_b, hi_b = bootstrap_ci(big, seed=1)
    assert lo_s <= win_rate(small) <= hi_s and lo_b <= win_rate(big) <= hi_b
    assert hi_b - lo_b < (hi_s - lo_s) / 4
    assert lo_b < 0.6 < hi_b  # true win rate 0.5 + 0.1


def test_bootstrap_coverage_is_about_95_percent():
    rng = np.random.default_rng(3)
    covered = 0
    for _ in range(200):
        o = rng.choice([-1, 0, 1], size=200, p=[0.25, 0.25, 0.5])
        lo, hi = bootstrap_ci(o, resamples=500, seed=int(rng.integers(1 << 30)))
        covered += lo <= 0.625 <= hi
    assert 0.88 <= covered / 200 <= 0.99


def test_decision_rule():
    clear = decide([1] * 20 + [0] * 5 + [-1] * 2)
    assert (
        clear.promote and clear.p_value < 0.05 and clear.wins == 20 and clear.ties == 5 and clear.losses == 2
    )
    assert not decide([1] * 20 + [-1] * 2, alpha=1e-6).promote  # not significant at that alpha
    assert not decide([1] * 20 + [-1] * 2, min_win_rate=0.95).promote  # rate 0.909 < 0.95
    worse = decide([-1] * 20 + [1] * 2)
    assert not worse.promote and "does not win" in worse.reason
    assert decide([0] * 30).p_value == 1.0 and not decide([0] * 30).promote
