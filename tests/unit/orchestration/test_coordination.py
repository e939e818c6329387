"""Admission rules (AdmissionState) and the multiprocessing Coordination that guards them with a lock.

The Ray coordinator runs the same scenario in ``tests/unit/channels/test_ray_channel.py``."""

from __future__ import annotations

import multiprocessing as mp

from tandem.orchestration.decoupled.coordination import (
    RETIRED,
    WAIT,
    AdmissionState,
    Coordination,
    wait_for_ticket,
)
from tandem.orchestration.staleness import StalenessController


def test_admission_state_rules():
    st = AdmissionState.in_memory(StalenessController(eta=1))
    assert [st.try_acquire(0), st.try_acquire(1)] == [0, 1]  # η = 1: tickets 0 and 1 may start
    assert st.try_acquire(2) == WAIT and st.issued == 2
    assert st.try_acquire(0) == 0  # slot 0 still holds ticket 0 (its process died): the same ticket again
    st.done(0)
    assert st.try_acquire(0) == WAIT
    st.consume(1)
    assert st.try_acquire(0) == 2 and st.consumed == 1
    st.retire(3)
    assert st.try_acquire(3) == RETIRED and st.retired(3)
    st.reassign(1, 3)  # a retired slot's unfinished ticket moves to another slot
    assert st.orphaned(1) == -1 and st.orphaned(3) == 1
    st.set_counters(issued=10, consumed=9)
    assert (st.issued, st.consumed) == (10, 9)


def test_wait_for_ticket_polls_until_admitted_and_honours_alive():
    answers = iter([WAIT, WAIT, 7])
    assert wait_for_ticket(lambda: next(answers), alive=lambda: True, poll_s=0) == 7
    assert wait_for_ticket(lambda: WAIT, alive=lambda: False, poll_s=0) is None  # learner gone
    assert wait_for_ticket(lambda: RETIRED, alive=lambda: True, poll_s=0) is None


def admission_scenario(coord) -> None:
    """The public Coordination interface, as workers and the learner use it (η = 0)."""
    assert coord.acquire(0) == 0
    assert coord.orphaned(0) == 0
    coord.done(0)
    assert coord.orphaned(0) == -1 and coord.issued == 1
    assert coord.acquire(1, alive=lambda: False) is None  # bound reached and the learner is gone
    coord.consume(1)
    assert coord.acquire(1) == 1 and coord.consumed == 1
    coord.retire(1)
    assert coord.retired(1) and coord.acquire(1) == 1  # its unfinished ticket first
    coord.reassign(1, 2)
    assert coord.orphaned(2) == 1 and coord.acquire(1) is None  # retired, nothing in flight
    coord.retire(1, False)
    assert not coord.retired(1)
    coord.set_counters(issued=5, consumed=5)
    assert (coord.issued, coord.consumed) == (5, 5)
    assert not coord.stop.is_set()
    coord.shutdown()
    assert coord.stop.is_set() and coord.acquire(3) is None


def test_multiprocessing_coordination():
    admission_scenario(Coordination(mp.get_context("spawn"), StalenessController(eta=0)))
