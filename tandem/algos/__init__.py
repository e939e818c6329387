"""Tandem's algorithm library: pure functions over padded ``[B, T]`` tensors with masks.

Imports torch and the standard library only, so the same code runs in the colocated trainer, the
decoupled learners and the tests. Pluggable pieces are looked up by name in typed registries; the
trainer never branches on an algorithm name.
"""

from tandem.algos.advantages import (
    ADVANTAGE_ESTIMATORS,
    AdvantageInputs,
    AdvantageSpec,
    compute_advantages,
    discounted_returns,
    gae_scan,
    greedy_baseline,
    weight_positive,
)
from tandem.algos.aggregation import AGGREGATIONS, aggregate
from tandem.algos.core import (
    entropy_from_logits,
    group_stats,
    last_token_mask,
    masked_mean,
    masked_sum,
    masked_var,
    masked_whiten,
    selective_log_softmax,
    sequence_sum,
)
from tandem.algos.corrections import CORRECTIONS, correction_weights
from tandem.algos.curriculum import CURRICULA, CurriculumOptions, PromptStats, TableStats
from tandem.algos.dapo import (
    degeneracy_metrics,
    filter_groups,
    group_outcomes,
    overlong_penalty,
    zero_advantage_groups,
)
from tandem.algos.distill import topk_forward_kl
from tandem.algos.entropy import AdaptiveEntropy, high_entropy_mask, sampled_entropy
from tandem.algos.imitation import reference_nll, success_mask, success_nll, success_tokens
from tandem.algos.kl import KL_ESTIMATORS, AdaptiveKL, FixedKL, kl_penalty
from tandem.algos.mismatch import logprob_mismatch
from tandem.algos.policy import policy_loss
from tandem.algos.policy_losses import (
    POLICY_LOSSES,
    ClipOptions,
    PolicyLossInputs,
    PolicyLossSpec,
    WeightClipOptions,
    clipped_surrogate,
)
from tandem.algos.preference import PREFERENCE_LOSSES, dpo_loss, reward_model_loss
from tandem.algos.registry import DuplicateNameError, PluginError, Registry, UnknownNameError
from tandem.algos.value import explained_variance, value_loss

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "AGGREGATIONS",
    "CORRECTIONS",
    "CURRICULA",
    "KL_ESTIMATORS",
    "POLICY_LOSSES",
    "PREFERENCE_LOSSES",
    "AdaptiveEntropy",
    "AdaptiveKL",
    "AdvantageInputs",
    "AdvantageSpec",
    "ClipOptions",
    "CurriculumOptions",
    "DuplicateNameError",
    "PluginError",
    "FixedKL",
    "PolicyLossInputs",
    "PolicyLossSpec",
    "PromptStats",
    "TableStats",
    "Registry",
    "UnknownNameError",
    "WeightClipOptions",
    "aggregate",
    "clipped_surrogate",
    "compute_advantages",
    "weight_positive",
    "greedy_baseline",
    "correction_weights",
    "degeneracy_metrics",
    "discounted_returns",
    "dpo_loss",
    "entropy_from_logits",
    "explained_variance",
    "filter_groups",
    "gae_scan",
    "group_outcomes",
    "group_stats",
    "high_entropy_mask",
    "kl_penalty",
    "last_token_mask",
    "logprob_mismatch",
    "masked_mean",
    "masked_sum",
    "masked_var",
    "masked_whiten",
    "overlong_penalty",
    "policy_loss",
    "reward_model_loss",
    "sampled_entropy",
    "selective_log_softmax",
    "sequence_sum",
    "success_mask",
    "success_nll",
    "reference_nll",
    "success_tokens",
    "topk_forward_kl",
    "value_loss",
    "zero_advantage_groups",
]
