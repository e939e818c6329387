"""The arithmetic behind bench/soak.py: the least-squares growth fit, the warm-up cut, /proc sampling."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from bench_modules import load

soak_stats = load("soak_stats")
Sample = soak_stats.Sample


def test_fit_slope_recovers_a_line_and_matches_numpy_polyfit():
    import numpy as np

    xs = [0.0, 0.5, 1.0, 2.0, 3.5]
    assert soak_stats.fit_slope(xs, [3 * x + 7 for x in xs]) == pytest.approx(3.0)
    rng = np.random.default_rng(0)
    ys = list(2.5 * np.array(xs) + rng.normal(0, 1, len(xs)))
    assert soak_stats.fit_slope(xs, ys) == pytest.approx(np.polyfit(xs, ys, 1)[0])


def test_slope_stderr_matches_the_textbook_formula_and_is_zero_on_an_exact_line():
    import numpy as np

    xs = [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    assert soak_stats.slope_stderr(xs, [2 * x - 1 for x in xs]) == pytest.approx(0.0, abs=1e-12)
    ys = [0.3, 1.9, 4.4, 5.8, 8.5, 9.7]
    _, cov = np.polyfit(xs, ys, 1, cov="unscaled")
    b, a = np.polyfit(xs, ys, 1)
    ssr = sum((y - (a + b * x)) ** 2 for x, y in zip(xs, ys, strict=True))
    assert soak_stats.slope_stderr(xs, ys) == pytest.approx((cov[0][0] * ssr / (len(xs) - 2)) ** 0.5)
    assert soak_stats.slope_stderr(xs[:2], ys[:2]) == 0.0


def test_fit_slope_degenerate_inputs():
    assert soak_stats.fit_slope([], []) == 0.0
    assert soak_stats.fit_slope([1.0], [5.0]) == 0.0
    assert soak_stats.fit_slope([2.0, 2.0, 2.0], [1.0, 5.0, 9.0]) == 0.0
    with pytest.raises(ValueError, match="2 xs but 3 ys"):
        soak_stats.fit_slope([1.0, 2.0], [1.0, 2.0, 3.0])


def test_summarise_ignores_the_warmup_step_and_reports_growth_per_hour():
    # 400 MB rising to 500 MB in the first 6 minutes (warm-up), then +12 MB/hour for an hour.
    samples = [Sample(t=t, rss_mb=400 + 100 * t / 360, fds=10, procs=1) for t in range(0, 360, 60)]
    samples += [
        Sample(t=t, rss_mb=500 + 12 * (t - 360) / 3600, fds=12, procs=2) for t in range(360, 3961, 60)
    ]
    s = soak_stats.summarise(samples, warmup_fraction=0.1)
    assert s["rss_growth_mb_per_h"] == pytest.approx(12.0)
    assert s["fd_growth_per_h"] == pytest.approx(0.0)
    assert (s["rss_start_mb"], s["rss_max_mb"], s["fd_max"], s["procs_max"]) == (400, 512, 12, 2)
    fitted_all = soak_stats.summarise(samples, warmup_fraction=0.0)["rss_growth_mb_per_h"]
    assert fitted_all > 20  # without the cut the warm-up ramp reads as a leak


def test_after_warmup_keeps_at_least_three_samples():
    samples = [Sample(t=float(t), rss_mb=1.0, fds=1, procs=1) for t in range(4)]
    assert soak_stats.after_warmup(samples, 0.9) == samples
    assert soak_stats.summarise([]) == {"samples": 0}


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs /proc (Linux)")
def test_sample_tree_counts_children_and_returns_none_once_gone():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        me = soak_stats.sample_tree(os.getpid(), 1.0)
        assert me is not None and me.procs >= 2 and me.rss_mb > 0 and me.fds > 0
        assert me.rss_mb >= soak_stats.rss_mb(os.getpid())
    finally:
        child.kill()
        child.wait()
    assert soak_stats.sample_tree(child.pid, 2.0) is None


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs /proc (Linux)")
def test_a_zombie_counts_as_gone():
    import time

    child = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.monotonic() + 30
    while "State:\tZ" not in Path(f"/proc/{child.pid}/status").read_text():  # exited, not reaped
        assert time.monotonic() < deadline
        time.sleep(0.05)
    try:
        assert soak_stats.rss_mb(child.pid) is None
        assert soak_stats.sample_tree(child.pid, 1.0) is None
    finally:
        child.wait()
