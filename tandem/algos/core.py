"""Building blocks shared by every estimator and loss: masked statistics and log-prob gathers."""

from __future__ import annotations

import torch


def masked_sum(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Sum of ``x`` where ``mask`` is true."""
    x = x * mask.to(x.dtype)
    return x.sum() if dim is None else x.sum(dim=dim)


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of ``x`` over positions where ``mask`` is true; 0 where nothing is selected (never NaN)."""
    m = mask.to(x.dtype)
    total = (x * m).sum() if dim is None else (x * m).sum(dim=dim)
    count = m.sum() if dim is None else m.sum(dim=dim)
    return total / count.clamp(min=1.0)


def _clamp_to_range(mean: torch.Tensor, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``mean`` clamped into ``[min, max]`` of the masked entries of ``x`` (unchanged if none is masked).

    The float mean of equal values can round one ulp away from them; clamping makes it exact, so the
    deviations of a constant input are exactly 0. A no-op for any other input."""
    if x.numel() == 0:
        return mean
    lo = torch.where(mask, x, torch.full_like(x, float("inf"))).amin()
    hi = torch.where(mask, x, torch.full_like(x, -float("inf"))).amax()
    return torch.where(lo <= hi, torch.minimum(torch.maximum(mean, lo), hi), mean)


def masked_var(x: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance of the masked entries of ``x`` (Bessel-corrected when ``unbiased`` and count > 1)."""
    m = mask.to(x.dtype)
    count = m.sum()
    mean = _clamp_to_range(masked_mean(x, mask), x, mask.to(torch.bool))
    var = (((x - mean) ** 2) * m).sum() / count.clamp(min=1.0)
    if unbiased and count > 1:
        var = var * count / (count - 1)
    return var


def masked_whiten(
    x: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True, eps: float = 1e-8
) -> torch.Tensor:
    """Standardise the masked entries of ``x`` to zero mean (optional) and unit variance; masked-out
    entries are set to zero. ``eps`` is added to the variance (1e-8, as in verl and OpenRLHF).

    Constant input whitens to exactly 0: the float mean of equal values can be one ulp off, and
    ``rsqrt(0 + eps)`` would magnify that ulp into a visible value, so the mean is clamped into the
    range of the masked values (a no-op whenever the values differ).
    """
    mean = _clamp_to_range(masked_mean(x, mask), x, mask.to(torch.bool))
    var = masked_var(x, mask)
    out = (x - mean) * torch.rsqrt(var + eps)
    if not shift_mean:
        out = out + mean
    return out * mask.to(x.dtype)


def selective_log_softmax(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """``log_softmax(logits)[..., ids]`` without materialising the full ``[..., V]`` log-prob tensor.

    Naive equivalent: ``torch.log_softmax(logits, -1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)``.
    Here: gather the chosen logit, subtract ``logsumexp`` row by row, so peak memory is one ``[B, T]``
    buffer on top of the logits. logits ``[B, T, V]``, ids ``[B, T]`` -> ``[B, T]`` float32.
    """
    if logits.dtype in (torch.float16, torch.bfloat16):
        # Half precision logsumexp is inaccurate; upcast one row at a time to keep memory flat.
        out = []
        for row_logits, row_ids in zip(logits, ids, strict=True):
            row = row_logits.float()
            out.append(row.gather(-1, row_ids.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(row, dim=-1))
        return torch.stack(out)
    chosen = logits.gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    return chosen - torch.logsumexp(logits, dim=-1)


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of ``softmax(logits)`` per position: ``logsumexp(l) - sum(softmax(l) * l)``.
    logits ``[..., V]`` -> ``[...]``."""
    logits = logits.float()
    probs = torch.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - (probs * logits).sum(dim=-1)


def group_stats(
    values: torch.Tensor, group_ids: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-sample statistics of the group each sample belongs to.

    values ``[B]`` float, group_ids ``[B]`` int -> (group mean ``[B]``, unbiased group std ``[B]``,
    group size ``[B]``), each broadcast back to the samples. The std of a group of one is 0 (not NaN); a
    group of equal values has exactly that value as its mean and exactly 0 as its std.

    Naive equivalent: ``for g in unique(ids): sel = ids == g; mean[sel] = v[sel].mean();
    std[sel] = v[sel].std() if sel.sum() > 1 else 0``. Here two scatter-add passes over ``[B]``
    (mean first, then squared deviations, which is numerically stable).
    """
    _, inverse = torch.unique(group_ids, return_inverse=True)  # [B] in 0..G-1
    g = int(inverse.max()) + 1 if inverse.numel() else 0
    v = values.to(torch.float32) if not values.is_floating_point() else values
    count = torch.zeros(g, dtype=v.dtype, device=v.device).index_add_(0, inverse, torch.ones_like(v))  # [G]
    total = torch.zeros(g, dtype=v.dtype, device=v.device).index_add_(0, inverse, v)  # [G]
    inf = torch.full((g,), float("inf"), dtype=v.dtype, device=v.device)
    gmin = inf.scatter_reduce(0, inverse, v, "amin")  # [G]
    gmax = (-inf).scatter_reduce(0, inverse, v, "amax")  # [G]
    # Every group has >= 1 member. Clamped into the group's range, the mean of a group of equal values is
    # exactly that value (a float sum of 8 x 3.3 is one ulp off), so its deviations and std are exactly 0.
    mean = torch.minimum(torch.maximum(total / count, gmin), gmax)  # [G]
    dev2 = (v - mean[inverse]) ** 2  # [B]
    ss = torch.zeros(g, dtype=v.dtype, device=v.device).index_add_(0, inverse, dev2)  # [G]
    std = torch.where(count > 1, (ss / (count - 1).clamp(min=1.0)).sqrt(), torch.zeros_like(ss))  # [G]
    return mean[inverse], std[inverse], count[inverse]


def sequence_sum(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Sum of ``x`` over the valid tokens of each row: ``[B, T]`` -> ``[B]``."""
    return (x * mask.to(x.dtype)).sum(dim=-1)


def last_token_mask(mask: torch.Tensor) -> torch.Tensor:
    """True at the last valid token of each row (none for fully masked rows). ``[B, T]`` -> ``[B, T]`` bool.

    Naive equivalent: ``out[b, max(nonzero(mask[b]))] = True`` per row; works for masks with holes.
    """
    m = mask.to(torch.bool)
    t = m.shape[-1]
    pos = torch.arange(t, device=m.device).expand_as(m)  # [B, T]
    last = torch.where(m, pos, torch.full_like(pos, -1)).amax(dim=-1, keepdim=True)  # [B, 1]
    return (pos == last) & m
