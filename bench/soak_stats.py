"""Helpers for `bench/soak.py`: process sampling from /proc and the growth fit.

Kept apart from the driver so the arithmetic can be unit-tested without starting anything
(tests/unit/test_bench_soak_stats.py). Linux only: RSS and file descriptors are read from /proc.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")


@dataclass(frozen=True)
class Sample:
    """One reading of a process tree: seconds since the soak began, RSS in MiB, open fds, processes."""

    t: float
    rss_mb: float
    fds: int
    procs: int


def fit_slope(xs: list[float], ys: list[float]) -> float:
    """Least-squares slope of ``ys`` on ``xs`` (ordinary linear regression, one predictor).

    slope = Σ (x - x̄)(y - ȳ) / Σ (x - x̄)²; 0.0 with fewer than two distinct x (nothing to fit).
    """
    if len(xs) != len(ys):
        raise ValueError(f"fit_slope: {len(xs)} xs but {len(ys)} ys")
    n = len(xs)
    if n < 2:
        return 0.0
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        return 0.0
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx


def slope_stderr(xs: list[float], ys: list[float]) -> float:
    """Standard error of :func:`fit_slope`: sqrt(Σ residual² / (n − 2) / Σ (x − x̄)²); 0.0 below 3 points.

    It treats the samples as independent, which memory readings a few seconds apart are not, so read it
    as a lower bound on the uncertainty: a slope within about two of these of zero is noise.
    """
    n = len(xs)
    if n < 3 or len(ys) != n:
        return 0.0
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        return 0.0
    b = fit_slope(xs, ys)
    ssr = sum((y - my - b * (x - mx)) ** 2 for x, y in zip(xs, ys, strict=True))
    return (ssr / (n - 2) / sxx) ** 0.5


def after_warmup(samples: list[Sample], warmup_fraction: float) -> list[Sample]:
    """The samples taken after the first ``warmup_fraction`` of the sampled time span.

    Start-up (model load, allocator arenas, first batches, caches filling) is a step, not a trend; a fit
    over it would report a leak that is only warm-up. Falls back to all samples when fewer than three
    remain, so a short run still gets a (noisy) figure.
    """
    if not samples:
        return []
    t0, t1 = samples[0].t, samples[-1].t
    cut = t0 + warmup_fraction * (t1 - t0)
    kept = [s for s in samples if s.t >= cut]
    return kept if len(kept) >= 3 else list(samples)


def summarise(samples: list[Sample], warmup_fraction: float = 0.1) -> dict:
    """Start/end/max RSS and fds, and their fitted growth per hour after the warm-up window."""
    if not samples:
        return {"samples": 0}
    fit = after_warmup(samples, warmup_fraction)
    hours = [s.t / 3600 for s in fit]
    return {
        "samples": len(samples),
        "fit_samples": len(fit),
        "duration_s": samples[-1].t - samples[0].t,
        "rss_start_mb": samples[0].rss_mb,
        "rss_warm_mb": fit[0].rss_mb,
        "rss_end_mb": samples[-1].rss_mb,
        "rss_max_mb": max(s.rss_mb for s in samples),
        "rss_growth_mb_per_h": fit_slope(hours, [s.rss_mb for s in fit]),
        "rss_growth_stderr": slope_stderr(hours, [s.rss_mb for s in fit]),
        "fd_start": samples[0].fds,
        "fd_end": samples[-1].fds,
        "fd_max": max(s.fds for s in samples),
        "fd_growth_per_h": fit_slope(hours, [float(s.fds) for s in fit]),
        "procs_max": max(s.procs for s in samples),
    }


def _children(pid: int) -> list[int]:
    """Direct children of ``pid`` (from /proc/PID/task/*/children, which the kernel keeps per thread)."""
    out: list[int] = []
    try:
        for task in (PROC / str(pid) / "task").iterdir():
            try:
                out += [int(c) for c in (task / "children").read_text().split()]
            except OSError:
                continue
    except OSError:
        return []
    return out


def process_tree(pid: int) -> list[int]:
    """``pid`` and all its descendants that are alive now."""
    seen, todo = [], [pid]
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.append(p)
        todo += _children(p)
    return seen


def rss_mb(pid: int) -> float | None:
    """Resident set size of one process in MiB (VmRSS), or None if it is gone or exiting.

    A zombie (exited, not yet reaped) has no VmRSS line and an emptied fd table: a reading of it would
    look like a 500 MB drop at the end of the series, so it counts as gone.
    """
    try:
        for line in (PROC / str(pid) / "status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def fd_count(pid: int) -> int | None:
    """Open file descriptors of one process, or None if it is gone."""
    try:
        return len(os.listdir(PROC / str(pid) / "fd"))
    except OSError:
        return None


def sample_tree(pid: int, t: float) -> Sample | None:
    """RSS and fds summed over ``pid`` and its descendants; None once ``pid`` itself is gone."""
    root_rss = rss_mb(pid)
    root_fds = fd_count(pid)
    if root_rss is None or root_fds is None:
        return None
    rss, fds, procs = root_rss, root_fds, 1
    for child in process_tree(pid)[1:]:
        child_rss, child_fds = rss_mb(child), fd_count(child)
        if child_rss is None or child_fds is None:
            continue
        rss, fds, procs = rss + child_rss, fds + child_fds, procs + 1
    return Sample(t=t, rss_mb=rss, fds=fds, procs=procs)
