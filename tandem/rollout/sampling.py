"""Next-token sampling for the decode loop: temperature, top-k, top-p, min-p, repetition penalty, greedy,
and behaviour log-probs.

The log-prob recorded for a sampled token is taken under ``log_softmax(logits / temperature)`` of the
*untruncated*, unpenalised distribution (raw logits when greedy): that is what the trainer recomputes with
:func:`tandem.models.forward.response_logprobs`, so behaviour and recomputed log-probs agree. The
repetition penalty and the top-k/top-p/min-p filters (applied in that order, as Hugging Face's
``generate`` does) only decide which token is drawn.
"""

from __future__ import annotations

import math

import torch

from tandem.rollout.base import SamplingParams


def filter_top_k(logits: torch.Tensor, k: int) -> torch.Tensor:
    """Set every logit below the ``k``-th largest of its row to ``-inf`` (``k == 0``: no-op).
    logits ``[B, V]`` -> ``[B, V]``."""
    if k <= 0 or k >= logits.shape[-1]:
        return logits
    kth = torch.topk(logits, k, dim=-1).values[:, -1:]  # [B, 1]
    return logits.masked_fill(logits < kth, float("-inf"))


def filter_top_p(logits: torch.Tensor, p: float) -> torch.Tensor:
    """Keep the smallest set of most likely tokens whose probability mass reaches ``p`` (nucleus); the
    most likely token is always kept. ``p >= 1``: no-op. logits ``[B, V]`` -> ``[B, V]``."""
    if p >= 1.0:
        return logits
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)  # [B, V]
    probs = torch.softmax(sorted_logits, dim=-1)
    mass_before = probs.cumsum(dim=-1) - probs  # [B, V] mass of strictly more likely tokens
    drop_sorted = mass_before >= p
    drop_sorted[:, 0] = False
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)  # back to vocab order
    return logits.masked_fill(drop, float("-inf"))


def filter_min_p(logits: torch.Tensor, min_p: float) -> torch.Tensor:
    """Keep the tokens at least ``min_p`` times as likely as the row's most likely one (min-p sampling,
    Nguyen et al. 2024); ``min_p == 0``: no-op. logits ``[B, V]`` -> ``[B, V]``."""
    if min_p <= 0:
        return logits
    top = logits.max(dim=-1, keepdim=True).values  # [B, 1]
    return logits.masked_fill(logits < top + math.log(min_p), float("-inf"))  # p / p_max < min_p


def penalise_repeats(logits: torch.Tensor, seen: torch.Tensor, penalty: float) -> torch.Tensor:
    """The repetition penalty (Keskar et al. 2019, as Hugging Face and vLLM apply it): a logit of a token in
    ``seen`` is divided by ``penalty`` when positive and multiplied by it otherwise. ``penalty == 1``: no-op.
    logits ``[B, V]``, seen ``[B, V]`` bool -> ``[B, V]``."""
    if penalty == 1:
        return logits
    penalised = torch.where(logits > 0, logits / penalty, logits * penalty)
    return torch.where(seen, penalised, logits)


def seen_tokens(ids: torch.Tensor, mask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Which tokens each row's prompt holds: ids ``[B, P]`` long, mask ``[B, P]`` bool (False on padding)
    -> ``[B, V]`` bool, the repetition penalty's starting set (the decode loop adds each sampled token)."""
    seen = torch.zeros(ids.shape[0], vocab_size, dtype=torch.bool, device=ids.device)
    rows, cols = mask.nonzero(as_tuple=True)
    seen[rows, ids[rows, cols]] = True
    return seen


def draw_categorical(probs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """One draw per row of ``probs`` ``[B, V]`` by inverting the CDF with one uniform per row -> ``[B]``.

    Naive equivalent: ``torch.multinomial(probs, 1)``, which draws ``V`` exponentials per row (several
    times slower for a small batch). Picks the first index whose cumulative mass exceeds ``u * total``
    with ``u`` in [0, 1), so zero-probability tokens are never drawn.
    """
    cdf = probs.cumsum(dim=-1)  # [B, V]
    u = torch.rand((probs.shape[0], 1), generator=generator, device=probs.device, dtype=cdf.dtype)
    index = torch.searchsorted(cdf, u * cdf[:, -1:], right=True)  # [B, 1]
    return index.squeeze(-1).clamp(max=probs.shape[-1] - 1)


def scaled_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """``logits / temperature`` in float32 (the raw logits when greedy). ``[B, V]`` -> ``[B, V]``."""
    logits = logits.float()
    return logits if params.greedy else logits / params.temperature


def behaviour_logprobs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Log-probs of every token under the distribution :func:`sample_next` draws from, before top-k/top-p
    truncation: ``log_softmax(logits / temperature)`` (raw logits when greedy). ``[B, V]`` -> ``[B, V]``.
    The server reports these (and their top alternatives) as OpenAI ``logprobs``."""
    return torch.log_softmax(scaled_logits(logits, params), dim=-1)


def sample_next(
    logits: torch.Tensor,  # [B, V] next-token logits
    params: SamplingParams,
    generator: torch.Generator | None = None,
    seen: torch.Tensor | None = None,  # [B, V] bool, tokens in each row's prompt and response so far
) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw one token per row and its behaviour log-prob: ``([B] long, [B] float32)``. ``seen``: what the
    repetition penalty applies to (needed when ``params.penalised``)."""
    scaled = scaled_logits(logits, params)  # [B, V]
    logprobs = torch.log_softmax(scaled, dim=-1)  # [B, V], as behaviour_logprobs
    if params.penalised:
        if seen is None:
            raise ValueError("repetition_penalty needs the tokens each row has seen")
        scaled = scaled_logits(penalise_repeats(logits.float(), seen, params.repetition_penalty), params)
    if params.greedy:
        tokens = scaled.argmax(dim=-1)  # [B]
    else:
        filtered = filter_top_p(filter_top_k(scaled, params.top_k), params.top_p)
        filtered = filter_min_p(filtered, params.min_p)
        tokens = draw_categorical(torch.softmax(filtered, dim=-1), generator)  # [B]
    return tokens, logprobs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
