"""Per-token log-probs (and entropy) of responses under a causal LM, for training and for checks.

The sequence fed to the model is ``cat([prompt_ids, response_ids], 1)``: prompts left padded, responses
right padded (see :mod:`tandem.types`). Position ids are ``cumsum(mask) - 1`` clamped at 0, so a prompt's
first real token is at position 0 whatever its padding — the same positions the rollout engine used,
which keeps recomputed log-probs equal to the engine's behaviour log-probs.
"""

from __future__ import annotations

import inspect

import torch
from transformers import PreTrainedModel

from tandem.algos import entropy_from_logits, selective_log_softmax
from tandem.errors import ModelError


def positions_from_mask(mask: torch.Tensor) -> torch.Tensor:
    """Position ids ``cumsum(mask) - 1`` clamped at 0: left padding does not shift real positions.
    mask ``[B, T]`` bool/int -> ``[B, T]`` long."""
    return (mask.long().cumsum(dim=1) - 1).clamp(min=0)


def accepts_logits_to_keep(model: torch.nn.Module) -> bool:
    """Whether ``model.forward`` can restrict the LM head to the last positions (``logits_to_keep``)."""
    return "logits_to_keep" in inspect.signature(model.forward).parameters


def response_logprobs(
    model: PreTrainedModel,
    prompt_ids: torch.Tensor,  # [B, P] long, left padded
    prompt_mask: torch.Tensor,  # [B, P] bool
    response_ids: torch.Tensor,  # [B, R] long, right padded
    response_mask: torch.Tensor,  # [B, R] bool
    *,
    temperature: float = 1.0,
    micro_batch_size: int | None = None,
    with_entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-prob of every response token under ``softmax(logits / temperature)``: ``[B, R]`` float32, zero
    where ``response_mask`` is False; plus the entropy of that distribution per token if ``with_entropy``.

    Logits for response token ``t`` come from position ``P - 1 + t``. Only the last ``R + 1`` positions go
    through the LM head (``logits_to_keep``) when the model supports it — naive equivalent: full
    ``model(ids).logits[:, P - 1 : P + R - 1]``. Gradients flow (the trainer uses this for the loss); wrap
    the call in ``torch.no_grad()`` for scoring. ``micro_batch_size`` bounds peak memory by running rows
    in chunks; results equal the full-batch call.
    """
    if temperature <= 0:
        raise ModelError(f"temperature must be > 0 to score tokens, got {temperature}", where="temperature")
    B = prompt_ids.shape[0]
    step = micro_batch_size or B
    logprobs, entropies = [], []
    for start in range(0, B, max(step, 1)):
        rows = slice(start, start + step)
        lp, ent = _chunk_logprobs(
            model,
            prompt_ids[rows],
            prompt_mask[rows],
            response_ids[rows],
            response_mask[rows],
            temperature,
            with_entropy,
        )
        logprobs.append(lp)
        entropies.append(ent)
    out_lp = torch.cat(logprobs) if logprobs else torch.zeros(response_ids.shape, dtype=torch.float32)
    out_ent = torch.cat(entropies) if with_entropy and entropies else None
    return out_lp, out_ent


def _chunk_logprobs(
    model: PreTrainedModel,
    prompt_ids: torch.Tensor,  # [b, P]
    prompt_mask: torch.Tensor,  # [b, P]
    response_ids: torch.Tensor,  # [b, R]
    response_mask: torch.Tensor,  # [b, R]
    temperature: float,
    with_entropy: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    R = response_ids.shape[1]
    input_ids = torch.cat([prompt_ids, response_ids], dim=1)  # [b, P+R]
    attention_mask = torch.cat([prompt_mask, response_mask], dim=1).long()  # [b, P+R]
    position_ids = positions_from_mask(attention_mask)  # [b, P+R]
    kwargs = {"input_ids": input_ids, "attention_mask": attention_mask, "position_ids": position_ids}
    if accepts_logits_to_keep(model):
        logits = model(**kwargs, use_cache=False, logits_to_keep=R + 1).logits[:, :-1]  # [b, R, V]
    else:
        logits = model(**kwargs, use_cache=False).logits[:, -R - 1 : -1]  # [b, R, V]
    logits = logits.float() / temperature
    mask = response_mask.to(torch.float32)  # [b, R]
    logprobs = selective_log_softmax(logits, response_ids) * mask  # [b, R]
    entropy = entropy_from_logits(logits) * mask if with_entropy else None  # [b, R]
    return logprobs, entropy
