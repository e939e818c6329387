"""Algorithm presets: named bundles of the three orthogonal choices (advantage, policy loss, aggregation)
plus their customary hyper-parameters. A preset only fills fields the user left unset; its
``loss_options`` are refined key by key by the user's (options of the default values are omitted: the
loss's options dataclass holds the defaults, e.g. clip 0.2/0.2).

This is data, not code: the trainer reads the resolved fields and never branches on ``algorithm.name``.
"""

from __future__ import annotations

from typing import Any

_PPO_DEFAULTS: dict[str, Any] = {
    "norm_by_std": True,
    "dynamic_sampling": False,
}

ALGORITHM_PRESETS: dict[str, dict[str, Any]] = {
    # DeepSeekMath GRPO: group-normalised advantages, PPO clip, per-sequence mean of token means.
    "grpo": {
        **_PPO_DEFAULTS,
        "advantage": "grpo",
        "policy_loss": "ppo_clip",
        "aggregation": "seq-mean-token-mean",
    },
    # Dr. GRPO: no std normalisation, constant-normalised token sums (no length bias).
    "dr_grpo": {
        **_PPO_DEFAULTS,
        "advantage": "dr_grpo",
        "policy_loss": "ppo_clip",
        "aggregation": "seq-mean-token-sum-norm",
        "norm_by_std": False,
    },
    # DAPO: clip-higher, dynamic sampling, token-level mean (overlong shaping lives in reward.overlong).
    "dapo": {
        **_PPO_DEFAULTS,
        "advantage": "grpo",
        "policy_loss": "ppo_clip",
        "aggregation": "token-mean",
        "loss_options": {"clip_high": 0.28},
        "dynamic_sampling": True,
    },
    "rloo": {**_PPO_DEFAULTS, "advantage": "rloo", "policy_loss": "ppo_clip", "aggregation": "token-mean"},
    "reinforce_pp": {
        **_PPO_DEFAULTS,
        "advantage": "reinforce_pp",
        "policy_loss": "ppo_clip",
        "aggregation": "token-mean",
    },
    "reinforce_pp_baseline": {
        **_PPO_DEFAULTS,
        "advantage": "reinforce_pp_baseline",
        "policy_loss": "ppo_clip",
        "aggregation": "token-mean",
    },
    "gspo": {
        **_PPO_DEFAULTS,
        "advantage": "grpo",
        "policy_loss": "gspo",
        "aggregation": "seq-mean-token-mean",
        "loss_options": {"clip_low": 3e-4, "clip_high": 4e-4},
    },
    "cispo": {
        **_PPO_DEFAULTS,
        "advantage": "grpo",
        "policy_loss": "cispo",
        "aggregation": "token-mean",
        "loss_options": {"clip_high": 4.0},
    },
    "decoupled_ppo": {
        **_PPO_DEFAULTS,
        "advantage": "grpo",
        "policy_loss": "decoupled_ppo",
        "aggregation": "token-mean",
    },
    "topr": {**_PPO_DEFAULTS, "advantage": "dr_grpo", "policy_loss": "topr", "aggregation": "token-mean"},
    "agro": {**_PPO_DEFAULTS, "advantage": "dr_grpo", "policy_loss": "agro", "aggregation": "token-mean"},
    # PPO with a critic (Ouyang et al. 2022): GAE over per-token rewards (KL to the reference in the
    # reward when algorithm.beta > 0), clipped policy and value losses. Needs the critic section.
    "ppo": {
        **_PPO_DEFAULTS,
        "advantage": "gae",
        "policy_loss": "ppo_clip",
        "aggregation": "token-mean",
        "gamma": 1.0,
        "lam": 0.95,
        "kl": {"where": "reward"},
    },
    # On-policy distillation (Agarwal et al. 2024; Thinking Machines 2025): the student samples, a teacher
    # (algorithm.opd.teacher) scores every token, advantage = log pi_teacher - log pi_student per token.
    "opd": {
        **_PPO_DEFAULTS,
        "advantage": "opd",
        "policy_loss": "ppo_clip",
        "aggregation": "token-mean",
        "norm_by_std": False,
    },
    # Fully explicit: every field must be given.
    "custom": {**_PPO_DEFAULTS},
}
