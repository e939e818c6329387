"""Reward shaping applied to sequence scores after the reward functions ran."""

from __future__ import annotations

import torch

from tandem.algos.dapo import overlong_penalty
from tandem.errors import ConfigError


def overlong_shaping(lengths: torch.Tensor, max_len: int, buffer: int, factor: float = 1.0) -> torch.Tensor:
    """DAPO's soft overlong penalty for response ``lengths`` ``[B]`` -> ``[B]`` float32 (<= 0), to add to
    the scores. Validates the settings, then delegates to :func:`tandem.algos.dapo.overlong_penalty`."""
    if max_len <= 0:
        raise ConfigError(f"overlong shaping: max_len must be > 0, got {max_len}")
    if not 0 <= buffer <= max_len:
        raise ConfigError(f"overlong shaping: buffer must be in 0..max_len ({max_len}), got {buffer}")
    if factor < 0:
        raise ConfigError(f"overlong shaping: factor must be >= 0, got {factor}")
    return overlong_penalty(lengths, max_len, buffer, factor)
