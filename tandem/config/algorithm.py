"""``algorithm``: the RL algorithm as three orthogonal registry names, filled by a preset, plus KL.

Names are plain strings checked against the registries of :mod:`tandem.algos` by :mod:`tandem.config.checks`
(a field's ``registry`` extra names its registry; the docs list its entries), so a newly registered piece
needs no edit here. The trainer reads the resolved fields and never branches on ``algorithm.name``.

``algorithm.loss_options`` holds the hyper-parameters of the chosen policy loss, validated by a pydantic
model built from the loss's own options dataclass (:func:`loss_options_model`), so a loss with a new
hyper-parameter needs no field here. ``clip_low``, ``clip_high`` and ``dual_clip`` stay accepted as
top-level shorthands (:data:`LOSS_OPTION_SHORTHANDS`) for the options of the same name.
"""

from __future__ import annotations

import dataclasses
import logging
import typing
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model, model_validator

from tandem.config.base import CrossFieldError, Section
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
    ref_sync_steps: int = Field(
        0,
        ge=0,
        description="Move the reference towards the policy every N learner steps (0 = a fixed reference): "
        "ref <- a*policy + (1-a)*ref with a = kl.ref_sync_alpha (TR-DPO's soft update, TRL's sync_ref_model "
        "and ref_model_sync_steps; a = 1 is ProRL's reset). Needs algorithm.beta > 0 and a full (not LoRA) "
        "policy; every learner rank (ddp, fsdp2) moves its copy; run checkpoints keep the moved reference.",
    )
    ref_sync_alpha: float = Field(
        0.6,
        gt=0,
        le=1,
        description="Share of the policy in each reference move (with kl.ref_sync_steps; TRL's "
        "ref_model_mixup_alpha, 0.6 there too; 1 = copy the policy).",
    )


class OPDConfig(Section):
    teacher: str | None = Field(
        None,
        description="On-policy distillation: the teacher's local model folder (or object-storage URL). It "
        "scores every token the student samples and must share the student's tokenizer; loaded on the "
        "learner only. Required by the opd estimator, refused by the others.",
    )
    reward_weight: float = Field(
        0.0,
        ge=0,
        description="Weight of the task reward beside the teacher term: w·(R − group mean) is added to "
        "every token's advantage (needs rollout.n >= 2); 0 distils only.",
    )


class AdaptiveGroupConfig(Section):
    enabled: bool = Field(
        False,
        description="Adaptive group size: after a step's first round, prompts whose group rewards are all "
        "equal (see which) get more samples of the same prompt, in the same group, until a reward differs "
        "or the group holds max_n; the ragged groups go to the (group-relative) advantage estimator. "
        "Both architectures (decoupled: each worker grows its own batch); not with dynamic_sampling or "
        "trainer.mini_batch_size.",
    )
    max_n: int = Field(32, ge=2, description="Largest group an extended prompt may grow to (> rollout.n).")
    per_round: int | None = Field(
        None, ge=1, description="Samples added to each still-degenerate group per round (default rollout.n)."
    )
    which: Literal["all_fail", "all_pass", "all_equal"] = Field(
        "all_fail",
        description="Groups to extend: all_fail (shared score <= 0: none solved; the samples find a success "
        "the policy rarely makes), all_pass (shared score > 0), or all_equal (both).",
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
    loss_options: dict[str, Any] = Field(
        default_factory=dict,
        description="Hyper-parameters of the policy loss (e.g. {clip_high: 0.28}); each loss's options are "
        "listed below. algorithm.clip_low, clip_high and dual_clip are shorthands for the option of that name.",
    )
    norm_by_std: bool | None = Field(None, description="Divide group-relative advantages by the group std.")
    std_scope: Literal["group", "batch"] = Field(
        "group",
        description="With norm_by_std, the grpo estimator divides by the std of the group's scores (group) "
        "or of every score in the batch (batch: TRL's scale_rewards='batch'; the group mean stays the "
        "baseline). Other estimators refuse batch.",
    )
    positive_weight: float = Field(
        1.0,
        ge=0,
        le=1,
        description="Positive advantages are multiplied by this, negative ones kept (W-REINFORCE's λ, Zhu et "
        "al. 2025): below 1 the update pushes away from wrong samples more than towards right ones; 0 = "
        "negative samples only. Every estimator, after its own normalisation.",
    )
    pass_k: int = Field(
        2,
        ge=1,
        description="k of the passk advantage estimator's pass@k objective (clamped to rollout.n; 1 = GRPO); "
        "other estimators ignore it.",
    )
    gamma: float = Field(1.0, ge=0, le=1, description="Discount.")
    lam: float = Field(1.0, ge=0, le=1, description="GAE λ.")
    beta: float = Field(
        0.0, ge=0, description="KL coefficient to the reference policy (0 loads no reference model)."
    )
    kl: KLConfig = Field(default_factory=KLConfig, description="KL estimator and placement.")
    entropy_coef: float = Field(
        0.0,
        description="Entropy bonus coefficient (subtracted from the loss); with entropy_target its start.",
    )
    entropy_target: float | None = Field(
        None,
        gt=0,
        description="Adaptive entropy bonus (Skywork-OR1): after every step the coefficient moves by "
        "entropy_coef_step, up while the measured token entropy (actor/entropy) is below this target, down to "
        "0 above it, capped at entropy_coef_max. null: a fixed entropy_coef.",
    )
    entropy_coef_step: float = Field(
        1e-3, gt=0, description="Change of the adaptive entropy coefficient per step (with entropy_target)."
    )
    entropy_coef_max: float = Field(
        0.05, gt=0, description="Largest adaptive entropy coefficient (with entropy_target)."
    )
    top_entropy_quantile: float = Field(
        1.0,
        gt=0,
        le=1,
        description="Policy gradient only on the top ρ fraction of each micro-batch's response tokens by "
        "entropy (the policy's uncertain 'forking' tokens; 0.2 in Wang et al. 2025, 'Beyond the 80/20 Rule'; "
        "TRL's top_entropy_quantile); the other tokens' advantages are 0. KL, entropy bonus and SFT terms keep "
        "every token, and so do the loss's token counts. 1 = every token. Needs a policy loss that is a "
        "multiple of the advantage (not agro).",
    )
    sft_coef: float = Field(
        0.0,
        ge=0,
        description="Auxiliary NLL (SFT) term on the batch's successful samples (RAFT-style): sft_coef × the "
        "mean negative log-likelihood of the tokens of every sample whose reward is >= sft_min_score, added "
        "to the policy loss (0 = off).",
    )
    sft_min_score: float = Field(
        1.0, description="Sequence reward at or above which a sample counts as successful for sft_coef."
    )
    mask_truncated: bool = Field(
        False,
        description="Leave samples cut off before they finished (finish reason 'length': rollout.max_new_tokens "
        "reached, or an episode out of turns) out of the loss and its token counts (DAPO's overlong filtering, "
        "TRL's mask_truncated_completions); their rewards still count in their group's baseline.",
    )
    dynamic_sampling: bool | None = Field(
        None, description="DAPO: drop groups whose rewards are all equal, resample to fill."
    )
    max_resample_rounds: int = Field(
        3, ge=0, description="Extra generation rounds to fill a dynamic-sampling batch."
    )
    adaptive_group: AdaptiveGroupConfig = Field(
        default_factory=AdaptiveGroupConfig,
        description="Adaptive group size for zero-variance groups (off by default; docs/algorithms.md).",
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
    opd: OPDConfig = Field(
        default_factory=OPDConfig,
        description="On-policy distillation (algorithm.name=opd): the teacher and the task-reward weight.",
    )

    @model_validator(mode="before")
    @classmethod
    def _apply_preset(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        name = data.get("name", "grpo")
        if name not in ALGORITHM_PRESETS:
            raise CrossFieldError(  # the key, so an override that set it is the one blamed
                "algorithm.name", f"unknown algorithm '{name}'; valid: {', '.join(ALGORITHM_PRESETS)}"
            )
        preset = ALGORITHM_PRESETS[name]
        merged = dict(preset)
        merged.update({k: v for k, v in data.items() if v is not None and k not in LOSS_OPTION_SHORTHANDS})
        preset_kl = preset.get("kl")
        if isinstance(preset_kl, dict) and isinstance(data.get("kl"), dict):
            merged["kl"] = {**preset_kl, **data["kl"]}  # a user kl section refines the preset's
        shorthands = {k: data[k] for k in LOSS_OPTION_SHORTHANDS if data.get(k) is not None}
        merged["loss_options"] = resolve_loss_options(
            merged.get("policy_loss"), preset.get("loss_options", {}), data.get("loss_options"), shorthands
        )
        return merged


# Top-level keys kept from before per-loss options: ``algorithm.clip_high`` = ``algorithm.loss_options.clip_high``.
LOSS_OPTION_SHORTHANDS = ("clip_low", "clip_high", "dual_clip")
_BOUNDS = ("ge", "gt", "le", "lt")


def loss_options_model(loss: str) -> type[BaseModel] | None:
    """The pydantic model of policy loss ``loss``'s options, built from its options dataclass (field
    types, defaults, and ``description`` / bounds from each field's metadata); None if it has none."""
    from tandem.algos import POLICY_LOSSES

    options = POLICY_LOSSES.get(loss).options
    if options is None:
        return None
    hints = typing.get_type_hints(options)
    fields: dict[str, Any] = {}
    for f in dataclasses.fields(options):
        meta = {k: f.metadata[k] for k in _BOUNDS if k in f.metadata}
        fields[f.name] = (hints[f.name], Field(f.default, description=f.metadata.get("description"), **meta))
    config = ConfigDict(extra="forbid", allow_inf_nan=False)
    return create_model(f"{options.__name__}Model", __config__=config, **fields)


def resolve_loss_options(
    loss: Any, preset: dict[str, Any], given: Any, shorthands: dict[str, Any]
) -> dict[str, Any]:
    """The complete, validated options of policy loss ``loss``: its defaults, then the preset's options it
    has (a preset's clip bounds are dropped for a loss without them), then ``given`` (``loss_options``),
    then the top-level shorthands (a shorthand the loss lacks is ignored with a warning, as before per-loss
    options). Errors name ``algorithm.loss_options.<key>`` (or ``algorithm.<shorthand>``)."""
    from tandem.algos import POLICY_LOSSES

    if given is not None and not isinstance(given, dict):
        raise CrossFieldError("algorithm.loss_options", "must be a mapping of option names to values")
    if not isinstance(loss, str) or loss not in POLICY_LOSSES:
        return dict(given or {})  # the checks report a missing or unknown policy_loss
    model = loss_options_model(loss)
    names = list(model.model_fields) if model is not None else []
    values = {k: v for k, v in preset.items() if k in names}
    values.update(given or {})
    for key, value in shorthands.items():
        if key in names:
            values[key] = value
        else:
            logging.getLogger("tandem.config").warning(
                "algorithm.%s has no effect: policy loss '%s' has no option %s", key, loss, key
            )
    unknown = [k for k in values if k not in names]
    if unknown:
        raise CrossFieldError(
            f"algorithm.loss_options.{unknown[0]}",
            f"policy loss '{loss}' has no option '{unknown[0]}'; its options: {', '.join(names) or 'none'}",
        )
    if model is None:
        return {}
    try:
        return model.model_validate(values).model_dump()
    except ValidationError as exc:
        err = exc.errors()[0]
        key = str(err["loc"][0])
        prefix = "algorithm." if key in shorthands else "algorithm.loss_options."
        raise CrossFieldError(prefix + key, err["msg"].removeprefix("Value error, ")) from None
