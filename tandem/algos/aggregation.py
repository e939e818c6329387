"""Loss aggregation: how a per-token loss matrix ``[B, T]`` becomes one scalar.

The choice changes what the gradient optimises (DAPO and Dr. GRPO showed per-sequence length
normalisation biases learning towards long wrong answers), so it is a named, registered option.
Every mode accepts global normalisers so that summing micro-batch losses gives exactly the loss (and
gradient) of the full batch: gradient accumulation and data parallelism (all-reduce *sum*) rely on this.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from tandem.algos.registry import Registry


@dataclass(frozen=True)
class Normalisers:
    """Optional global divisors for micro-batched training.

    ``global_tokens``: valid tokens in the whole global batch (``token-mean``).
    ``global_seqs``: sequences with at least one valid token in the whole global batch (``seq-mean-*``).
    ``norm_constant``: the constant of ``seq-mean-token-sum-norm`` (default: ``T`` of the matrix; pass the
    configured max response length when micro-batches are padded to different ``T``).
    """

    global_tokens: float | None = None
    global_seqs: float | None = None
    norm_constant: float | None = None


AggregationFn = Callable[[torch.Tensor, torch.Tensor, Normalisers], torch.Tensor]

AGGREGATIONS: Registry[AggregationFn] = Registry("loss aggregation")


def aggregate(
    loss_matrix: torch.Tensor,
    mask: torch.Tensor,
    mode: str = "token-mean",
    global_tokens: float | None = None,
    *,
    global_seqs: float | None = None,
    norm_constant: float | None = None,
) -> torch.Tensor:
    """Reduce ``loss_matrix [B, T]`` over the valid positions of ``mask [B, T]`` to a scalar with the
    registered ``mode``. Without global normalisers the divisors are the micro-batch's own counts.
    An all-masked batch gives 0 (never NaN)."""
    if loss_matrix.shape != mask.shape:
        raise ValueError(f"aggregate: loss {tuple(loss_matrix.shape)} and mask {tuple(mask.shape)} differ")
    fn = AGGREGATIONS.get(mode)
    m = mask.to(torch.bool)
    # where() rather than multiply: a non-finite value on a padded position must not leak into the sum.
    clean = torch.where(m, loss_matrix, torch.zeros_like(loss_matrix))
    return fn(clean, m, Normalisers(global_tokens, global_seqs, norm_constant))


def _divide(total: torch.Tensor, local: torch.Tensor, global_count: float | None) -> torch.Tensor:
    if global_count is not None:
        if global_count <= 0:
            raise ValueError(f"global normaliser must be > 0, got {global_count}")
        return total / global_count
    return total / local.clamp(min=1.0)


def _seq_mean(per_seq: torch.Tensor, mask: torch.Tensor, norm: Normalisers) -> torch.Tensor:
    has_tokens = mask.any(dim=-1).to(per_seq.dtype)  # [B]
    return _divide((per_seq * has_tokens).sum(), has_tokens.sum(), norm.global_seqs)


@AGGREGATIONS.register("token-mean")
def _token_mean(loss: torch.Tensor, mask: torch.Tensor, norm: Normalisers) -> torch.Tensor:
    """sum over valid tokens / number of valid tokens (DAPO token-level loss)."""
    m = mask.to(loss.dtype)
    return _divide((loss * m).sum(), m.sum(), norm.global_tokens)


@AGGREGATIONS.register("seq-mean-token-mean")
def _seq_mean_token_mean(loss: torch.Tensor, mask: torch.Tensor, norm: Normalisers) -> torch.Tensor:
    """mean over sequences of (mean over the sequence's valid tokens) (original GRPO, GSPO)."""
    m = mask.to(loss.dtype)
    per_seq = (loss * m).sum(dim=-1) / m.sum(dim=-1).clamp(min=1.0)  # [B]
    return _seq_mean(per_seq, mask, norm)


@AGGREGATIONS.register("seq-mean-token-sum")
def _seq_mean_token_sum(loss: torch.Tensor, mask: torch.Tensor, norm: Normalisers) -> torch.Tensor:
    """mean over sequences of (sum over the sequence's valid tokens)."""
    per_seq = (loss * mask.to(loss.dtype)).sum(dim=-1)  # [B]
    return _seq_mean(per_seq, mask, norm)


@AGGREGATIONS.register("seq-mean-token-sum-norm")
def _seq_mean_token_sum_norm(loss: torch.Tensor, mask: torch.Tensor, norm: Normalisers) -> torch.Tensor:
    """mean over sequences of (token sum / constant), constant = ``norm_constant`` or ``T`` (Dr. GRPO)."""
    const = float(norm.norm_constant) if norm.norm_constant is not None else float(loss.shape[-1])
    if const <= 0:
        raise ValueError(f"norm_constant must be > 0, got {const}")
    per_seq = (loss * mask.to(loss.dtype)).sum(dim=-1) / const  # [B]
    return _seq_mean(per_seq, mask, norm)
