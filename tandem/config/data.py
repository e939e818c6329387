"""``data``: where the prompts come from and how many a step samples."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from tandem.config.base import Section


class CurriculumConfig(Section):
    kind: str = Field(
        "uniform",
        description="Prompt curriculum (tandem.algos.CURRICULA): uniform (the seeded data order) or frontier "
        "(skip prompts whose recent groups had all-equal rewards, replay those that did not).",
        json_schema_extra={"registry": "CURRICULA"},
    )
    skip_after: int = Field(
        1, ge=1, description="frontier: skip a prompt after this many consecutive all-equal groups."
    )
    revisit: float = Field(
        0.1, ge=0, le=1, description="frontier: probability that a prompt due to be skipped is drawn anyway."
    )
    replay: float = Field(
        0.25,
        ge=0,
        le=1,
        description="frontier: share of each batch replaying prompts whose latest group had unequal rewards.",
    )
    max_draws: int = Field(
        4, ge=1, description="frontier: candidates looked at per batch, as a multiple of the batch size."
    )


class DataConfig(Section):
    task: str | None = Field(
        None,
        description="Built-in task (arith, countdown, reverse, safety; agents: calculator, guess); or use "
        "train_file.",
    )
    task_options: dict[str, Any] = Field(
        default_factory=dict, description="Options of the built-in task, e.g. {digits: 2}."
    )
    train_file: str | None = Field(None, description="JSONL/Parquet prompt dataset with a `prompt` column.")
    eval_file: str | None = Field(None, description="Held-out JSONL/Parquet prompt dataset.")
    train_size: int = Field(4096, ge=1, description="Number of generated training prompts (built-in tasks).")
    eval_size: int = Field(
        200,
        ge=0,
        description="Held-out prompts drawn from a built-in task's test split (an eval_file is evaluated "
        "whole); 0 disables eval.",
    )
    prompts_per_step: int = Field(8, ge=1, description="Prompts sampled per training step.")
    max_prompt_len: int = Field(128, ge=1, description="Maximum prompt length in tokens.")
    skip_long_prompts: bool = Field(
        False, description="Skip (and count) prompts over max_prompt_len instead of failing."
    )
    curriculum: CurriculumConfig = Field(
        default_factory=CurriculumConfig,
        description="Prompt curriculum: which prompts each step draws (decoupled: workers pick from the "
        "statistics the learner publishes with the weights).",
    )
