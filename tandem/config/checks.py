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
from tandem.config.presets import GROUP_ESTIMATORS, TOKEN_REWARD_ESTIMATORS
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


def _check_algorithm(cfg: CheckedConfig) -> None:
    """Names exist in the algorithm library, and what each entry needs is available in this loop."""
    from tandem.algos import ADVANTAGE_ESTIMATORS, AGGREGATIONS, POLICY_LOSSES

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
        if name not in registry.names():
            raise CrossFieldError(key, f"unknown name '{name}'; valid: {', '.join(registry.names())}")
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
    missing = [r for r in adv.requires if r != "values"]
    if missing:
        raise CrossFieldError(
            "algorithm.advantage",
            f"'{a.advantage}' needs {', '.join(missing)}, which this trainer does not provide yet; "
            "use grpo, dr_grpo, rloo, reinforce_pp, reinforce_pp_baseline or gae",
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
            if size is not None and size % cfg.rollout.n:
                raise CrossFieldError(
                    key,
                    f"'{a.policy_loss}' needs whole groups per batch: {key} must be a multiple of rollout.n",
                )


OFF_POLICY_SAFE_LOSSES = ("decoupled_ppo", "agro", "topr")


def _check_architecture(cfg: CheckedConfig) -> None:
    """Decoupled runs: reject what the runtime cannot do; warn when the loss ignores staleness η ≥ 2."""
    arch, a = cfg.architecture, cfg.algorithm
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
    if arch.channel.backend == "ray" and arch.runtime != "ray":
        raise CrossFieldError(
            "architecture.channel.backend",
            "the ray channel needs architecture.runtime=ray; use queue or redis",
        )
    _check_data_parallel(cfg)
    if arch.mode != "decoupled":
        return
    if arch.ray.learner_actor and arch.runtime != "ray":
        raise CrossFieldError(
            "architecture.ray.learner_actor",
            "a learner actor needs architecture.runtime=ray; set it to false",
        )
    if arch.runtime == "ray" and arch.channel.backend == "queue":
        raise CrossFieldError(
            "architecture.channel.backend",
            "the multiprocessing queue cannot reach Ray actors; use ray (or redis) with architecture.runtime=ray",
        )
    if arch.staleness >= 2 and a.policy_loss not in OFF_POLICY_SAFE_LOSSES and a.correction is None:
        logging.getLogger("tandem.config").warning(
            "architecture.staleness=%d: '%s' is unsafe for η ≥ 2 without correction; safe choices: "
            "algorithm.name=decoupled_ppo, agro, topr, or algorithm.correction=token_tis|seq_tis|token_mis|seq_mis",
            arch.staleness,
            a.policy_loss,
        )


def _check_data_parallel(cfg: CheckedConfig) -> None:
    """``architecture.learner.world_size > 1``: decoupled, and every rank gets a share of each mini-batch
    (whole groups when the loss needs them, else samples; a critic's update splits the same way)."""
    ws, key = cfg.architecture.learner.world_size, "architecture.learner.world_size"
    if ws == 1:
        return
    if cfg.architecture.mode != "decoupled":
        raise CrossFieldError(
            key, f"world_size={ws} needs architecture.mode=decoupled (the colocated trainer is one process)"
        )
    from tandem.algos import POLICY_LOSSES  # lazily, as in _check_algorithm

    whole = POLICY_LOSSES.get(cfg.algorithm.policy_loss).needs_whole_groups
    mini = cfg.trainer.mini_batch_size or cfg.samples_per_step
    units, what = (mini // cfg.rollout.n, "groups") if whole else (mini, "samples")
    if units < ws:
        raise CrossFieldError(
            key,
            f"world_size={ws} exceeds the {units} {what} of a mini-batch (each rank needs a share); "
            "lower it or raise data.prompts_per_step / trainer.mini_batch_size",
        )


def check_config(cfg: CheckedConfig) -> None:
    """Cross-field checks, each naming the key to change."""
    _check_algorithm(cfg)
    _check_architecture(cfg)
    a = cfg.algorithm
    if a.advantage in GROUP_ESTIMATORS and cfg.rollout.n < 2:
        raise CrossFieldError(
            "rollout.n",
            f"advantage '{a.advantage}' is group-relative and needs rollout.n >= 2 (got {cfg.rollout.n})",
        )
    if a.kl.where == "reward" and a.beta > 0 and a.advantage not in TOKEN_REWARD_ESTIMATORS:
        raise CrossFieldError(
            "algorithm.kl.where",
            f"KL in the reward needs a token-reward estimator ({', '.join(sorted(TOKEN_REWARD_ESTIMATORS))}), "
            f"not '{a.advantage}'; use algorithm.kl.where=loss",
        )
    if cfg.data.task is None and cfg.data.train_file is None:
        raise CrossFieldError("data.task", "set data.task (a built-in task) or data.train_file")
    if (
        not cfg.reward.task_reward
        and not cfg.reward.functions
        and cfg.reward.format_regex is None
        and cfg.reward.model is None
    ):
        raise CrossFieldError(
            "reward.functions", "no reward: enable reward.task_reward or add reward.functions"
        )
    if cfg.reward.task_reward and cfg.data.task is None and not cfg.reward.functions and not cfg.reward.model:
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
