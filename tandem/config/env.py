"""``env``: the environment multi-turn episodes run against (absent: single-turn prompts)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from tandem.config.base import CrossFieldError, Section


class EnvConfig(Section):
    name: str | None = Field(
        None,
        description="Built-in environment (tandem.agents.env.ENVIRONMENTS: single_turn, calculator, guess, "
        "...); or use env.path.",
    )
    path: str | None = Field(
        None,
        description="Your environment class or factory, `module:Class` or `file.py:Class` (reset(row) -> "
        "observation, step(action) -> (observation, reward, done, info), either may be async). Tandem "
        "imports and runs that Python code with your permissions: use only code you trust.",
    )
    options: dict[str, Any] = Field(
        default_factory=dict, description="Keyword arguments the environment is built with (one per episode)."
    )
    max_turns: int = Field(
        4, ge=1, description="Model turns per episode at most (rollout.max_new_tokens each)."
    )
    timeout_s: float = Field(
        60.0,
        gt=0,
        description="Wall-clock seconds an episode may spend in its environment's reset and steps.",
    )
    max_observation_tokens: int = Field(
        256, ge=1, description="An observation longer than this many tokens is cut to it."
    )
    concurrent: bool = Field(
        True,
        description="Run the live episodes' environment steps of a turn concurrently (false: one after "
        "another, for environments that are not safe to run in parallel).",
    )
    schedule: Literal["lockstep", "async"] = Field(
        "lockstep",
        description="How turns are batched. lockstep: each turn's engine call waits for every live "
        "episode's step (deterministic for a seed: a resumed run samples what the original did). async: "
        "an episode continues as soon as its step is done, batched with the others ready then, while "
        "the rest of the steps keep running (a slow tool no longer holds up every episode; which "
        "episodes share an engine call, and so the samples, depend on timing).",
    )
    async_min_batch: float = Field(
        0.5,
        gt=0,
        le=1,
        description="async: continue the ready episodes once they are this fraction of the episodes "
        "that may still continue (1.0: wait for all, as lockstep does, unless async_max_wait_s passes).",
    )
    async_max_wait_s: float = Field(
        0.05,
        ge=0,
        description="async: or once the first ready episode has waited this many seconds for others.",
    )
    turn_rewards: Literal["sum", "per_turn"] = Field(
        "sum",
        description="Where token-level estimators (gae, reinforce_pp, reinforce_pp_baseline) credit each "
        "step's reward. sum: on the episode's last sampled token, with the task reward. per_turn: on the "
        "last sampled token of the turn whose step earned it, so a turn is credited with the rewards from "
        "its own step on, not with earlier ones. Group estimators (grpo, rloo, ...) score the episode's "
        "sum either way.",
    )

    @model_validator(mode="after")
    def _one_source(self) -> EnvConfig:
        if (self.name is None) == (self.path is None):
            raise CrossFieldError("env.name", "set exactly one of env.name (built-in) and env.path (yours)")
        return self
