"""Prompt encoding shared by every engine: the same token ids for the same prompts, whatever samples them.

Engines must agree on the prompt tokens (special tokens, length limit), or the trainer's recomputed
log-probs, the reference model and the engines' parity tests would all see different inputs.
"""

from __future__ import annotations

from typing import Any

import torch

from tandem.errors import DataError


def encode_prompts(
    tokenizer: Any, prompts: list[str], *, add_special_tokens: bool, max_prompt_len: int | None
) -> list[list[int]]:
    """Token ids of every prompt; DataError naming the prompt for an empty or too long one."""
    if not prompts:
        raise DataError("no prompts to generate from", where="prompts")
    encoded = tokenizer(list(prompts), add_special_tokens=add_special_tokens)["input_ids"]
    for i, ids in enumerate(encoded):
        if not ids:
            raise DataError(f"prompt {i} is empty", where=f"prompts[{i}]")
        if max_prompt_len is not None and len(ids) > max_prompt_len:
            raise DataError(
                f"prompt {i} has {len(ids)} tokens, more than max_prompt_len={max_prompt_len}",
                where=f"prompts[{i}]",
                hint="shorten the prompt or raise data.max_prompt_len",
            )
    return [list(ids) for ids in encoded]


def left_pad(encoded: list[list[int]], pad_token_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded ids ``[N, P]`` long and mask ``[N, P]`` bool (True on real tokens)."""
    P = max(len(ids) for ids in encoded)
    prompt_ids = torch.full((len(encoded), P), pad_token_id, dtype=torch.long)
    prompt_mask = torch.zeros((len(encoded), P), dtype=torch.bool)
    for i, ids in enumerate(encoded):
        prompt_ids[i, P - len(ids) :] = torch.tensor(ids, dtype=torch.long)
        prompt_mask[i, P - len(ids) :] = True
    return prompt_ids, prompt_mask
