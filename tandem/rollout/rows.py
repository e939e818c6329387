"""Per-prompt sampling parameters for one engine call: expansion to rows, sampling, limits, stop strings.

``HFEngine.generate`` takes one :class:`~tandem.rollout.base.SamplingParams` for the whole batch (what
training uses; one RNG stream for the batch) or one per prompt. For the latter, :class:`RowSampling`
samples every row with its prompt's temperature, top-k, top-p, min-p and repetition penalty: rows sharing
those settings are drawn
together from the global RNG, and a seeded prompt's rows from their own generator, so a seeded prompt's
output does not depend on the other prompts in the call. Each row stops at its own ``max_new_tokens``
and its own stop strings.

Naive equivalent: one ``generate`` call per prompt — the same draws for seeded and greedy prompts,
``len(prompts)`` times the forward passes.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from tandem.errors import DataError
from tandem.rollout.base import SamplingParams
from tandem.rollout.sampling import sample_next


def per_prompt(params: SamplingParams | Sequence[SamplingParams], num_prompts: int) -> list[SamplingParams]:
    """One :class:`SamplingParams` per prompt (``params`` repeated when it is a single one)."""
    if isinstance(params, SamplingParams):
        return [params] * num_prompts
    rows = list(params)
    if len(rows) != num_prompts:
        raise DataError(f"got {len(rows)} sampling params for {num_prompts} prompts", where="params")
    if not all(isinstance(p, SamplingParams) for p in rows):
        raise DataError("params must be SamplingParams (one, or one per prompt)", where="params")
    return rows


class RowSampling:
    """Samples the next token of every row with its prompt's parameters: ``[B, V]`` -> ``([B], [B])``.

    ``row_params[i]`` and ``row_prompt[i]`` are row ``i``'s parameters and prompt index."""

    def __init__(self, row_params: list[SamplingParams], row_prompt: list[int], device: torch.device) -> None:
        groups: dict[tuple, list[int]] = {}
        for row, (p, prompt) in enumerate(zip(row_params, row_prompt, strict=True)):
            settings = (p.temperature, p.top_k, p.top_p, p.min_p, p.repetition_penalty)
            key = ("seed", prompt) if p.seed is not None and not p.greedy else settings
            groups.setdefault(key, []).append(row)
        self.groups: list[tuple[torch.Tensor, SamplingParams, torch.Generator | None]] = []
        for rows in groups.values():
            p = row_params[rows[0]]
            gen = None
            if p.seed is not None and not p.greedy:
                gen = torch.Generator(device=device).manual_seed(p.seed)
            self.groups.append((torch.tensor(rows, device=device), p, gen))
        self.order = torch.cat([rows for rows, _, _ in self.groups])  # [B]
        self.penalised = any(p.penalised for p in row_params)  # the decode loop tracks seen tokens

    def __call__(
        self, logits: torch.Tensor, seen: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``seen``: ``[B, V]`` bool, each row's prompt and response tokens (with ``penalised``)."""
        parts = [
            sample_next(logits[rows], p, gen, None if seen is None else seen[rows])
            for rows, p, gen in self.groups
        ]
        tokens = torch.empty(logits.shape[0], dtype=torch.long, device=logits.device)
        logprobs = torch.empty(logits.shape[0], dtype=torch.float32, device=logits.device)
        tokens[self.order] = torch.cat([t for t, _ in parts])  # one scatter for all groups
        logprobs[self.order] = torch.cat([lp for _, lp in parts])
        return tokens, logprobs
