"""Every check that spans config sections, each naming the dotted key to change.

Facts about algorithm pieces (group-relative, consumes token rewards, needs a critic, off-policy safe,
needs whole groups) come from the registries of :mod:`tandem.algos`, never from name lists here; the
library is imported lazily so that ``import tandem.config`` stays free of torch.
"""

from __future__ import annotations

import logging
from typing import Protocol

from tandem.config.algorithm import AlgorithmConfig
from tandem.config.architecture import ArchitectureConfig
from tandem.config.base import CrossFieldError
from tandem.config.data import DataConfig
from tandem.config.reward import RewardConfig
from tandem.config.rollout import RolloutConfig
from tandem.config.trainer import CriticConfig, TrainerConfig


class CheckedConfig(Protocol):
    """The sections the checks read; :class:`~tandem.config.schema.TandemConfig` is one."""

    data: DataConfig
    reward: RewardConfig
    rollout: RolloutConfig
    algorithm: AlgorithmConfig
    trainer: TrainerConfig
    architecture: ArchitectureConfig
    critic: CriticConfig | None

    @property
    def samples_per_step(self) -> int: ...


# Optional estimator inputs the trainer provides (a critic's values, when a critic section is set; the
# sampled tokens' log-probs, always). A teacher's log-probs come only with algorithm.opd.teacher set.
TRAINER_PROVIDES = frozenset({"values", "logprobs"})


def _check_names(cfg: CheckedConfig) -> None:
    """Every algorithm piece names an entry of its registry in the algorithm library."""
    from tandem.algos import (
        ADVANTAGE_ESTIMATORS,
        AGGREGATIONS,
        CORRECTIONS,
        CURRICULA,
        KL_ESTIMATORS,
        POLICY_LOSSES,
    )

    a = cfg.algorithm
    for key, registry, name in (
        ("algorithm.advantage", ADVANTAGE_ESTIMATORS, a.advantage),
        ("algorithm.policy_loss", POLICY_LOSSES, a.policy_loss),
        ("algorithm.aggregation", AGGREGATIONS, a.aggregation),
    ):
        if name is None:
            raise CrossFieldError(
                key, f"{key} is required with algorithm.name=custom; valid: {', '.join(registry.names())}"
            )
        if name not in registry:
            raise CrossFieldError(key, f"unknown name '{name}'; valid: {', '.join(registry.names())}")
    for key, registry, name in (
        ("algorithm.correction", CORRECTIONS, a.correction),
        ("algorithm.kl.kind", KL_ESTIMATORS, a.kl.kind),
        ("data.curriculum.kind", CURRICULA, cfg.data.curriculum.kind),
    ):
        if name is not None and name not in registry:
            raise CrossFieldError(key, f"unknown name '{name}'; valid: {', '.join(registry.names())}")


def _check_algorithm(cfg: CheckedConfig) -> None:
    """What the chosen estimator and loss need (from their registry entries) is available in this loop."""
    from tandem.algos import ADVANTAGE_ESTIMATORS, POLICY_LOSSES

    _check_names(cfg)
    a = cfg.algorithm
    adv = ADVANTAGE_ESTIMATORS.get(a.advantage)
    if adv.needs_critic and cfg.critic is None:
        raise CrossFieldError(
            "critic", f"'{a.advantage}' needs a value model: add a critic section (e.g. critic.lr=1e-5)"
        )
    if cfg.critic is not None and cfg.critic.shared_backbone and cfg.critic.path is not None:
        raise CrossFieldError(
            "critic.path",
            "critic.shared_backbone=true puts the value head on the policy; remove critic.path "
            "(or set critic.shared_backbone=false for a separate value model)",
        )
    _check_teacher(cfg, "teacher_logprobs" in adv.requires)
    provides = (
        TRAINER_PROVIDES
        | ({"teacher_logprobs"} if a.opd.teacher else set())
        | ({"baseline_scores"} if cfg.rollout.greedy_in_group else set())
    )
    missing = [r for r in adv.requires if r not in provides]
    if missing:
        usable = [n for n in ADVANTAGE_ESTIMATORS if provides.issuperset(ADVANTAGE_ESTIMATORS[n].requires)]
        if missing == ["baseline_scores"]:  # remax: the greedy rows' scores
            raise CrossFieldError(
                "algorithm.advantage",
                f"'{a.advantage}' needs each prompt's greedy answer as its baseline: set "
                "rollout.greedy_in_group=true",
            )
        raise CrossFieldError(
            "algorithm.advantage",
            f"'{a.advantage}' needs {', '.join(missing)}, which this trainer does not provide yet; "
            f"use {', '.join(usable)}",
        )
    if adv.group_relative and cfg.rollout.group_size < 2:
        raise CrossFieldError(
            "rollout.n",
            f"advantage '{a.advantage}' is group-relative and needs rollout.n >= 2 (got {cfg.rollout.n}; "
            "or rollout.n=1 with rollout.greedy_in_group)",
        )
    if a.kl.where == "reward" and a.beta > 0 and not adv.uses_token_rewards:
        token = [n for n in ADVANTAGE_ESTIMATORS if ADVANTAGE_ESTIMATORS[n].uses_token_rewards]
        raise CrossFieldError(
            "algorithm.kl.where",
            f"KL in the reward needs a token-reward estimator ({', '.join(sorted(token))}), "
            f"not '{a.advantage}'; use algorithm.kl.where=loss",
        )
    if a.kl.controller == "adaptive" and (a.kl.where != "reward" or a.beta <= 0):
        raise CrossFieldError(
            "algorithm.kl.controller",
            "the adaptive KL controller needs algorithm.kl.where=reward and algorithm.beta > 0",
        )
    if POLICY_LOSSES.get(a.policy_loss).needs_whole_groups:
        for key, size in (
            ("trainer.mini_batch_size", cfg.trainer.mini_batch_size),
            ("trainer.micro_batch_size", cfg.trainer.micro_batch_size),
        ):
            if size is not None and size % cfg.rollout.group_size:
                raise CrossFieldError(
                    key,
                    f"'{a.policy_loss}' needs whole groups per batch: {key} must be a multiple of the group "
                    f"size ({cfg.rollout.group_size}: rollout.n plus rollout.greedy_in_group)",
                )


def _check_teacher(cfg: CheckedConfig, needs_teacher: bool) -> None:
    """A teacher exactly when the estimator scores with one (``teacher_logprobs`` in its ``requires``);
    its task-reward term is group-centred, so a weight needs groups of two or more."""
    a = cfg.algorithm
    if needs_teacher and not a.opd.teacher:
        raise CrossFieldError(
            "algorithm.opd.teacher",
            f"advantage '{a.advantage}' distils from a teacher: set algorithm.opd.teacher to its model "
            "folder (same tokenizer as model.path)",
        )
    if a.opd.teacher and not needs_teacher:
        raise CrossFieldError(
            "algorithm.opd.teacher",
            f"advantage '{a.advantage}' does not use a teacher; remove it or use algorithm.name=opd",
        )
    if needs_teacher and a.opd.reward_weight > 0 and cfg.rollout.n < 2:
        raise CrossFieldError(
            "algorithm.opd.reward_weight",
            f"the task-reward term is centred on the group mean and needs rollout.n >= 2 (got {cfg.rollout.n})",
        )


def _warn_off_policy(cfg: CheckedConfig) -> None:
    """Staleness η ≥ 2 with a loss that is not off-policy safe and no rollout correction: warn, naming the
    safe losses and the corrections (both read from the registries)."""
    from tandem.algos import CORRECTIONS, POLICY_LOSSES

    arch, a = cfg.architecture, cfg.algorithm
    if arch.staleness < 2 or a.correction is not None or POLICY_LOSSES.get(a.policy_loss).off_policy_safe:
        return
    safe = [n for n in POLICY_LOSSES if POLICY_LOSSES[n].off_policy_safe]
    logging.getLogger("tandem.config").warning(
        "architecture.staleness=%d: '%s' is unsafe for η ≥ 2 without correction; safe choices: "
        "algorithm.policy_loss=%s, or algorithm.correction=%s",
        arch.staleness,
        a.policy_loss,
        ", ".join(safe),
        "|".join(CORRECTIONS.names()),
    )


def _check_architecture(cfg: CheckedConfig) -> None:
    """Decoupled runs: reject what the runtime cannot do; warn when the loss ignores staleness η ≥ 2.
    The trajectory channel is checked by its backend when a decoupled run starts
    (:func:`tandem.channels.check_channel`: name, options, runtime), as backends live above this layer."""
    arch = cfg.architecture
    if arch.autoscale.min_workers > arch.autoscale.max_workers:
        raise CrossFieldError(
            "architecture.autoscale.min_workers",
            f"min_workers={arch.autoscale.min_workers} exceeds max_workers={arch.autoscale.max_workers}",
        )
    if arch.autoscale.enabled and not (
        arch.autoscale.min_workers <= arch.num_workers <= arch.autoscale.max_workers
    ):
        raise CrossFieldError(
            "architecture.num_workers",
            f"num_workers={arch.num_workers} is outside autoscale [{arch.autoscale.min_workers}, "
            f"{arch.autoscale.max_workers}]",
        )
    _check_data_parallel(cfg)
    if arch.mode != "decoupled":
        return
    if arch.ray.learner_actor and arch.runtime != "ray":
        raise CrossFieldError(
            "architecture.ray.learner_actor",
            "a learner actor needs architecture.runtime=ray; set it to false",
        )
    _warn_off_policy(cfg)


def unify_world_size(cfg: CheckedConfig) -> None:
    """``trainer.world_size`` and ``architecture.learner.world_size`` are one setting: whichever is above 1
    gives both its value (1 is the default and yields; two different values above 1 are an error)."""
    t, learner = cfg.trainer, cfg.architecture.learner
    if t.world_size > 1 and learner.world_size > 1 and t.world_size != learner.world_size:
        raise CrossFieldError(
            "trainer.world_size",
            f"trainer.world_size={t.world_size} and architecture.learner.world_size={learner.world_size} "
            "are the same setting; set one of them",
        )
    ws = max(t.world_size, learner.world_size)
    if t.world_size != ws:
        t.world_size = ws
    if learner.world_size != ws:
        learner.world_size = ws


def _world_size_key(cfg: CheckedConfig) -> str:
    """The key errors about the learner's ranks name: each architecture's usual spelling."""
    decoupled = cfg.architecture.mode == "decoupled"
    return "architecture.learner.world_size" if decoupled else "trainer.world_size"


def _check_data_parallel(cfg: CheckedConfig) -> None:
    """``trainer.world_size > 1`` (either architecture): every rank gets a share of each mini-batch
    (whole groups when the loss needs them, else samples; a critic's update splits the same way)."""
    ws, key = cfg.trainer.world_size, _world_size_key(cfg)
    strategy = cfg.trainer.strategy
    if ws == 1:
        if strategy in ("ddp", "fsdp2"):
            raise CrossFieldError("trainer.strategy", f"{strategy} needs {key} >= 2 (it is 1)")
        return
    if strategy == "single":
        raise CrossFieldError("trainer.strategy", f"single runs one learner process; world_size is {ws}")
    from tandem.algos import POLICY_LOSSES  # lazily, as in _check_algorithm

    whole = POLICY_LOSSES.get(cfg.algorithm.policy_loss).needs_whole_groups
    mini = cfg.trainer.mini_batch_size or cfg.samples_per_step
    units, what = (mini // cfg.rollout.group_size, "groups") if whole else (mini, "samples")
    if units < ws:
        raise CrossFieldError(
            key,
            f"world_size={ws} exceeds the {units} {what} of a mini-batch (each rank needs a share); "
            "lower it or raise data.prompts_per_step / trainer.mini_batch_size",
        )
    if strategy == "fsdp2":
        _check_fsdp2(cfg)


def _check_fsdp2(cfg: CheckedConfig) -> None:
    """Every FSDP2 forward is a collective, so every rank must run as many passes: a rank whose share of a
    mini-batch needs fewer micro-batches runs passes that add nothing (:class:`~tandem.train.fsdp.
    FullyShardedDataParallel`.filler_passes), so shares may differ; prefix sharing (data-dependent passes)
    is turned off by the learner (:meth:`~tandem.config.trainer.TrainerConfig.prefix_sharing`); a PPO
    value model is sharded like the policy, a value head shared with the policy is not supported."""
    if cfg.critic is not None and cfg.critic.shared_backbone:
        raise CrossFieldError(
            "trainer.strategy",
            "fsdp2 does not support critic.shared_backbone (a value head on the sharded policy; "
            "use a separate value model)",
        )


def _check_adaptive_group(cfg: CheckedConfig) -> None:
    """``algorithm.adaptive_group``: groups of unequal size need a group-relative estimator (each one
    registered as such computes its statistics per group id, whatever the group's size) and one
    mini-batch per step (the extra samples would otherwise change the number of optimiser
    steps, which the LR schedule counts)."""
    from tandem.algos import ADVANTAGE_ESTIMATORS, POLICY_LOSSES

    ag, a, key = cfg.algorithm.adaptive_group, cfg.algorithm, "algorithm.adaptive_group.enabled"
    if not ag.enabled:
        return
    if not ADVANTAGE_ESTIMATORS.get(a.advantage).group_relative:
        usable = sorted(n for n in ADVANTAGE_ESTIMATORS if ADVANTAGE_ESTIMATORS[n].group_relative)
        raise CrossFieldError(
            key, f"needs a group-relative advantage ({', '.join(usable)}), not '{a.advantage}'"
        )
    rejected = (
        (bool(a.dynamic_sampling), "algorithm.dynamic_sampling (it drops the groups this grows)"),
        (
            cfg.trainer.mini_batch_size is not None and cfg.trainer.mini_batch_size < cfg.samples_per_step,
            "trainer.mini_batch_size (the batch size varies; use trainer.micro_batch_size)",
        ),
        (
            POLICY_LOSSES.get(a.policy_loss).needs_whole_groups and cfg.trainer.micro_batch_size is not None,
            f"'{a.policy_loss}' with trainer.micro_batch_size (groups of unequal size would be split)",
        ),
    )
    for bad, why in rejected:
        if bad:
            raise CrossFieldError(key, f"adaptive group size does not work with {why}")
    if ag.max_n <= cfg.rollout.n:
        raise CrossFieldError(
            "algorithm.adaptive_group.max_n", f"must exceed rollout.n={cfg.rollout.n} (got {ag.max_n})"
        )


def _check_std_scope(cfg: CheckedConfig) -> None:
    """``algorithm.std_scope: batch`` changes the std an estimator divides by: it needs one that divides
    by a std (``norm_by_std``) and can take it from the batch (its registry entry's ``batch_std``)."""
    from tandem.algos import ADVANTAGE_ESTIMATORS

    a = cfg.algorithm
    if a.std_scope == "group":
        return
    if not a.norm_by_std:
        raise CrossFieldError(
            "algorithm.std_scope", "batch scales by a std, but algorithm.norm_by_std is false"
        )
    if not ADVANTAGE_ESTIMATORS.get(a.advantage).batch_std:
        able = [n for n in ADVANTAGE_ESTIMATORS.names() if ADVANTAGE_ESTIMATORS.get(n).batch_std]
        raise CrossFieldError(
            "algorithm.std_scope",
            f"advantage '{a.advantage}' has no batch std; batch works with {', '.join(able)}",
        )


def _check_top_entropy_quantile(cfg: CheckedConfig) -> None:
    """``algorithm.top_entropy_quantile`` < 1 works by zeroing advantages, so the loss must be a multiple
    of them."""
    from tandem.algos import POLICY_LOSSES

    a = cfg.algorithm
    if (
        a.top_entropy_quantile < 1
        and a.policy_loss
        and not POLICY_LOSSES.get(a.policy_loss).inert_at_zero_advantage
    ):
        raise CrossFieldError(
            "algorithm.top_entropy_quantile",
            f"policy loss '{a.policy_loss}' is not a multiple of the advantage, so zeroing the advantages of "
            "low-entropy tokens would not leave them out; use 1 or a loss such as ppo_clip",
        )


def _check_entropy_target(cfg: CheckedConfig) -> None:
    """``algorithm.entropy_target``: the adaptive coefficient starts within its bounds."""
    a = cfg.algorithm
    if a.entropy_target is None:
        return
    if a.entropy_coef < 0:
        raise CrossFieldError(
            "algorithm.entropy_coef", f"the adaptive coefficient cannot start below 0 (got {a.entropy_coef})"
        )
    if a.entropy_coef > a.entropy_coef_max:
        raise CrossFieldError(
            "algorithm.entropy_coef",
            f"the adaptive coefficient starts at entropy_coef={a.entropy_coef}, above "
            f"entropy_coef_max={a.entropy_coef_max}",
        )


def _check_ref_sync(cfg: CheckedConfig) -> None:
    """``algorithm.kl.ref_sync_steps``: a separate reference model to move (a LoRA policy's reference is
    its own base). Every DDP or FSDP2 rank moves its whole copy alike."""
    if not cfg.algorithm.kl.ref_sync_steps:
        return
    key = "algorithm.kl.ref_sync_steps"
    if cfg.algorithm.beta <= 0:
        raise CrossFieldError(key, "moves the KL reference, but algorithm.beta is 0 (no reference is loaded)")
    if cfg.model.lora.enabled:
        raise CrossFieldError(
            key, "a LoRA policy's reference is its base with the adapter off, which cannot move; use 0"
        )


def _check_adaptive_temperature(cfg: CheckedConfig) -> None:
    """``rollout.adaptive_temperature``: it starts at ``rollout.temperature``, inside its bounds."""
    at, r = cfg.rollout.adaptive_temperature, cfg.rollout
    if at.target_entropy is None:
        return
    if at.min_temperature > at.max_temperature:
        raise CrossFieldError(
            "rollout.adaptive_temperature.min_temperature",
            f"{at.min_temperature} is above max_temperature={at.max_temperature}",
        )
    if not at.min_temperature <= r.temperature <= at.max_temperature:
        raise CrossFieldError(
            "rollout.temperature",
            f"the adaptive temperature starts at rollout.temperature={r.temperature}, outside "
            f"[min_temperature={at.min_temperature}, max_temperature={at.max_temperature}]",
        )


def _check_greedy_in_group(cfg: CheckedConfig) -> None:
    """``rollout.greedy_in_group``: a greedy completion's log-probs are recorded under the raw logits
    (Tandem's engine convention), which is the distribution the learner scores the group at only when
    the samples are drawn at temperature 1."""
    r = cfg.rollout
    if not r.greedy_in_group:
        return
    if r.temperature != 1.0:
        raise CrossFieldError(
            "rollout.greedy_in_group",
            f"needs rollout.temperature=1 (got {r.temperature}): the greedy completion is scored with the "
            "samples, at the sampling temperature, and its log-probs are those of temperature 1",
        )
    if r.adaptive_temperature.target_entropy is not None:
        raise CrossFieldError(
            "rollout.greedy_in_group", "does not work with rollout.adaptive_temperature (it moves off 1)"
        )


def _check_reference_answers(cfg: CheckedConfig) -> None:
    """``rollout.reference_answers``: single-turn prompts, groups kept whole (not with dynamic sampling,
    which drops the all-equal groups the references are for)."""
    key = "rollout.reference_answers.column"
    if cfg.rollout.reference_answers.column is None:
        return
    if cfg.algorithm.dynamic_sampling:
        raise CrossFieldError(
            key,
            "does not work with algorithm.dynamic_sampling (it drops the groups a reference answer joins)",
        )
    if cfg.env is not None:
        raise CrossFieldError(
            key,
            "needs single-turn prompts: a reference answer is one completion, not a multi-turn episode (env)",
        )


def check_config(cfg: CheckedConfig) -> None:
    """Cross-field checks, each naming the key to change."""
    _check_algorithm(cfg)
    _check_entropy_target(cfg)
    _check_std_scope(cfg)
    _check_top_entropy_quantile(cfg)
    _check_ref_sync(cfg)
    _check_adaptive_temperature(cfg)
    _check_greedy_in_group(cfg)
    _check_reference_answers(cfg)
    _check_adaptive_group(cfg)
    _check_architecture(cfg)
    if cfg.checkpoint.best_metric and cfg.data.eval_size == 0:
        raise CrossFieldError(
            "checkpoint.best_metric", "needs a held-out evaluation, but data.eval_size is 0 (no eval runs)"
        )
    if cfg.data.task is None and cfg.data.train_file is None:
        raise CrossFieldError("data.task", "set data.task (a built-in task) or data.train_file")
    if (
        not cfg.reward.task_reward
        and not cfg.reward.functions
        and cfg.reward.format_regex is None
        and cfg.reward.model is None
        and cfg.env is None  # an environment's rewards are enough
    ):
        raise CrossFieldError(
            "reward.functions", "no reward: enable reward.task_reward or add reward.functions"
        )
    if (
        cfg.reward.task_reward
        and cfg.data.task is None
        and not cfg.reward.functions
        and not cfg.reward.model
        and cfg.env is None
    ):
        raise CrossFieldError("reward.functions", "a dataset from data.train_file needs reward.functions")
    batch = cfg.samples_per_step
    mini = cfg.trainer.mini_batch_size or batch
    micro = cfg.trainer.micro_batch_size or mini
    if batch % mini:
        raise CrossFieldError(
            "trainer.mini_batch_size", f"{mini} does not divide the batch of {batch} samples"
        )
    if mini % micro:
        raise CrossFieldError("trainer.micro_batch_size", f"{micro} does not divide the mini-batch of {mini}")
    if cfg.trainer.micro_batch_tokens is not None and cfg.trainer.micro_batch_size is not None:
        raise CrossFieldError(
            "trainer.micro_batch_tokens",
            "set trainer.micro_batch_tokens or trainer.micro_batch_size, not both",
        )
