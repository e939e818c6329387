"""The configuration schema: :class:`TandemConfig`, one pydantic section per key, every field described.

The descriptions double as ``--help`` text and as the reference in ``docs/configs.md``. Sections reject
unknown keys (``extra="forbid"``) so a typo is an error, not a silently ignored setting. Each section lives
in its own module (``tandem/config/<section>.py``); the checks that span sections are in
:mod:`tandem.config.checks`. This module assembles them and re-exports the section models, so
``from tandem.config.schema import AlgorithmConfig`` keeps working.
"""

from __future__ import annotations

from pydantic import Field, model_validator

from tandem.config.algorithm import AlgorithmConfig, KLConfig
from tandem.config.architecture import (
    ArchitectureConfig,
    AutoscaleConfig,
    ChannelConfig,
    LearnerResources,
    RayConfig,
    RoleResources,
)
from tandem.config.base import CrossFieldError, Section
from tandem.config.checkpoint import CheckpointConfig
from tandem.config.checks import check_config, unify_world_size
from tandem.config.data import DataConfig
from tandem.config.env import EnvConfig
from tandem.config.model import ModelConfig, WarmStartConfig
from tandem.config.monitor import ALERT_PRESETS, DEFAULT_ALERTS, AlertRuleConfig, MonitorConfig
from tandem.config.reward import OverlongConfig, RewardConfig, RewardFunctionConfig, RewardModelConfig
from tandem.config.rollout import RolloutConfig
from tandem.config.run import RunConfig
from tandem.config.trainer import CriticConfig, TrainerConfig

__all__ = [
    "ALERT_PRESETS",
    "DEFAULT_ALERTS",
    "AlertRuleConfig",
    "AlgorithmConfig",
    "ArchitectureConfig",
    "AutoscaleConfig",
    "ChannelConfig",
    "CheckpointConfig",
    "CriticConfig",
    "CrossFieldError",
    "DataConfig",
    "EnvConfig",
    "KLConfig",
    "LearnerResources",
    "ModelConfig",
    "MonitorConfig",
    "OverlongConfig",
    "RayConfig",
    "RewardConfig",
    "RewardFunctionConfig",
    "RewardModelConfig",
    "RoleResources",
    "RolloutConfig",
    "RunConfig",
    "Section",
    "TandemConfig",
    "TrainerConfig",
    "WarmStartConfig",
    "check_config",
]


class TandemConfig(Section):
    run: RunConfig = Field(default_factory=RunConfig, description="Run identity and output.")
    model: ModelConfig = Field(..., description="Policy model.")
    data: DataConfig = Field(default_factory=DataConfig, description="Prompts.")
    reward: RewardConfig = Field(default_factory=RewardConfig, description="Rewards.")
    rollout: RolloutConfig = Field(default_factory=RolloutConfig, description="Generation.")
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig, description="RL algorithm.")
    trainer: TrainerConfig = Field(default_factory=TrainerConfig, description="Optimisation.")
    architecture: ArchitectureConfig = Field(default_factory=ArchitectureConfig, description="Deployment.")
    monitor: MonitorConfig = Field(default_factory=MonitorConfig, description="Metrics and evaluation.")
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig, description="Checkpoints.")
    critic: CriticConfig | None = Field(
        None, description="Value model for critic-based estimators (algorithm.advantage=gae, preset ppo)."
    )
    env: EnvConfig | None = Field(
        None, description="Environment of multi-turn episodes (docs/agents.md); absent: single-turn prompts."
    )

    @model_validator(mode="after")
    def _cross_checks(self) -> TandemConfig:
        unify_world_size(self)
        check_config(self)
        return self

    @property
    def samples_per_step(self) -> int:
        return self.data.prompts_per_step * self.rollout.group_size
