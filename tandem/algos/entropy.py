"""The entropy controller: steers a knob that raises entropy (``algorithm.entropy_target``: the entropy
bonus coefficient; ``rollout.adaptive_temperature``: the sampling temperature).

A fixed ``algorithm.entropy_coef`` either does nothing (too small) or keeps the policy from sharpening at
all (too large), and the right value depends on the model and the task. Skywork-OR1 (He et al., 2025)
steers it instead: after every step the coefficient moves by a fixed ``step`` towards keeping the measured
token entropy at ``target`` —

    α <- min(α + step, α_max)   if H < target   (the policy is sharper than wanted: push entropy up)
    α <- max(α - step, α_min)   otherwise       (enough exploration: let the bonus fade)

— so the bonus is only as strong, and only as long, as the entropy needs it (α_min = 0). ``H`` is the step's
mean token entropy of the sampled responses (``actor/entropy``), the same quantity the bonus raises.

The same rule steers the sampling temperature (``rollout.adaptive_temperature``, bounds
``[min_temperature, max_temperature]``): entropy rises monotonically with the temperature, so a policy that
sharpens below the target is sampled hotter, and one above it cooler. There ``H`` is measured on the rollout
side (:func:`sampled_entropy`), so the controller needs nothing from the learner.

:func:`high_entropy_mask` is the other use of the token entropy: the policy gradient only on the "forking"
tokens where the policy is uncertain (``algorithm.top_entropy_quantile``; Wang et al., 2025, "Beyond the
80/20 Rule").
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class AdaptiveEntropy:
    """Bang-bang controller of a knob ``value`` that raises entropy (see the module docstring)."""

    value: float
    target: float
    step: float
    max_value: float
    min_value: float = 0.0

    def __post_init__(self) -> None:
        if not (self.target > 0 and self.step > 0 and 0 <= self.min_value <= self.value <= self.max_value):
            raise ValueError(
                "AdaptiveEntropy needs target > 0, step > 0 and 0 <= min_value <= value <= max_value, got "
                f"target={self.target}, step={self.step}, value={self.value}, "
                f"min_value={self.min_value}, max_value={self.max_value}"
            )

    def update(self, entropy: float) -> float:
        """Move the coefficient after a step whose measured mean token entropy was ``entropy``."""
        if entropy < self.target:
            self.value = min(self.value + self.step, self.max_value)
        else:
            self.value = max(self.value - self.step, self.min_value)
        return self.value


def sampled_entropy(behavior_logprobs: torch.Tensor, response_mask: torch.Tensor) -> float:
    """Mean per-token entropy of a rollout, estimated from its sampled tokens: the mean of ``-log p`` of
    each sampled token under the distribution it was drawn from (an unbiased estimate of the entropy at the
    sampling temperature; with top-k/top-p the log-probs are pre-truncation, so it reads a little high).
    ``[B, R]`` float and ``[B, R]`` bool -> a float (0.0 for a rollout without tokens)."""
    n = int(response_mask.sum())
    return 0.0 if n == 0 else float(-(behavior_logprobs.float() * response_mask).sum() / n)


def high_entropy_mask(entropy: torch.Tensor, mask: torch.Tensor, quantile: float) -> torch.Tensor:
    """The valid tokens whose entropy is in the top ``quantile`` fraction of ``mask``'s tokens: at or above
    the ``1 - quantile`` quantile of their entropies (ties at the threshold are kept, so slightly more than
    the fraction may be). ``quantile`` in (0, 1]; 1 keeps every valid token. ``entropy`` ``[B, R]`` float,
    ``mask`` ``[B, R]`` bool -> ``[B, R]`` bool (False wherever ``mask`` is)."""
    if not 0 < quantile <= 1:
        raise ValueError(f"quantile must be in (0, 1], got {quantile}")
    valid = entropy[mask]
    if quantile == 1 or valid.numel() == 0:
        return mask.clone()
    threshold = torch.quantile(valid.float(), 1.0 - quantile)
    return mask & (entropy >= threshold)
