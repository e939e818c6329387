"""Data: prompt datasets from files or built-in tasks, and a resumable epoch-shuffled sampler."""

from tandem.data.prompts import (
    PromptDataset,
    check_prompt_lengths,
    load_prompt_dataset,
    rows_from_task,
    validate_prompt,
)
from tandem.data.sampler import PromptSampler

__all__ = [
    "PromptDataset",
    "PromptSampler",
    "check_prompt_lengths",
    "load_prompt_dataset",
    "rows_from_task",
    "validate_prompt",
]
