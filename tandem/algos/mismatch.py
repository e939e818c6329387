"""The train–inference mismatch: how far the trainer's log-probs of the sampled tokens are from the engine's.

The engine that sampled (HF, vLLM, a stale rollout worker) reports behaviour log-probs; the trainer
recomputes the same tokens' log-probs with its own kernels, precision and weights. Ideally the two agree
(colocated HF in fp32: ~1e-6); a different attention kernel, bf16, a sampler bug (wrong temperature) or
policy lag make them drift, and then every sample is off-policy. The rollout corrections
(:mod:`tandem.algos.corrections`) reweight by ``rho_t = exp(trainer_lp - behavior_lp)``; these statistics
say how large ``rho`` is before any correction, so a broken engine shows up in the logs whether or not a
correction is configured.
"""

from __future__ import annotations

import math

import torch


def logprob_mismatch(
    trainer_logprobs: torch.Tensor,
    behavior_logprobs: torch.Tensor,
    mask: torch.Tensor,
    *,
    low: float = 0.5,
    high: float = 2.0,
) -> dict[str, float]:
    """Mismatch statistics over the response tokens where ``mask`` is true (all inputs ``[B, T]``).

    With ``d_t = trainer_lp_t - behavior_lp_t`` and ``rho_t = exp(d_t)``:

    - ``logprob_diff_mean``: mean of ``|d_t|``;
    - ``logprob_diff_max``: max of ``|d_t|``;
    - ``ratio_outside_frac``: fraction of tokens with ``rho_t < low`` or ``rho_t > high`` (compared in log
      space, so no overflow; the bounds themselves count as inside).

    Masked positions are ignored whatever they hold (padding may be garbage or ``-inf``); with no valid
    token every statistic is 0. No gradient flows (inputs are detached). One device sync.
    """
    if not 0 < low <= high:
        raise ValueError(f"logprob_mismatch needs 0 < low <= high, got [{low}, {high}]")
    if trainer_logprobs.shape != behavior_logprobs.shape or trainer_logprobs.shape != mask.shape:
        raise ValueError(
            "logprob_mismatch: shapes differ: trainer "
            f"{tuple(trainer_logprobs.shape)}, behavior {tuple(behavior_logprobs.shape)}, "
            f"mask {tuple(mask.shape)}"
        )
    m = mask.to(torch.bool)
    d = trainer_logprobs.detach().double() - behavior_logprobs.detach().double()  # [B, T]
    absd = torch.where(m, d.abs(), torch.zeros_like(d))  # [B, T], 0 off the mask
    outside = m & ((d < math.log(low)) | (d > math.log(high)))  # [B, T]
    count = m.sum().clamp(min=1).double()
    stats = torch.stack(
        [
            absd.sum() / count,
            absd.max() if absd.numel() else absd.new_zeros(()),
            outside.double().sum() / count,
        ]
    ).tolist()
    return dict(zip(("logprob_diff_mean", "logprob_diff_max", "ratio_outside_frac"), stats, strict=True))
