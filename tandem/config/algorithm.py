"""``algorithm``: the RL algorithm as three orthogonal registry names, filled by a preset, plus KL.

Names are plain strings checked against the registries of :mod:`tandem.algos` by :mod:`tandem.config.checks`
(a field's ``registry`` extra names its registry; the docs list its entries), so a newly registered piece
needs no edit here. The trainer reads the resolved fields and never branches on ``algorithm.name``.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from tandem.config.base import Section
from tandem.config.presets import ALGORITHM_PRESETS


class KLConfig(Section):
    kind: str = Field(
        "k3",
        description="KL estimator (k3+: k3's value with k2's gradient; see docs/algorithms.md).",
        json_schema_extra={"registry": "KL_ESTIMATORS"},
    )
    where: Literal["loss", "reward"] = Field(
        "loss", description="Add β·KL to the loss (GRPO) or subtract it from the token reward."
    )
    controller: Literal["fixed", "adaptive"] = Field(
        "fixed",
        description="β controller: fixed, or adaptive (Ziegler et al. 2019; steers the measured KL to "
        "kl.target; needs kl.where=reward).",
    )
    target: float = Field(0.1, gt=0, description="Adaptive controller: the KL per token to steer towards.")
    horizon: int = Field(
        10000, ge=1, description="Adaptive controller: horizon in samples (larger = slower)."
    )


class AlgorithmConfig(Section):
    name: str = Field("grpo", description=f"Preset filling the fields below: {', '.join(ALGORITHM_PRESETS)}.")
    advantage: str | None = Field(
        None,
        description="Advantage estimator (tandem.algos.ADVANTAGE_ESTIMATORS).",
        json_schema_extra={"registry": "ADVANTAGE_ESTIMATORS"},
    )
    policy_loss: str | None = Field(
        None,
        description="Per-token policy loss (tandem.algos.POLICY_LOSSES).",
        json_schema_extra={"registry": "POLICY_LOSSES"},
    )
    aggregation: str | None = Field(
        None,
        description="Loss aggregation (tandem.algos.AGGREGATIONS).",
        json_schema_extra={"registry": "AGGREGATIONS"},
    )
    clip_low: float | None = Field(None, ge=0, description="PPO clip ε_low.")
    clip_high: float | None = Field(None, ge=0, description="PPO clip ε_high (DAPO clip-higher: 0.28).")
    dual_clip: float | None = Field(None, gt=1, description="Dual-clip constant c for negative advantages.")
    norm_by_std: bool | None = Field(None, description="Divide group-relative advantages by the group std.")
    gamma: float = Field(1.0, ge=0, le=1, description="Discount.")
    lam: float = Field(1.0, ge=0, le=1, description="GAE λ.")
    beta: float = Field(
        0.0, ge=0, description="KL coefficient to the reference policy (0 loads no reference model)."
    )
    kl: KLConfig = Field(default_factory=KLConfig, description="KL estimator and placement.")
    entropy_coef: float = Field(0.0, description="Entropy bonus coefficient (subtracted from the loss).")
    dynamic_sampling: bool | None = Field(
        None, description="DAPO: drop groups whose rewards are all equal, resample to fill."
    )
    max_resample_rounds: int = Field(
        3, ge=0, description="Extra generation rounds to fill a dynamic-sampling batch."
    )
    correction: str | None = Field(
        None,
        description="Rollout correction when the sampler's log-probs differ from the trainer's.",
        json_schema_extra={"registry": "CORRECTIONS"},
    )
    correction_low: float | None = Field(
        None, description="Lower bound on ρ for masked IS / rejection (default 1/correction_high)."
    )
    correction_high: float = Field(
        2.0, description="Cap (TIS) or upper bound on ρ (MIS, RS) of the IS weight."
    )

    @model_validator(mode="before")
    @classmethod
    def _apply_preset(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        name = data.get("name", "grpo")
        if name not in ALGORITHM_PRESETS:
            raise ValueError(f"unknown algorithm '{name}'; valid: {', '.join(ALGORITHM_PRESETS)}")
        merged = dict(ALGORITHM_PRESETS[name])
        merged.update({k: v for k, v in data.items() if v is not None})
        preset_kl = ALGORITHM_PRESETS[name].get("kl")
        if isinstance(preset_kl, dict) and isinstance(data.get("kl"), dict):
            merged["kl"] = {**preset_kl, **data["kl"]}  # a user kl section refines the preset's
        return merged
