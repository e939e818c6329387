"""``rollout``: the generation engine and its sampling settings."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from tandem.config.base import Section


class AdaptiveTemperatureConfig(Section):
    target_entropy: float | None = Field(
        None,
        gt=0,
        description="Adaptive sampling temperature (null = off): after every step the temperature moves by "
        "step towards keeping the sampled tokens' mean entropy (nats per token, estimated from their "
        "log-probs; rollout/sampled_entropy) at this value, within [min_temperature, max_temperature]; it "
        "starts at rollout.temperature, and the learner scores each batch at the temperature it was "
        "sampled with. Decoupled: the learner steers it and publishes it with the weights; docs/algorithms.md.",
    )
    step: float = Field(0.02, gt=0, description="Change of the temperature per step (with target_entropy).")
    min_temperature: float = Field(
        0.5, gt=0, description="Lowest adaptive temperature (with target_entropy)."
    )
    max_temperature: float = Field(
        1.5, gt=0, description="Highest adaptive temperature (with target_entropy)."
    )


class ReferenceAnswersConfig(Section):
    column: str | None = Field(
        None,
        min_length=1,
        description="Reference answers in all-fail groups (null = off): the prompt-file column holding a "
        "correct completion (e.g. answer). After sampling (and adaptive group growth), each group whose "
        "samples all scored the same and below its reference gets one more row: the reference completion, "
        "scored by the run's reward and by the policy (its behaviour log-probs), so its group-relative "
        "advantage pushes the policy towards it (LUFFY-style off-policy guidance). Every training row needs "
        "the column; an engine that scores given completions (hf; vllm at temperature 1), single-turn "
        "prompts, not with dynamic sampling; docs/algorithms.md.",
    )
    template: str = Field(
        "{}",
        min_length=1,
        description="The reference completion's text: template.format(value of the column), ended by EOS; "
        "a template holding a rollout.stop string (e.g. '{}\\n') is cut after it and ends there instead.",
    )
    mode: Literal["group", "imitate"] = Field(
        "group",
        description="group: the reference joins its group and the group-relative advantage trains on it "
        "(its failed samples get negative advantages). imitate: the reference row carries its group's "
        "shared score (every advantage in the group stays 0) and the loss adds coef × the mean NLL of "
        "the reference tokens.",
    )
    coef: float = Field(1.0, gt=0, description="Weight of the reference NLL term (mode=imitate).")


class RolloutConfig(Section):
    backend: str = Field(
        "hf",
        min_length=1,
        description="Generation engine: a name in the engine table (tandem.rollout.registry.ENGINES; "
        "built in: hf, vllm). An unknown name is an error listing the valid ones; see docs/engines.md.",
    )
    engine_options: dict[str, Any] = Field(
        default_factory=dict,
        description="Settings of the chosen engine, validated by it. hf: fast_decode (null = auto, true or "
        "false), shared_decode (default true: one forward per distinct unfinished row). vllm: max_model_len, kv_cache_gb, gpu_memory_utilization, enforce_eager, "
        "enable_prefix_caching, sleep_during_update, tensor_parallel_size, seed (docs/engines.md).",
    )
    n: int = Field(8, ge=1, description="Samples per prompt (the group size, plus one with greedy_in_group).")
    max_new_tokens: int = Field(32, ge=1, description="Maximum generated tokens per sample.")
    temperature: float = Field(1.0, ge=0, description="Sampling temperature (0 = greedy).")
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling mass.")
    top_k: int = Field(0, ge=0, description="Top-k sampling (0 = off).")
    min_p: float = Field(
        0.0,
        ge=0,
        le=1,
        description="Min-p sampling: keep the tokens at least min_p times as likely as the most likely one "
        "(0 = off; TRL's and vLLM's min_p).",
    )
    repetition_penalty: float = Field(
        1.0,
        gt=0,
        description="Divide (multiply, when negative) the logit of a token already in the prompt or the "
        "response by this (1 = off; > 1 discourages repeats; as TRL, Hugging Face and vLLM). Like top_k, "
        "top_p and min_p it decides which token is drawn; the hf engine records the model's own behaviour "
        "log-probs, vLLM those of the penalised distribution (docs/engines.md).",
    )
    stop: list[str] = Field(
        default_factory=lambda: ["\n"], description="Stop strings (stripped from completions)."
    )
    greedy_in_group: bool = Field(
        False,
        description="Add each prompt's greedy (temperature 0) completion to its group, beside the rollout.n "
        "samples: the group-relative advantage then rewards or penalises the answer greedy evaluation "
        "reads (groups of rollout.n + 1; needs rollout.temperature=1; docs/algorithms.md).",
    )
    adaptive_temperature: AdaptiveTemperatureConfig = Field(
        default_factory=AdaptiveTemperatureConfig,
        description="Steer the sampling temperature to a target entropy (off by default; docs/algorithms.md).",
    )

    reference_answers: ReferenceAnswersConfig = Field(
        default_factory=ReferenceAnswersConfig,
        description="Add the prompt file's reference completion to groups no sample solved (off by default; "
        "docs/algorithms.md).",
    )

    @property
    def group_size(self) -> int:
        """Completions per prompt in a step's batch: ``n`` samples, plus the greedy one with
        ``greedy_in_group``."""
        return self.n + int(self.greedy_in_group)
