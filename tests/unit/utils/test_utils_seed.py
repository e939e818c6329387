"""Seeding and RNG snapshot/restore cover random, numpy and torch (and CUDA where present)."""

from __future__ import annotations

import io
import random

import numpy as np
import pytest
import torch

from tandem.utils.seed import rng_state, seed_everything, set_rng_state


def _draw() -> tuple[float, float, list[float]]:
    return random.random(), float(np.random.rand()), torch.rand(3).tolist()


def test_seed_everything_is_reproducible_and_seed_dependent() -> None:
    seed_everything(123)
    first = _draw()
    seed_everything(123)
    assert _draw() == first
    seed_everything(124)
    other = _draw()
    assert all(a != b for a, b in zip(first, other, strict=True))


@pytest.mark.parametrize("bad", [-1, 2**32, 1.5, True, "3"])
def test_seed_everything_rejects_invalid_seed(bad: object) -> None:
    with pytest.raises(ValueError, match="seed"):
        seed_everything(bad)  # type: ignore[arg-type]


def test_rng_state_round_trip_through_weights_only_load() -> None:
    seed_everything(7)
    np.random.randn()  # leave numpy with a cached gaussian so has_gauss/gauss are exercised
    buffer = io.BytesIO()
    torch.save(rng_state(), buffer)
    expected = [_draw(), (np.random.randn(), random.gauss(0, 1))]
    _draw()  # move every generator on
    buffer.seek(0)
    set_rng_state(torch.load(buffer, weights_only=True))
    assert [_draw(), (np.random.randn(), random.gauss(0, 1))] == expected


def test_set_rng_state_ignores_missing_entries() -> None:
    seed_everything(1)
    state = rng_state()
    expected_torch = torch.rand(2)
    seed_everything(2)
    python_next = random.random()
    seed_everything(2)
    set_rng_state({"torch": state["torch"]})
    assert torch.equal(torch.rand(2), expected_torch)
    assert random.random() == python_next  # python generator untouched


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_rng_round_trip() -> None:
    seed_everything(5)
    state = rng_state()
    assert len(state["cuda"]) == torch.cuda.device_count()
    expected = torch.rand(4, device="cuda")
    torch.rand(4, device="cuda")
    set_rng_state(state)
    assert torch.equal(torch.rand(4, device="cuda"), expected)
