"""Shared settings for the algorithm tests: small, deterministic hypothesis runs."""

from __future__ import annotations

from hypothesis import HealthCheck, settings

settings.register_profile(
    "algos", max_examples=25, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile("algos")
