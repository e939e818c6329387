"""The ``env`` config section turned into an :class:`~tandem.rollout.episodes.EpisodeRunner`.

``env.name`` picks a built-in environment (:data:`tandem.agents.env.ENVIRONMENTS`, imported only when
chosen); ``env.path`` loads the user's class or factory like a reward function
(:func:`tandem.rewards.load_callable`). No ``env`` section: :class:`~tandem.agents.env.SingleTurn`, the
one-step case of the same loop. One environment is built at once as a pre-flight check, so a bad
option, a missing ``reset``/``step`` or an import error is one line naming the key before anything runs.
"""

from __future__ import annotations

import importlib
from dataclasses import replace
from typing import Any

from tandem.agents.env import ENVIRONMENTS, SingleTurn
from tandem.config.env import EnvConfig
from tandem.errors import ConfigError, TandemError
from tandem.rewards import load_callable
from tandem.rollout.base import RolloutEngine
from tandem.rollout.episodes import EnvFactory, EpisodeRunner, EpisodeSettings


def env_factory(cfg: EnvConfig | None) -> EnvFactory:
    """A zero-argument factory building one environment per episode (checked by building one now)."""
    if cfg is None:
        return SingleTurn
    if cfg.name is not None:
        if cfg.name not in ENVIRONMENTS:
            raise ConfigError(
                f"unknown environment '{cfg.name}'; valid: {', '.join(sorted(ENVIRONMENTS))}",
                where="env.name",
            )
        module, _, attr = ENVIRONMENTS[cfg.name].partition(":")
        cls, key = getattr(importlib.import_module(module), attr), "env.name"
    else:
        cls, key = load_callable(cfg.path or "", key="env.path"), "env.path"
    options = dict(cfg.options)

    def make() -> Any:
        return cls(**options)

    try:
        probe = make()
    except TandemError:
        raise
    except TypeError as err:
        raise ConfigError(f"building the environment failed: {err}", where="env.options") from None
    except Exception as err:
        raise ConfigError(f"building the environment raised {type(err).__name__}: {err}", where=key) from None
    missing = [m for m in ("reset", "step") if not callable(getattr(probe, m, None))]
    if missing:
        raise ConfigError(
            f"{type(probe).__name__} is not an environment: no {' or '.join(missing)} method", where=key
        )
    return make


def episode_settings(cfg: EnvConfig | None) -> EpisodeSettings:
    """The episode limits of ``env`` (one turn, no limits without it)."""
    if cfg is None:
        return EpisodeSettings()
    return EpisodeSettings(
        max_turns=cfg.max_turns,
        timeout_s=cfg.timeout_s,
        max_observation_tokens=cfg.max_observation_tokens,
        concurrent=cfg.concurrent,
        schedule=cfg.schedule,
        async_min_batch=cfg.async_min_batch,
        async_max_wait_s=cfg.async_max_wait_s,
        turn_rewards=cfg.turn_rewards,
        where=f"env.{'name' if cfg.name is not None else 'path'}",
    )


def episode_runner(cfg: EnvConfig | None, engine: RolloutEngine, *, tokenizer: Any = None) -> EpisodeRunner:
    """The runner of ``engine`` against the configured environment. An engine without token-id
    generation (``generate_ids``) cannot continue an episode: ConfigError when turns > 1."""
    if cfg is not None and cfg.max_turns > 1 and not callable(getattr(engine, "generate_ids", None)):
        raise ConfigError(
            f"multi-turn episodes need an engine that generates from token ids; {type(engine).__name__} "
            "does not",
            where="rollout.backend",
        )
    settings = replace(episode_settings(cfg), max_context_tokens=context_limit(engine))
    return EpisodeRunner(engine, env_factory(cfg), settings, tokenizer=tokenizer)


def context_limit(engine: RolloutEngine) -> int | None:
    """The tokens an engine's model attends to at most (an HF model's ``max_position_embeddings``, a
    vLLM engine's ``max_model_len``), or None when the engine does not say."""
    for owner, name in ((getattr(engine, "llm", None), None), (getattr(engine, "model", None), "config")):
        if owner is None:
            continue
        if name is None:  # vLLM: the engine's model config
            limit = getattr(
                getattr(getattr(owner, "llm_engine", None), "model_config", None), "max_model_len", None
            )
        else:
            limit = getattr(getattr(owner, name, None), "max_position_embeddings", None)
        if isinstance(limit, int) and limit > 0:
            return limit
    return None
