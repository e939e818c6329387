"""``trainer`` (optimisation of the policy) and ``critic`` (the value model, when an estimator needs one)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from tandem.config.base import Section


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


class FsdpConfig(Section):
    cpu_offload: bool = Field(
        False,
        description="Keep the sharded parameters, gradients and optimiser state in CPU memory (FSDP2 "
        "CPUOffloadPolicy); the optimiser steps on the CPU. For GPU learners short of memory.",
    )
    param_dtype: Literal["float32", "bfloat16"] = Field(
        "float32",
        description="dtype the gathered parameters compute in (FSDP2 MixedPrecisionPolicy); the sharded "
        "master parameters and optimiser state stay float32.",
    )
    reduce_dtype: Literal["float32", "bfloat16"] = Field(
        "float32", description="dtype gradients are reduce-scattered (summed over ranks) in."
    )


class TrainerConfig(Section):
    strategy: Literal["auto", "single", "ddp", "fsdp2"] = Field(
        "auto",
        description="How the learner's ranks (trainer.world_size) share the policy: single "
        "(one process), ddp (a full replica per rank, gradients all-reduced), fsdp2 (parameters, "
        "gradients and optimiser state sharded over the ranks with torch fully_shard; see "
        "docs/architectures.md). auto: ddp when world_size > 1, else single.",
    )
    world_size: int = Field(
        1,
        ge=1,
        description="Learner processes (torch.distributed ranks, gloo on CPU, NCCL on GPU), started by "
        "tandem train itself; gradients equal one process training on the same global batch. Colocated: "
        "rank 0 generates the step's batch, the learner phases are split over the ranks. "
        "architecture.learner.world_size is the same setting (either key sets both; two different values "
        "above 1 are an error).",
    )
    fsdp: FsdpConfig = Field(default_factory=FsdpConfig, description="FSDP2 options (strategy fsdp2).")
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
    micro_batch_tokens: int | None = Field(
        None,
        ge=1,
        description="Token budget per forward/backward instead of a row count: rows are grouped so their "
        "real tokens (prompt + response) fit the budget and run packed, without padding (position ids "
        "restart per sequence; attention stays within each sequence). Same gradients; a length-skewed "
        "batch costs what its tokens cost. A longer row runs alone. Excludes micro_batch_size.",
    )
    gradient_checkpointing: bool = Field(
        False,
        description="Recompute each decoder layer's activations in the backward instead of keeping them "
        "(Hugging Face gradient checkpointing, non-reentrant): less activation memory for about one more "
        "forward of compute. Same gradients. Turns off shared_prefix (its KV cache is not checkpointed).",
    )
    max_grad_norm: float | None = Field(1.0, gt=0, description="Gradient clipping norm (null = off).")
    ema_decay: float = Field(
        0.0,
        ge=0,
        lt=1,
        description="Keep a moving average of the policy's trainable weights (0 = off): after update n it "
        "moves toward the live weights by 1 - min(ema_decay, n/(n+1)), so it starts as the plain mean "
        "of the weights so far and becomes an exponential average over about 1/(1 - ema_decay) updates. Held-out evaluation, "
        "checkpoint.best_metric's best model and each checkpoint's model/ use the average (the live weights "
        "are kept beside it to resume from); rollouts sample the live weights. The average evaluates higher "
        "mid-run than the noisy live policy and matches it once the learning rate has decayed. Under "
        "strategy fsdp2 it is sharded like the policy where rank 0 keeps no whole copy (decoupled).",
    )
    skip_zero_advantage: bool = Field(
        True,
        description="Leave groups whose advantages are all exactly 0 (GRPO/RLOO: all-equal rewards) out of "
        "the update's forward and backward when they cannot change it: a policy loss that is a multiple of "
        "the advantage, no KL term in the loss, entropy_coef 0 and no entropy_target, sft_coef 0, a "
        "single-process learner without a shared value head. Same gradient (normalisers still count every "
        "row), less compute; actor/* metrics then describe the rows trained on (actor/trained_frac). Off: "
        "every row runs.",
    )
    shared_prefix: bool = Field(
        True,
        description="Score each run of consecutive rows with the same prompt (a group's samples, of any "
        "size) with one prompt forward whose KV cache its responses reuse; same log-probs and gradients, "
        "less compute. Off: every row runs its own prompt. Under fsdp2 a micro-batch with nothing to "
        "share runs both passes too (every rank must run as many forwards).",
    )
    dedupe_rows: bool = Field(
        True,
        description="Run the model once per distinct row (same prompt and same response tokens: a group's "
        "samples that gave the same answer, common with short answers) and copy its log-probs to the "
        "copies; same loss and gradients (a copy's gradient is summed into the one forward), less "
        "compute; actor/distinct_frac is the share of rows that ran. Off with a shared value head. Data-parallel "
        "learners share the batch's distinct rows out among their ranks in the no-grad scoring passes.",
    )

    @property
    def prefix_sharing(self) -> bool:
        """Whether the learner scores each group's prompt once (``shared_prefix``). Under fsdp2, where
        every forward is a collective, a sharded model runs the prompt pass and the response pass on
        every micro-batch, shared or not, so all ranks run as many forwards."""
        return self.shared_prefix
