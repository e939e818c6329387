"""PromptSampler: epoch coverage, per-epoch reshuffle, determinism and exact resume."""

from __future__ import annotations

import re
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tandem.data import PromptDataset, PromptSampler
from tandem.errors import ConfigError, DataError


def dataset(n: int) -> PromptDataset:
    return PromptDataset.from_rows([{"prompt": f"p{i}", "i": i} for i in range(n)], source="mem")


def test_every_row_once_per_epoch_and_reshuffled():
    sampler = PromptSampler(dataset(12), batch_size=4, seed=3)
    epoch0 = [r["i"] for _ in range(3) for r in sampler.next_batch()]
    epoch1 = [r["i"] for _ in range(3) for r in sampler.next_batch()]
    assert sorted(epoch0) == sorted(epoch1) == list(range(12))
    assert epoch0 != epoch1
    assert (sampler.epoch, sampler.position) == (2, 0)
    assert epoch0 == sampler.epoch_order(0) and epoch1 == sampler.epoch_order(1)


def test_batches_straddle_epochs_and_keep_their_size():
    sampler = PromptSampler(dataset(5), batch_size=3, seed=0)
    drawn = [sampler.next_indices() for _ in range(5)]
    assert all(len(b) == 3 for b in drawn)
    flat = [i for b in drawn for i in b]
    assert flat == sampler.epoch_order(0) + sampler.epoch_order(1) + sampler.epoch_order(2)
    assert (sampler.epoch, sampler.position) == (3, 0)


def test_batch_larger_than_dataset():
    sampler = PromptSampler(dataset(2), batch_size=5, seed=1)
    got = sampler.next_indices()
    assert got == sampler.epoch_order(0) + sampler.epoch_order(1) + sampler.epoch_order(2)[:1]
    assert sorted(Counter(got).values()) == [2, 3] and (sampler.epoch, sampler.position) == (2, 1)


def test_same_seed_same_stream_other_seed_differs():
    a, b, c = (PromptSampler(dataset(50), batch_size=8, seed=s) for s in (7, 7, 8))
    stream_a = [a.next_indices() for _ in range(10)]
    assert stream_a == [b.next_indices() for _ in range(10)]
    assert stream_a != [c.next_indices() for _ in range(10)]


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 30), batch_size=st.integers(1, 12), k=st.integers(0, 15), seed=st.integers(0, 2**31))
def test_resume_from_state_dict_is_exact(n, batch_size, k, seed):
    ds = dataset(n)
    reference = PromptSampler(ds, batch_size, seed)
    stream = [reference.next_indices() for _ in range(k + 6)]
    first = PromptSampler(ds, batch_size, seed)
    for _ in range(k):
        first.next_indices()
    state = first.state_dict()
    resumed = PromptSampler(ds, batch_size, seed)
    resumed.load_state_dict(dict(state))
    assert [resumed.next_indices() for _ in range(6)] == stream[k:]
    assert resumed.state_dict() == reference.state_dict()


def test_iteration_yields_batches():
    sampler = PromptSampler(dataset(4), batch_size=2, seed=0)
    batches = iter(sampler)
    assert len(next(batches)) == 2 and len(next(batches)) == 2 and sampler.epoch == 1


@pytest.mark.parametrize("batch_size", [0, -1, 1.5, True])
def test_bad_batch_size(batch_size):
    with pytest.raises(ConfigError, match="batch size must be a positive integer"):
        PromptSampler(dataset(3), batch_size=batch_size, seed=0)


def test_load_state_dict_rejects_mismatches():
    state = PromptSampler(dataset(10), 4, seed=1).state_dict()
    with pytest.raises(
        DataError, match=re.escape("mem: checkpoint data position is for 10 rows, this dataset has 9")
    ):
        PromptSampler(dataset(9), 4, seed=1).load_state_dict(state)
    with pytest.raises(ConfigError, match="checkpoint data seed 1 differs from this run's seed 2"):
        PromptSampler(dataset(10), 4, seed=2).load_state_dict(state)
    with pytest.raises(DataError, match="lacks position"):
        PromptSampler(dataset(10), 4, seed=1).load_state_dict({"epoch": 0, "seed": 1, "num_rows": 10})
    with pytest.raises(DataError, match="out of range"):
        PromptSampler(dataset(10), 4, seed=1).load_state_dict({**state, "position": 10})
