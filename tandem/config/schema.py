"""The configuration schema: one pydantic model per section, every field described.

The descriptions double as ``--help`` text and as the reference in ``docs/configs.md``. Sections reject
unknown keys (``extra="forbid"``) so a typo is an error, not a silently ignored setting.
"""

from __future__ import annotations

import logging
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from tandem.config.presets import ALGORITHM_PRESETS, GROUP_ESTIMATORS, TOKEN_REWARD_ESTIMATORS


class Section(BaseModel):
    # allow_inf_nan=False: a float key set to .inf/.nan (e.g. trainer.lr=.inf) is an error naming the key.
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


class RunConfig(Section):
    name: str = Field(
        "run", description="Run name; the run folder is <output_dir> (or runs/<name> if unset)."
    )
    output_dir: str | None = Field(None, description="Folder for metrics, samples, checkpoints and config.")
    seed: int = Field(0, description="Seed for data order, sampling and initialisation.")
    overwrite: bool = Field(
        False,
        description="Replace a run folder that already holds a Tandem run (config.yaml and metrics.jsonl); "
        "a non-empty folder that is not a run folder is never deleted.",
    )


class WarmStartConfig(Section):
    task: str = Field(..., description="Built-in task whose reference answers the warm start learns.")
    task_options: dict[str, Any] = Field(default_factory=dict, description="Options of that task.")
    steps: int = Field(300, ge=1, description="SFT optimiser steps.")
    lr: float = Field(3e-3, gt=0, description="SFT learning rate.")
    weight_decay: float = Field(0.0, ge=0, description="SFT AdamW weight decay.")
    batch_size: int = Field(64, ge=1, description="SFT rows per step.")
    train_size: int = Field(4096, ge=1, description="Rows generated from the task's train split.")
    base: str | None = Field(None, description="Start from this HF folder instead of a new tiny model.")
    model_options: dict[str, Any] = Field(
        default_factory=dict, description="init_tiny_model options (hidden_size, ...)."
    )


class ModelConfig(Section):
    path: str = Field(..., description="Local Hugging Face causal-LM folder (safetensors weights).")
    ref_path: str | None = Field(
        None, description="Reference model folder; defaults to model.path. Loaded only if algorithm.beta > 0."
    )
    dtype: Literal["float32", "bfloat16"] = Field("float32", description="Parameter dtype of the policy.")
    autocast_bf16: bool = Field(
        False, description="Run forward passes under bf16 autocast on CPU (faster matmuls)."
    )
    init_tiny: bool = Field(
        False, description="If model.path does not exist, build a tiny char-level Llama there first."
    )
    warm_start_sft: WarmStartConfig | None = Field(
        None,
        description="If set and model.path does not exist, build it by `tandem sft` with these options "
        "(task, steps, lr, base) and cache it there.",
    )


class DataConfig(Section):
    task: str | None = Field(
        None, description="Built-in task (arith, countdown, reverse); or use train_file."
    )
    task_options: dict[str, Any] = Field(
        default_factory=dict, description="Options of the built-in task, e.g. {digits: 2}."
    )
    train_file: str | None = Field(None, description="JSONL/Parquet prompt dataset with a `prompt` column.")
    eval_file: str | None = Field(None, description="Held-out JSONL/Parquet prompt dataset.")
    train_size: int = Field(4096, ge=1, description="Number of generated training prompts (built-in tasks).")
    eval_size: int = Field(200, ge=0, description="Number of held-out prompts evaluated (0 disables eval).")
    prompts_per_step: int = Field(8, ge=1, description="Prompts sampled per training step.")
    max_prompt_len: int = Field(128, ge=1, description="Maximum prompt length in tokens.")
    skip_long_prompts: bool = Field(
        False, description="Skip (and count) prompts over max_prompt_len instead of failing."
    )


class RewardFunctionConfig(Section):
    path: str = Field(
        ...,
        description="Callable `module:function` or `file.py:function`, TRL signature. Tandem imports "
        "and runs that Python code with your permissions: use only code you trust.",
    )
    weight: float = Field(1.0, description="Weight of this reward in the sum.")
    name: str | None = Field(None, description="Name used in metrics; defaults to the function name.")


class OverlongConfig(Section):
    enabled: bool = Field(False, description="DAPO soft overlong punishment added to the reward.")
    max_len: int | None = Field(None, description="Length L_max; defaults to rollout.max_new_tokens.")
    buffer: int = Field(4, ge=0, description="Buffer L_c: the penalty ramps over the last L_c tokens.")
    factor: float = Field(1.0, ge=0, description="Penalty at and beyond L_max.")


class RewardModelConfig(Section):
    path: str = Field(..., description="Reward-model folder written by `tandem rm` (HF sequence classifier).")
    weight: float = Field(1.0, description="Weight of the reward model's (normalised) score in the sum.")
    normalize: Literal["none", "fixed", "running"] = Field(
        "running",
        description="Score normalisation: running mean/std, fixed (mean/std below or from tandem_reward.json), none.",
    )
    mean: float | None = Field(
        None, description="fixed: mean to subtract (default: from tandem_reward.json)."
    )
    std: float | None = Field(
        None, gt=0, description="fixed: std to divide by (default: from tandem_reward.json)."
    )
    clip: float | None = Field(None, gt=0, description="Clip normalised scores to [-clip, clip].")
    batch_size: int = Field(64, ge=1, description="Completions scored per forward pass.")


class RewardConfig(Section):
    model: RewardModelConfig | None = Field(None, description="A learned reward model used as a reward.")
    task_reward: bool = Field(True, description="Use the built-in task's verifier as a reward (weight 1).")
    functions: list[RewardFunctionConfig] = Field(
        default_factory=list,
        description="Extra reward functions, each {path: 'module:function' or 'file.py:function', weight, "
        "name}. Loading one imports and runs that Python code with your permissions: use only code you trust.",
    )
    format_regex: str | None = Field(
        None, description="If set, add a 0/1 format reward for completions fully matching it."
    )
    format_weight: float = Field(0.1, description="Weight of the format reward.")
    overlong: OverlongConfig = Field(default_factory=OverlongConfig, description="DAPO overlong shaping.")
    on_error: Literal["raise", "skip"] = Field(
        "raise", description="A reward function that raises: fail, or score 0 and count it."
    )


class RolloutConfig(Section):
    backend: Literal["hf"] = Field("hf", description="Generation engine.")
    n: int = Field(8, ge=1, description="Samples per prompt (the group size).")
    max_new_tokens: int = Field(32, ge=1, description="Maximum generated tokens per sample.")
    temperature: float = Field(1.0, ge=0, description="Sampling temperature (0 = greedy).")
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling mass.")
    top_k: int = Field(0, ge=0, description="Top-k sampling (0 = off).")
    stop: list[str] = Field(
        default_factory=lambda: ["\n"], description="Stop strings (stripped from completions)."
    )


class KLConfig(Section):
    kind: Literal["k1", "k2", "k3", "abs", "k3+"] = Field(
        "k3", description="KL estimator (k3+: k3's value with k2's gradient; see docs/algorithms.md)."
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


class CriticConfig(Section):
    path: str | None = Field(
        None,
        description="Causal-LM folder for the value model's backbone (may be much smaller than the "
        "policy); defaults to model.path.",
    )
    lr: float = Field(1e-5, gt=0, description="Critic learning rate (its own AdamW, constant).")
    warmup_steps: int = Field(
        0, ge=0, description="Training steps that update only the critic before the policy starts to learn."
    )
    value_clip: float | None = Field(
        0.2, gt=0, description="PPO value clip: how far a value may move from its rollout value (null = off)."
    )
    vf_coef: float = Field(1.0, gt=0, description="Scale of the value loss.")
    shared_backbone: bool = Field(
        False,
        description="Value head (Linear(hidden, 1)) on the policy's last hidden state instead of a separate "
        "model: one forward, one backward (policy loss + vf_coef * value loss), the head a param group of "
        "the policy optimiser at critic.lr; in warm-up only the head learns. Excludes critic.path.",
    )


class AlgorithmConfig(Section):
    name: str = Field("grpo", description=f"Preset filling the fields below: {', '.join(ALGORITHM_PRESETS)}.")
    advantage: str | None = Field(
        None, description="Advantage estimator (tandem.algos.ADVANTAGE_ESTIMATORS)."
    )
    policy_loss: str | None = Field(None, description="Per-token policy loss (tandem.algos.POLICY_LOSSES).")
    aggregation: str | None = Field(None, description="Loss aggregation (tandem.algos.AGGREGATIONS).")
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
    correction: Literal["token_tis", "seq_tis", "token_mis", "seq_mis", "token_rs", "seq_rs"] | None = Field(
        None, description="Rollout correction when the sampler's log-probs differ from the trainer's."
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


class TrainerConfig(Section):
    total_steps: int = Field(100, ge=1, description="Training steps (one rollout batch each).")
    lr: float = Field(1e-5, gt=0, description="Peak learning rate (AdamW).")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay.")
    betas: tuple[float, float] = Field((0.9, 0.999), description="AdamW betas.")
    warmup_steps: int = Field(0, ge=0, description="Linear warmup optimiser steps.")
    lr_schedule: Literal["cosine", "constant"] = Field("cosine", description="Decay after warmup.")
    min_lr_ratio: float = Field(0.1, ge=0, le=1, description="Final LR as a fraction of the peak (cosine).")
    ppo_epochs: int = Field(1, ge=1, description="Passes over each rollout batch.")
    mini_batch_size: int | None = Field(
        None, ge=1, description="Samples per optimiser step (default: whole batch)."
    )
    micro_batch_size: int | None = Field(
        None, ge=1, description="Samples per forward/backward (gradient accumulation)."
    )
    max_grad_norm: float | None = Field(1.0, gt=0, description="Gradient clipping norm (null = off).")
    shared_prefix: bool = Field(
        True,
        description="Score each group's shared prompt once (KV cache reused by its n responses); same "
        "log-probs and gradients, less compute. Off: every row runs its own prompt.",
    )


class RoleResources(Section):
    threads: int = Field(1, ge=1, description="torch CPU threads per process of this role.")
    cpus: float = Field(1.0, ge=0, description="CPUs reserved per process of this role (Ray `num_cpus`).")
    gpus: float = Field(0.0, ge=0, description="GPUs per process of this role (Ray `num_gpus`).")
    memory_mb: int | None = Field(
        None, ge=1, description="Memory reserved per process of this role, MiB (Ray `memory`; null = none)."
    )


class LearnerResources(RoleResources):
    world_size: int = Field(
        1,
        ge=1,
        description="Data-parallel learner processes (torch.distributed); gradients equal one process "
        "training on the same global batch.",
    )
    dist_backend: Literal["auto", "gloo", "nccl"] = Field(
        "auto", description="torch.distributed backend: auto = NCCL on GPU, gloo on CPU."
    )


class RayConfig(Section):
    address: str | None = Field(
        None,
        description="Ray cluster to join (`auto`, `ray://host:10001`, `host:6379`); null starts a local "
        "instance in its own temp folder and stops it at the end.",
    )
    namespace: str | None = Field(None, description="Ray namespace (default: tandem-<run.name>).")
    num_cpus: int | None = Field(None, ge=1, description="CPUs of a local instance (null = all).")
    learner_actor: bool = Field(
        False,
        description="Run the learner in a Ray actor with architecture.learner.cpus/gpus/memory_mb (its own "
        "placement group, one bundle per learner rank; ranks 1..M-1 are actors too) instead of the driver "
        "process; the run folder is written on the learner's node.",
    )


class AutoscaleConfig(Section):
    enabled: bool = Field(False, description="Add/remove rollout workers while the run goes (decoupled).")
    min_workers: int = Field(1, ge=1, description="Never fewer rollout workers than this.")
    max_workers: int = Field(4, ge=1, description="Never more rollout workers than this.")
    starve_ratio: float = Field(
        0.3, gt=0, le=1, description="Scale up when the learner idled more than this share of a step."
    )
    full_depth: int = Field(
        2, ge=1, description="Scale down when this many batches wait in the channel after a step."
    )
    patience: int = Field(3, ge=1, description="Consecutive steps a condition must hold before acting.")
    cooldown: int = Field(5, ge=0, description="Steps to wait after a scaling action before the next.")


class ChannelConfig(Section):
    backend: Literal["queue", "redis", "ray"] = Field(
        "queue",
        description="Trajectory channel: multiprocessing queue (default), Redis Streams (durable) or a Ray "
        "actor queue (runtime ray).",
    )
    redis_url: str = Field("redis://127.0.0.1:6379/0", description="Redis server URL (backend redis).")
    stream: str | None = Field(
        None, description="Redis stream / consumer group name (default: tandem:<run.name>)."
    )
    max_len: int | None = Field(
        None,
        ge=1,
        description="Retention: trim the stream to about this many entries (acknowledged ones first).",
    )
    trim_acked: bool = Field(
        True, description="Retention: delete stream entries once acknowledged (after their checkpoint)."
    )
    max_age_s: float | None = Field(
        None, gt=0, description="Retention: trim stream entries older than this many seconds (null = keep)."
    )


class ArchitectureConfig(Section):
    mode: Literal["colocated", "decoupled"] = Field(
        "colocated", description="Colocated (lag 0) or decoupled rollout/learner."
    )
    runtime: Literal["embedded", "ray"] = Field(
        "embedded",
        description="Decoupled runtime: embedded (worker processes on this machine, no services) or ray "
        "(workers as Ray actors; see architecture.ray).",
    )
    ray: RayConfig = Field(default_factory=RayConfig, description="Ray cluster (runtime ray).")
    staleness: int = Field(0, ge=0, description="η: max policy-version lag of a trained sample (decoupled).")
    num_workers: int = Field(1, ge=1, description="Rollout worker processes (decoupled).")
    channel: ChannelConfig = Field(default_factory=ChannelConfig, description="Trajectory channel.")
    weight_sync: Literal["between_generations", "in_flight"] = Field(
        "between_generations",
        description="When workers load newly published weights: before each generation, or also between "
        "decode chunks of a generation (in_flight, PipelineRL-style; see weight_sync_chunk).",
    )
    weight_sync_chunk: int = Field(
        4, ge=1, description="in_flight: check for new weights every this many decoded tokens."
    )
    worker: RoleResources = Field(default_factory=RoleResources, description="Per rollout worker resources.")
    learner: LearnerResources = Field(
        default_factory=LearnerResources, description="Learner resources (and data parallelism)."
    )
    autoscale: AutoscaleConfig = Field(
        default_factory=AutoscaleConfig, description="Elastic rollout workers (decoupled)."
    )
    max_worker_restarts: int = Field(
        3, ge=0, description="Restarts of a rollout worker that dies before the run gives up."
    )
    learner_timeout_s: float = Field(
        600.0, gt=0, description="The learner fails when no trajectory arrives for this long."
    )


class AlertRuleConfig(Section):
    """One alert rule: when ``metric`` meets the condition ``kind``/``threshold``, take ``action``."""

    name: str | None = Field(None, description="Label shown in alerts; defaults to metric and kind.")
    metric: str = Field(..., description="Metric name, e.g. actor/grad_norm, actor/kl, eval/reward_mean.")
    kind: Literal["nonfinite", "above", "below", "spike", "growth", "diverge"] = Field(
        ...,
        description="nonfinite: NaN/Inf; above/below: vs threshold; spike: > threshold × running median of "
        "the last `window` values; growth: > threshold × the mean of the first `min_history` values; "
        "diverge: `metric` (train) rose while `against` (held-out) fell by ≥ threshold from its best.",
    )
    threshold: float | None = Field(
        None, description="Bound or factor; null only for nonfinite and the staleness preset (uses η)."
    )
    against: str | None = Field(None, description="Held-out metric compared with `metric` (kind diverge).")
    window: int = Field(20, ge=1, description="History length for spike (median) and diverge (best).")
    min_history: int = Field(3, ge=1, description="Values needed before spike/growth/diverge can fire.")
    action: Literal["warn", "skip", "stop", "rollback"] = Field(
        "warn",
        description="warn: log + webhook; skip: drop the step's update; stop: checkpoint and exit non-zero; "
        "rollback: restore the last good checkpoint and scale the LR by `lr_scale`.",
    )
    lr_scale: float = Field(0.5, gt=0, le=1, description="LR multiplier applied on rollback.")

    @model_validator(mode="after")
    def _needs_threshold(self) -> AlertRuleConfig:
        if self.kind != "nonfinite" and self.threshold is None and not self.metric.startswith("staleness/"):
            raise ValueError(f"alert rule on {self.metric}: kind '{self.kind}' needs a threshold")
        if self.kind == "diverge" and not self.against:
            raise ValueError(f"alert rule on {self.metric}: kind 'diverge' needs `against` (held-out metric)")
        return self


ALERT_PRESETS: dict[str, dict[str, Any]] = {
    "nan_loss": {"metric": "actor/pg_loss", "kind": "nonfinite", "action": "skip"},
    "nan_reward": {"metric": "reward/mean", "kind": "nonfinite", "action": "stop"},
    "nan_grad": {"metric": "actor/grad_norm", "kind": "nonfinite", "action": "skip"},
    "grad_spike": {"metric": "actor/grad_norm", "kind": "spike", "threshold": 10.0, "action": "warn"},
    "kl_high": {"metric": "actor/kl", "kind": "above", "threshold": 1.0, "action": "warn"},
    "entropy_collapse": {"metric": "actor/entropy", "kind": "below", "threshold": 0.01, "action": "warn"},
    "length_blowup": {"metric": "response/length_mean", "kind": "growth", "threshold": 3.0, "action": "warn"},
    "reward_hacking": {
        "metric": "reward/mean",
        "kind": "diverge",
        "against": "eval/reward_mean",
        "threshold": 0.1,
        "window": 5,
        "min_history": 2,
        "action": "warn",
    },
    "staleness": {"metric": "staleness/max", "kind": "above", "action": "warn"},
    "host_memory": {"metric": "system/host_mem_frac", "kind": "above", "threshold": 0.95, "action": "warn"},
    "gpu_memory": {"metric": "system/gpu_mem_frac", "kind": "above", "threshold": 0.95, "action": "warn"},
}
DEFAULT_ALERTS = tuple(ALERT_PRESETS)


def _alert_rules(value: Any) -> Any:
    """Expand preset names (strings) in ``monitor.alerts`` into rule dicts; dicts pass through."""
    if not isinstance(value, list):
        return value
    out = []
    for i, item in enumerate(value):
        if isinstance(item, str):
            if item not in ALERT_PRESETS:
                raise ValueError(
                    f"item {i}: unknown alert preset '{item}'; valid: {', '.join(ALERT_PRESETS)}"
                )
            out.append({"name": item, **ALERT_PRESETS[item]})
        else:
            out.append(item)
    return out


class MonitorConfig(Section):
    alerts: list[AlertRuleConfig] = Field(
        default_factory=lambda: list(DEFAULT_ALERTS),
        validate_default=True,
        description="Alert rules: preset names (see ALERT_PRESETS in tandem/config/schema.py and "
        "docs/evaluation.md) or rule objects {metric, kind, threshold, action, ...}; [] disables alerts.",
    )
    alert_webhook: str | None = Field(
        None, description="URL that receives every alert as a JSON POST (warn and all other actions)."
    )
    max_rollbacks: int = Field(
        3, ge=0, description="Rollbacks allowed before a rollback alert stops the run."
    )

    @field_validator("alerts", mode="before")
    @classmethod
    def _expand_alert_presets(cls, value: Any) -> Any:
        return _alert_rules(value)

    eval_every: int = Field(
        25, ge=0, description="Evaluate on held-out prompts every N steps (0 = only start/end)."
    )
    sample_every: int = Field(
        25, ge=0, description="Log a sample of prompts/completions/rewards every N steps."
    )
    num_samples: int = Field(4, ge=0, description="Completions logged each time.")
    tensorboard: bool = Field(True, description="Write TensorBoard event files.")
    progress: bool = Field(True, description="Show a progress bar.")


class CheckpointConfig(Section):
    every: int = Field(0, ge=0, description="Save a checkpoint every N steps (0 = only at the end).")
    keep_last: int = Field(2, ge=1, description="Keep the last K checkpoints.")
    save_final: bool = Field(True, description="Save a checkpoint at the end.")
    remote_dir: str | None = Field(
        None,
        description="Also copy every checkpoint (marker last), metrics.jsonl and config.yaml to "
        "<remote_dir>/<run.name>/ — any fsspec URL (s3://, gs://, …); --resume fetches the newest complete "
        "one from there when the run folder has none as new.",
    )

    @field_validator("remote_dir")
    @classmethod
    def _remote_url(cls, value: str | None) -> str | None:
        if value is not None and ("://" not in value or value.startswith("file://")):
            raise ValueError(
                f"'{value}' is not an object-storage URL (e.g. s3://bucket/runs); for a local or mounted "
                "folder set run.output_dir instead"
            )
        return value


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

    @model_validator(mode="after")
    def _cross_checks(self) -> TandemConfig:
        check_config(self)
        return self

    @property
    def samples_per_step(self) -> int:
        return self.data.prompts_per_step * self.rollout.n


class CrossFieldError(ValueError):
    """A cross-field check failed; ``key`` is the dotted key to blame."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(message)
        self.key = key


def _check_algorithm(cfg: TandemConfig) -> None:
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


def _check_architecture(cfg: TandemConfig) -> None:
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


def _check_data_parallel(cfg: TandemConfig) -> None:
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


def check_config(cfg: TandemConfig) -> None:
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
