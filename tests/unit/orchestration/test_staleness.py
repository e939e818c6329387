"""The staleness controller: admission bound, freshness rule, and that together they bound the lag by η."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tandem.orchestration.staleness import LagHistogram, StalenessController


def test_eta0_is_synchronous():
    c = StalenessController(eta=0, batch_size=8)
    assert c.may_start(0, consumed_batches=0)
    assert not c.may_start(1, consumed_batches=0)  # batch 1 waits for the learner to consume batch 0
    assert c.may_start(1, consumed_batches=1)
    assert c.capacity(issued_batches=1, consumed_batches=0) == 0
    assert c.capacity_samples(produced_samples=8, consumed_batches=0) == 0
    assert c.is_fresh(3, 3) and not c.is_fresh(2, 3)


def test_capacity_formula_matches_areal():
    c = StalenessController(eta=2, batch_size=4)
    # (η + c + 1)·B − produced
    assert c.capacity_samples(produced_samples=8, consumed_batches=1) == (2 + 1 + 1) * 4 - 8
    assert c.capacity(issued_batches=2, consumed_batches=1) == 2
    assert c.capacity(issued_batches=9, consumed_batches=1) == 0


def test_invalid_arguments():
    with pytest.raises(ValueError, match="η"):
        StalenessController(eta=-1)
    with pytest.raises(ValueError, match="batch size"):
        StalenessController(eta=0, batch_size=0)


@settings(max_examples=200, deadline=None)
@given(eta=st.integers(0, 4), choices=st.lists(st.booleans(), min_size=1, max_size=60))
def test_admission_plus_in_order_training_never_exceeds_eta(eta, choices):
    """Simulate one worker and one learner interleaving arbitrarily: every trained batch has lag ≤ η and
    no batch is ever dropped (the invariant the runtime relies on)."""
    c = StalenessController(eta=eta)
    issued, version, queue = 0, 0, []  # queue of (ticket, weights version it was generated with)
    for worker_moves in choices:
        if worker_moves and c.may_start(issued, consumed_batches=version):
            queue.append((issued, version))  # the worker loads the newest weights, then generates
            issued += 1
        elif queue:
            _, v = queue.pop(0)
            assert c.is_fresh(v, version), (v, version)
            version += 1
        assert issued - version <= eta + 1


def test_lag_histogram_metrics():
    h = LagHistogram()
    h.add(0, 6)
    h.add(2, 2)
    m = h.metrics()
    assert m["staleness/mean"] == pytest.approx(0.5)
    assert m["staleness/max"] == 2.0
    assert m["staleness/lag_0"] == pytest.approx(0.75) and m["staleness/lag_2"] == pytest.approx(0.25)
    assert LagHistogram().metrics() == {}
    assert h.as_dict() == {"0": 6, "2": 2}
