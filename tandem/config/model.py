"""``model``: the policy model folder, and how to build it when it does not exist yet."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from tandem.config.base import Section


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
