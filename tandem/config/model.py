"""``model``: the policy model folder, and how to build it when it does not exist yet."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator

from tandem.config.base import Section

# tandem.models.init_model's size and kind options (its other arguments, out_dir and seed, come from the
# run); kept equal to its signature by tests/unit/config/test_warm_start_options.py.
INIT_MODEL_OPTIONS = (
    "arch",
    "tokenizer",
    "vocab_size",
    "hidden_size",
    "num_layers",
    "num_heads",
    "num_kv_heads",
    "intermediate_size",
    "max_position_embeddings",
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
        default_factory=dict,
        description="init_model options of the new base: arch (llama, qwen2), tokenizer (char, bpe), "
        "hidden_size, num_layers, ...",
    )

    @field_validator("model_options")
    @classmethod
    def _known_model_options(cls, value: dict[str, Any]) -> dict[str, Any]:
        unknown = sorted(set(value) - set(INIT_MODEL_OPTIONS))
        if unknown:
            raise ValueError(
                f"unknown option(s) {', '.join(unknown)}; known: {', '.join(INIT_MODEL_OPTIONS)}"
            )
        return value


class LoraConfig(Section):
    r: int = Field(
        0,
        ge=0,
        description="LoRA rank; 0 trains every weight (full fine-tuning), > 0 trains PEFT adapters only.",
    )
    alpha: float = Field(16.0, gt=0, description="LoRA scale numerator: the update is B@A * alpha / r.")
    dropout: float = Field(0.0, ge=0, lt=1, description="Dropout on the adapter's input while training.")
    target_modules: list[str] | Literal["all-linear"] = Field(
        "all-linear",
        description="Module names that get adapters (e.g. [q_proj, v_proj]); all-linear: every linear "
        "layer but the LM head.",
    )

    @field_validator("target_modules", mode="before")
    @classmethod
    def _names_or_all_linear(cls, value: Any) -> Any:
        """One module name written as a string (``q_proj``) is the usual slip: say what the key takes."""
        if isinstance(value, str) and value != "all-linear":
            raise ValueError(
                f"a list of module names ([{value}] or [q_proj, v_proj]) or all-linear, got the string {value!r}"
            )
        return value

    @property
    def enabled(self) -> bool:
        return self.r > 0


class ModelConfig(Section):
    path: str = Field(..., description="Local Hugging Face causal-LM folder (safetensors weights).")
    ref_path: str | None = Field(
        None,
        description="Reference model folder; defaults to model.path (with model.lora: the policy's base "
        "with its adapter disabled, no second copy). Loaded only if algorithm.beta > 0.",
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
        "(task, steps, lr; base, or model_options for a new one: arch, tokenizer, sizes) and cache it there; "
        "the options are recorded with it, and a cached model built with other ones is refused (not the seed).",
    )
    lora: LoraConfig = Field(
        default_factory=LoraConfig,
        description="LoRA adapters (PEFT, `pip install tandem-rl[lora]`): the policy trains only the adapters, "
        "the reference is the base with the adapter disabled (no second copy), checkpoints hold the adapter, "
        "engines and exports get merged weights.",
    )
