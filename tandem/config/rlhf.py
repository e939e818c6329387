"""Configs of the preference commands (``tandem rm``, ``tandem dpo``, ``tandem label``).

Kept apart from the RL :class:`~tandem.config.schema.TandemConfig`: these commands train or label from
a preference file and share nothing with the RL loop but the model folder. Same conventions: pydantic,
``extra="forbid"``, a description on every field, YAML with dotted overrides, one-line errors naming
``file:line`` and the key.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from tandem.algos import PREFERENCE_LOSSES
from tandem.config.loader import apply_overrides, config_error, read_yaml
from tandem.config.model import LoraConfig


class _Flat(BaseModel):
    # allow_inf_nan=False: a float key set to .inf/.nan (e.g. trainer.lr=.inf) is an error naming the key.
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


class PreferenceDataConfig(_Flat):
    train_file: str = Field(
        description="Preference pairs (JSONL, Parquet or a datasets.save_to_disk folder)."
    )
    val_file: str | None = Field(None, description="Held-out pairs; if unset, split train_file by prompt.")
    val_fraction: float = Field(0.2, ge=0.0, lt=1.0, description="Held-out share when val_file is unset.")
    skip_invalid: bool = Field(False, description="Write invalid rows to a sidecar file instead of failing.")
    max_length: int | None = Field(
        None, ge=1, description="Max tokens of prompt + completion; longer rows are invalid."
    )


class RMConfig(_Flat):
    model: str = Field(
        description="Starting HF folder: a causal LM, an encoder (BERT, RoBERTa) or a sequence classifier."
    )
    out_dir: str = Field(
        description="Where the reward model (HF folder) is saved: a new or empty folder, or an earlier "
        "`tandem rm` output (replaced atomically); never an unrelated folder or the starting model."
    )
    data: PreferenceDataConfig = Field(description="Preference data.")
    epochs: int = Field(3, ge=1, description="Passes over the training pairs.")
    lora: LoraConfig = Field(
        default_factory=LoraConfig,
        description="LoRA adapters (PEFT) plus a trained head: the saved reward model has them merged in.",
    )
    lr: float = Field(1e-3, gt=0, description="AdamW learning rate.")
    batch_size: int = Field(32, ge=1, description="Pairs per optimiser step.")
    use_margin: bool = Field(False, description="Subtract each pair's 'margin' column inside the sigmoid.")
    center_coef: float | None = Field(0.01, ge=0, description="Reward centring coefficient c (None: off).")
    seed: int = Field(0, ge=0, description="Seed for init, shuffling and splitting.")


class DPOConfig(_Flat):
    model: str = Field(description="Starting policy (HF causal-LM folder).")
    ref_model: str | None = Field(None, description="Reference policy folder (default: the starting policy).")
    out_dir: str = Field(
        description="Where the trained policy is saved (a new or empty folder, or an earlier Tandem model "
        "folder, replaced atomically; never an unrelated folder or the starting/reference model); ref "
        "log-probs are cached beside it."
    )
    data: PreferenceDataConfig = Field(description="Preference data.")
    lora: LoraConfig = Field(
        default_factory=LoraConfig,
        description="LoRA adapters (PEFT): only the adapters train; the saved policy has them merged in.",
    )
    beta: float = Field(0.1, gt=0, description="DPO temperature β.")
    loss_type: str = Field(
        "sigmoid", description="Preference loss from the algorithm library (sigmoid, ipo, hinge, robust)."
    )
    label_smoothing: float = Field(0.0, ge=0, lt=0.5, description="cDPO / robust label-flip rate ε.")
    length_normalize: bool = Field(
        False,
        description="Divide each completion's log-ratio by its token count before the margin is taken "
        "(TRL's ipo and sigmoid_norm); false uses summed log-ratios.",
    )

    @field_validator("loss_type")
    @classmethod
    def _known_loss(cls, value: str) -> str:
        if value not in PREFERENCE_LOSSES:
            raise ValueError(
                f"unknown preference loss '{value}'; valid: {', '.join(PREFERENCE_LOSSES.names())}"
            )
        return value

    lr: float = Field(5e-4, gt=0, description="AdamW learning rate.")
    batch_size: int = Field(16, ge=1, description="Pairs per optimiser step.")
    epochs: int = Field(1, ge=1, description="Passes over the training pairs.")
    max_steps: int | None = Field(None, ge=1, description="Stop after this many steps.")
    warmup_steps: int = Field(10, ge=0, description="Linear warm-up steps.")
    sft_coef: float = Field(
        0.0, ge=0, description="RPO: weight of the chosen completions' per-token NLL added to the loss."
    )
    seed: int = Field(0, ge=0, description="Seed.")
    save_every: int = Field(
        0,
        ge=0,
        description="Offline DPO: write a checkpoint every this many steps to <out_dir>.checkpoints (the "
        "last 2 kept, removed once the final model is saved), so `tandem dpo CONFIG --resume` continues an "
        "interrupted run exactly (0: no intermediate checkpoints).",
    )
    shared_prefix: bool = Field(
        True,
        description="Run each pair's prompt once and share its KV cache between chosen and rejected "
        "(same log-probs and gradients; false: two full rows per pair).",
    )
    online_rounds: int = Field(
        0,
        ge=0,
        description="Iterative (online) DPO: rounds of sample two -> judge -> train (0: offline DPO).",
    )
    online_judge: str | None = Field(
        None, description="Online DPO rule judge: 'task:NAME' or 'module:function(prompt, completion, row)'."
    )
    online_max_new_tokens: int = Field(32, ge=1, description="Online DPO: max new tokens per sample.")
    eval_task: str | None = Field(
        None,
        description="Built-in task whose held-out verifier score is reported before/after (e.g. safety).",
    )
    eval_size: int = Field(200, ge=1, description="Held-out prompts for eval_task.")
    engine: str = Field(
        "hf",
        min_length=1,
        description="Rollout engine that samples the online rounds and the eval_task score: a name in the "
        "engine table (tandem.rollout.registry.ENGINES, e.g. hf, vllm); it is handed the policy module and "
        "its folder, and receives the trained weights after each update.",
    )
    engine_options: dict[str, Any] = Field(
        default_factory=dict, description="Settings of the chosen engine, validated by it."
    )


class LabelConfig(_Flat):
    input_file: str = Field(
        description="Rows with 'prompt' plus 'response_a'/'response_b' (or 'completions')."
    )
    out_file: str = Field(description="Labelled preference pairs (JSONL, appended to; resumable).")
    judge: Literal["rule", "hf", "http"] = Field("rule", description="Judge kind.")
    rule: str | None = Field(
        None, description="rule judge: 'task:NAME' or 'module:function' scoring (prompt, completion, row)."
    )
    model: str | None = Field(
        None, description="hf judge: local HF causal-LM folder; http judge: model name."
    )
    base_url: str | None = Field(
        None, description="http judge: OpenAI-compatible base URL, e.g. http://127.0.0.1:8000/v1."
    )
    api_key_env: str = Field(
        "OPENAI_API_KEY", description="http judge: environment variable holding the API key."
    )
    timeout_s: float = Field(30.0, gt=0, description="http judge: per-request timeout.")
    max_retries: int = Field(3, ge=0, description="http judge: retries on timeouts, 429 and 5xx.")
    backoff_s: float = Field(0.5, ge=0, description="http judge: first retry delay, doubled each retry.")
    both_orders: bool = Field(
        True, description="Judge (a, b) and (b, a); keep a pair only if the verdicts agree."
    )
    noise: float = Field(
        0.0, ge=0, le=1, description="Flip a seeded share of verdicts (for noise experiments)."
    )
    policy: str | None = Field(
        None, description="Policy folder: sample two responses per prompt for rows without responses."
    )
    max_new_tokens: int = Field(32, ge=1, description="policy sampling: max new tokens.")
    temperature: float = Field(1.0, gt=0, description="policy sampling: temperature.")
    seed: int = Field(0, ge=0, description="Seed for noise injection and policy sampling.")
    engine: str = Field(
        "hf",
        min_length=1,
        description="Rollout engine that samples from 'policy': a name in the engine table "
        "(tandem.rollout.registry.ENGINES, e.g. hf, vllm); also `tandem label --engine`.",
    )
    engine_options: dict[str, Any] = Field(
        default_factory=dict, description="Settings of the chosen engine, validated by it."
    )


C = TypeVar("C", bound=BaseModel)


def load_command_config(cls: type[C], path: str | Path, overrides: list[str] | None = None) -> C:
    """``path`` (YAML) + dotted ``overrides`` validated as ``cls``; the first error is a one-line
    ConfigError ``file:line: key: message``."""
    data, lines = read_yaml(path)
    apply_overrides(data, list(overrides or []))
    try:
        return cls.model_validate(data)
    except ValidationError as exc:
        raise config_error(exc, cls, source=str(path), lines=lines, overrides=overrides) from None
