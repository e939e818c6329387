"""``reward``: the rewards summed into each sample's score (task verifier, functions, model, shaping)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from tandem.config.base import Section


class RewardFunctionConfig(Section):
    path: str = Field(
        ...,
        description="Callable `module:function` or `file.py:function`, TRL signature. Tandem imports "
        "and runs that Python code with your permissions: use only code you trust.",
    )
    weight: float = Field(1.0, description="Weight of this reward in the sum.")
    name: str | None = Field(None, description="Name used in metrics; defaults to the function name.")


class OverlongConfig(Section):
    enabled: bool = Field(False, description="DAPO soft overlong punishment added to the reward.")
    max_len: int | None = Field(None, description="Length L_max; defaults to rollout.max_new_tokens.")
    buffer: int = Field(4, ge=0, description="Buffer L_c: the penalty ramps over the last L_c tokens.")
    factor: float = Field(1.0, ge=0, description="Penalty at and beyond L_max.")


class RewardModelConfig(Section):
    path: str = Field(..., description="Reward-model folder written by `tandem rm` (HF sequence classifier).")
    weight: float = Field(1.0, description="Weight of the reward model's (normalised) score in the sum.")
    normalize: Literal["none", "fixed", "running"] = Field(
        "running",
        description="Score normalisation: running mean/std, fixed (mean/std below or from tandem_reward.json), none.",
    )
    mean: float | None = Field(
        None, description="fixed: mean to subtract (default: from tandem_reward.json)."
    )
    std: float | None = Field(
        None, gt=0, description="fixed: std to divide by (default: from tandem_reward.json)."
    )
    clip: float | None = Field(None, gt=0, description="Clip normalised scores to [-clip, clip].")
    batch_size: int = Field(64, ge=1, description="Completions scored per forward pass.")


class RewardConfig(Section):
    model: RewardModelConfig | None = Field(None, description="A learned reward model used as a reward.")
    task_reward: bool = Field(True, description="Use the built-in task's verifier as a reward (weight 1).")
    functions: list[RewardFunctionConfig] = Field(
        default_factory=list,
        description="Extra reward functions, each {path: 'module:function' or 'file.py:function', weight, "
        "name}. Loading one imports and runs that Python code with your permissions: use only code you trust.",
    )
    format_regex: str | None = Field(
        None, description="If set, add a 0/1 format reward for completions fully matching it."
    )
    format_weight: float = Field(0.1, description="Weight of the format reward.")
    overlong: OverlongConfig = Field(default_factory=OverlongConfig, description="DAPO overlong shaping.")
    on_error: Literal["raise", "skip"] = Field(
        "raise", description="A reward function that raises: fail, or score 0 and count it."
    )
    timeout_s: float | None = Field(
        None,
        gt=0,
        description="Seconds a reward function may take on one batch (null = no limit). One that takes "
        "longer counts as one that raised (on_error: raise fails the run naming it; skip scores the batch 0 "
        "from it); plain functions then run on background threads, so a hung judge cannot stall the run.",
    )
