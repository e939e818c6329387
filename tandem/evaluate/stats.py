"""Statistics of a paired A/B comparison: win/tie/loss, win rate with a bootstrap interval, the exact
two-sided sign test, and the promotion rule a CI/CD pipeline gates on.

Outcomes are per prompt from the candidate B's point of view: +1 B better, 0 tie, −1 A better.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np


@dataclass(frozen=True)
class Decision:
    """Summary of a paired comparison and whether to promote the candidate B over the incumbent A."""

    wins: int
    ties: int
    losses: int
    win_rate: float
    ci_low: float
    ci_high: float
    p_value: float
    alpha: float
    min_win_rate: float
    promote: bool
    reason: str

    def to_json(self) -> dict:
        return asdict(self)


def win_rate(outcomes: np.ndarray) -> float:
    """(wins + ½·ties) / n: the probability that B beats A on a random prompt, ties split evenly."""
    return float(((outcomes > 0).sum() + 0.5 * (outcomes == 0).sum()) / max(1, outcomes.size))


def bootstrap_ci(
    outcomes: np.ndarray, *, level: float = 0.95, resamples: int = 2000, seed: int = 0
) -> tuple[float, float]:
    """Percentile bootstrap interval of :func:`win_rate`, resampling prompts with replacement.
    outcomes ``[N]`` in {−1, 0, 1}; vectorised over resamples: ``[resamples, N]`` index draws."""
    n = outcomes.size
    if n == 0:
        return (float("nan"), float("nan"))
    rng = np.random.default_rng(seed)
    draws = outcomes[rng.integers(0, n, size=(resamples, n))]  # [resamples, N]
    rates = ((draws > 0).sum(axis=1) + 0.5 * (draws == 0).sum(axis=1)) / n  # [resamples]
    tail = (1.0 - level) / 2
    return float(np.quantile(rates, tail)), float(np.quantile(rates, 1 - tail))


def sign_test(wins: int, losses: int) -> float:
    """Exact two-sided sign test p-value: ties dropped, under H0 wins ~ Binomial(wins + losses, ½).
    p = min(1, 2·P(X ≥ max(wins, losses)))."""
    n = wins + losses
    if n == 0:
        return 1.0
    k = max(wins, losses)
    tail = sum(math.comb(n, i) for i in range(k, n + 1)) / 2**n
    return min(1.0, 2.0 * tail)


def decide(
    outcomes: np.ndarray | list[int],
    *,
    alpha: float = 0.05,
    min_win_rate: float = 0.5,
    resamples: int = 2000,
    seed: int = 0,
) -> Decision:
    """Promote B iff it wins more prompts than it loses, the sign test rejects "no difference" at
    ``alpha``, and the win rate is at least ``min_win_rate``."""
    o = np.asarray(outcomes, dtype=np.int64)
    wins, ties, losses = int((o > 0).sum()), int((o == 0).sum()), int((o < 0).sum())
    rate = win_rate(o)
    low, high = bootstrap_ci(o, resamples=resamples, seed=seed)
    p = sign_test(wins, losses)
    if wins <= losses:
        promote, reason = False, f"B does not win more often than A ({wins} wins, {losses} losses)"
    elif p >= alpha:
        promote, reason = False, f"difference not significant (p={p:.3g} ≥ alpha={alpha})"
    elif rate < min_win_rate:
        promote, reason = False, f"win rate {rate:.3f} below --min-win-rate {min_win_rate}"
    else:
        promote, reason = True, f"B better: win rate {rate:.3f}, p={p:.3g} < alpha={alpha}"
    return Decision(wins, ties, losses, rate, low, high, p, alpha, min_win_rate, promote, reason)
