"""``rollout``: the generation engine and its sampling settings."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from tandem.config.base import Section


class RolloutConfig(Section):
    backend: Literal["hf"] = Field("hf", description="Generation engine.")
    n: int = Field(8, ge=1, description="Samples per prompt (the group size).")
    max_new_tokens: int = Field(32, ge=1, description="Maximum generated tokens per sample.")
    temperature: float = Field(1.0, ge=0, description="Sampling temperature (0 = greedy).")
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling mass.")
    top_k: int = Field(0, ge=0, description="Top-k sampling (0 = off).")
    stop: list[str] = Field(
        default_factory=lambda: ["\n"], description="Stop strings (stripped from completions)."
    )
