"""KL estimators between the policy and a reference, and the controllers that set the KL coefficient.

For a token sampled from the policy, with ``d = log pi(y) - log pi_ref(y)`` (Schulman, "Approximating KL
divergence", 2020): ``k1 = d`` (unbiased, high variance, can be negative), ``k2 = d^2 / 2`` (biased, low
variance), ``k3 = exp(-d) + d - 1`` (unbiased, always >= 0, low variance; GRPO's "KL in loss"), ``abs = |d|``, and
``k3+`` (k3's value with k2's gradient, verl's straight-through variant).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from tandem.algos.registry import Registry

KLFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

KL_ESTIMATORS: Registry[KLFn] = Registry("KL estimator")

# exp(20) ~ 5e8: beyond this the estimate is meaningless and its gradient would overflow in fp16/bf16.
_LOG_RATIO_LIMIT = 20.0
_K3_MAX = 10.0


def kl_penalty(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, kind: str = "k3") -> torch.Tensor:
    """Per-token KL estimate of ``pi`` from ``pi_ref`` with the registered estimator ``kind``.

    logprobs, ref_logprobs ``[B, T]`` -> ``[B, T]``; differentiable in ``logprobs``.
    """
    if logprobs.shape != ref_logprobs.shape:
        raise ValueError(f"kl_penalty: shapes differ {tuple(logprobs.shape)} vs {tuple(ref_logprobs.shape)}")
    return KL_ESTIMATORS.get(kind)(logprobs, ref_logprobs)


@KL_ESTIMATORS.register("k1")
def _k1(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """``log pi - log pi_ref``."""
    return logprobs - ref_logprobs


@KL_ESTIMATORS.register("k2")
def _k2(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """``(log pi - log pi_ref)^2 / 2``."""
    return 0.5 * (logprobs - ref_logprobs) ** 2


def _k3(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """``pi_ref/pi - log(pi_ref/pi) - 1``, log-ratio clamped to +-20 and result clamped to [0, 10]."""
    d = (ref_logprobs - logprobs).clamp(-_LOG_RATIO_LIMIT, _LOG_RATIO_LIMIT)
    return (torch.exp(d) - d - 1.0).clamp(min=0.0, max=_K3_MAX)


KL_ESTIMATORS.add("k3", _k3)
KL_ESTIMATORS.add("low_var_kl", _k3)  # verl's name for k3


@KL_ESTIMATORS.register("abs")
def _abs(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """``|log pi - log pi_ref|``: always >= 0 but biased upwards (its mean is >= the KL); verl's ``abs``."""
    return (logprobs - ref_logprobs).abs()


@KL_ESTIMATORS.register("k3+")
def _k3_plus(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """Value of ``k3``, gradient of ``k2`` (straight-through): ``k2 - sg(k2) + sg(k3)``.

    k3 is an unbiased estimate of the KL's *value*, but its gradient is not the KL's gradient in
    expectation; k2's is (Schulman 2020). verl's ``k3+``: log ``k3``, optimise with ``k2``'s gradient.
    """
    k2 = _k2(logprobs, ref_logprobs)
    return k2 - k2.detach() + _k3(logprobs, ref_logprobs).detach()


@dataclass
class FixedKL:
    """A constant KL coefficient; ``update`` is a no-op so both controllers are interchangeable."""

    value: float

    def update(self, current_kl: float, n_steps: int) -> float:
        return self.value


@dataclass
class AdaptiveKL:
    """Ziegler et al. (2019) proportional controller that steers the measured KL towards ``target``.

    ``beta <- beta * (1 + clip(KL / target - 1, -0.2, 0.2) * n_steps / horizon)``.
    """

    value: float
    target: float
    horizon: int

    def __post_init__(self) -> None:
        if self.target <= 0 or self.horizon <= 0:
            raise ValueError(
                f"AdaptiveKL needs target > 0 and horizon > 0, got {self.target}, {self.horizon}"
            )

    def update(self, current_kl: float, n_steps: int) -> float:
        """Update from the KL measured over the last ``n_steps`` samples; returns the new coefficient."""
        error = min(max(current_kl / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + error * n_steps / self.horizon
        return self.value
