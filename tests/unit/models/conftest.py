"""Run these tests on one torch thread.

Tiny models are no faster on two threads, and when the other core is busy (parallel test runs, other
jobs) OpenMP spin-waiting makes two-thread matmuls up to ~10x slower (measured: 76 s vs 6.5 s here).
"""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def _one_torch_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
