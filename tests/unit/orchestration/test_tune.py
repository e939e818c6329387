"""Successive halving (``tandem tune``): the rung plan fits the budget; promotion follows the metric."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tandem.errors import ConfigError
from tandem.orchestration.tune import grid, plan_rungs, successive_halving


def test_grid_is_every_combination_in_order() -> None:
    assert grid({"a": ["1", "2"], "b": ["x"]}) == [["a=1", "b=x"], ["a=2", "b=x"]]


@given(
    st.integers(1, 12),
    st.integers(1, 300),
    st.integers(1, 5000),
    st.integers(2, 4),
    st.integers(1, 5),
    st.integers(0, 1),
)
def test_plan_fits_the_budget_and_halves(
    n: int, max_steps: int, budget: int, eta: int, min_steps: int, reserve: int
) -> None:
    try:
        rungs = plan_rungs(n, max_steps, budget, eta, min_steps, reserve)
    except ConfigError as exc:  # only when no plan fits: the message gives the cheapest one's cost
        assert int(str(exc).split("needs ")[1].split()[0]) > budget
        return
    spent = sum(k * s for k, s in rungs) + reserve * rungs[-1][1]  # the plan and the held-back runs
    assert spent <= budget
    assert rungs[0][0] == n and rungs[-1][0] == 1
    for (k0, s0), (k1, s1) in zip(rungs, rungs[1:], strict=False):
        assert k1 == -(-k0 // eta) and s0 <= s1
    top = rungs[-1][1]
    assert top <= max_steps
    if top < max_steps:  # the longest plan that fits: one more step on the last rung would not
        longer = [
            min(top + 1, max(min_steps, (top + 1) // eta ** (len(rungs) - 1 - i))) for i in range(len(rungs))
        ]
        assert sum(k * s for (k, _), s in zip(rungs, longer, strict=True)) + reserve * longer[-1] > budget


def test_plan_example_and_too_small_budget() -> None:
    assert plan_rungs(6, 100, 600, eta=2) == [(6, 12), (3, 25), (2, 50), (1, 100)]
    assert plan_rungs(6, 100, 150, eta=2) == [(6, 5), (3, 10), (2, 21), (1, 43)]
    # budget held back for one more run of the final length (the confirmation): 347 + 100 <= 447
    assert plan_rungs(6, 100, 447, eta=2, reserve=1) == [(6, 12), (3, 25), (2, 50), (1, 100)]
    assert plan_rungs(6, 100, 446, eta=2, reserve=1)[-1][1] < 100
    with pytest.raises(
        ConfigError, match="--budget 5 is too small for 6 candidates: the smallest plan needs 12"
    ):
        plan_rungs(6, 100, 5)


def test_halving_promotes_the_best_and_stops_the_rest_early() -> None:
    quality = {"lr=1": 0.2, "lr=2": 0.9, "lr=3": 0.5, "lr=4": None}  # None: a run without an eval
    calls: list[tuple[str, int]] = []

    def run(overrides: list[str], steps: int) -> float | None:
        calls.append((overrides[0], steps))
        q = quality[overrides[0]]
        return None if q is None else q + steps / 1000

    winner, trials = successive_halving([[k] for k in quality], [(4, 10), (2, 20), (1, 40)], run)
    assert calls == [
        ("lr=1", 10),
        ("lr=2", 10),
        ("lr=3", 10),
        ("lr=4", 10),
        ("lr=2", 20),
        ("lr=3", 20),
        ("lr=2", 40),
    ]
    assert winner.overrides == ["lr=2"] and winner.scores == pytest.approx({10: 0.91, 20: 0.92, 40: 0.94})
    assert trials[3].scores == {10: None}  # ranked last, never promoted
