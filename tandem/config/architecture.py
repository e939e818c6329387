"""``architecture``: colocated or decoupled, and the decoupled runtime's parts (Ray, channel, workers)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from tandem.config.base import Section


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
        exclude=True,  # saved configs hold trainer.world_size only
        description="Data-parallel learner processes: the same setting as trainer.world_size (either "
        "key sets both; saved configs write trainer.world_size).",
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
    target: Literal["signals", "planner"] = Field(
        "signals",
        description="How the worker count is chosen: signals (add when the learner starves, retire when the "
        "channel is full) or planner (every planner_window steps, fit the run's phase times and move one "
        "worker towards the count the planner's simulator predicts fastest; see docs/planning.md).",
    )
    planner_window: int = Field(
        5, ge=2, description="target planner: steps of timings fitted before each decision."
    )
    planner_tolerance: float = Field(
        0.05,
        ge=0,
        lt=1,
        description="target planner: the fewest workers predicted within this share of the best samples/s.",
    )


class ChannelConfig(Section):
    """The trajectory channel: a backend name and that backend's options. Backends live above the config
    layer (``tandem.channels.BACKENDS``), so a decoupled run validates ``options`` against the backend's own
    model when it starts, before anything is written; a new backend needs no field here."""

    backend: str = Field(
        "queue",
        min_length=1,
        description="Trajectory channel, a name in tandem.channels.BACKENDS: queue (multiprocessing, "
        "default), redis (Redis Streams, durable) or ray (an actor queue, runtime ray). An unknown name is "
        "an error listing the valid ones.",
    )
    options: dict[str, Any] = Field(
        default_factory=dict,
        description="Settings of the chosen backend, validated by it when a decoupled run starts (each "
        "backend's are listed below). Keys given directly under architecture.channel (e.g. redis_url) are "
        "options too.",
    )

    @model_validator(mode="before")
    @classmethod
    def _flat_options(cls, data: Any) -> Any:
        """``channel: {backend: redis, redis_url: ...}`` (the form before ``options`` existed) means
        ``channel: {backend: redis, options: {redis_url: ...}}``; a direct key wins over the same key in
        ``options`` (so ``architecture.channel.redis_url=...`` overrides a resolved config)."""
        if not isinstance(data, dict):
            return data
        flat = {k: v for k, v in data.items() if k not in cls.model_fields}
        nested = data.get("options", {})
        if not flat or not isinstance(nested, dict):
            return data
        kept = {k: v for k, v in data.items() if k in cls.model_fields}
        return {**kept, "options": {**nested, **flat}}


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
