"""Load models for ``tandem eval`` and run the suite; returns a JSON-ready result."""

from __future__ import annotations

from collections.abc import Mapping
from itertools import accumulate
from pathlib import Path
from typing import Any

import torch

from tandem.config.schema import TandemConfig
from tandem.errors import ModelError
from tandem.evaluate.heldout import ProgressFn
from tandem.evaluate.refusal import refusal_capability
from tandem.evaluate.suite import EvalSettings, evaluate_suite
from tandem.evaluate.targets import Target, eval_data, resolve_target
from tandem.models import load_model, load_tokenizer, model_format
from tandem.rollout import DEFAULT_ENGINE, IN_PROCESS_ENGINE, EngineSpec, RolloutEngine, build_engine
from tandem.rollout.environments import episode_runner
from tandem.rollout.episodes import EnvError, EpisodeStats, mean_stats


def load_target(target: Target) -> tuple[torch.nn.Module, Any]:
    """The target's model (eval mode, dtype from its run config) and tokenizer; an INT8 export loads as
    it is served (:func:`tandem.models.load_model`)."""
    dtype = target.config.model.dtype if target.config is not None else "float32"
    model = load_model(target.model_dir, dtype=dtype)
    model.eval()
    return model, load_tokenizer(target.model_dir)


def engine_choice(
    target: Target, engine: str | None = None, options: Mapping[str, Any] | None = None
) -> tuple[str, dict[str, Any]]:
    """The engine name and options to evaluate ``target`` with: ``engine`` (``--engine``) if given, else
    its run's ``rollout.backend``, else the default engine. The run's ``rollout.engine_options`` apply
    when its engine is the one chosen; ``options`` (``--engine-option``) are laid over them."""
    rollout = target.config.rollout if target.config is not None else None
    name = engine or (rollout.backend if rollout is not None else DEFAULT_ENGINE)
    base = dict(rollout.engine_options) if rollout is not None and rollout.backend == name else {}
    return name, {**base, **dict(options or {})}


def target_engine(
    target: Target,
    max_prompt_len: int | None,
    *,
    engine: str | None = None,
    options: Mapping[str, Any] | None = None,
    model: torch.nn.Module | None = None,
    tokenizer: Any = None,
) -> RolloutEngine:
    """The rollout engine to evaluate ``target`` with (:func:`engine_choice`), built through the
    registry from the target's model folder (``path``, dtype from its run config). ``model``: the target's
    module when the caller already loaded it (for the KL), shared by an engine that can; an engine that
    cannot, or that gets none, loads the folder itself."""
    name, opts = engine_choice(target, engine, options)
    fmt = model_format(target.model_dir)
    if fmt != "hf" and name != IN_PROCESS_ENGINE:
        raise ModelError(
            f"the '{fmt}' export runs only on the in-process engine, not '{name}'",
            where=str(target.model_dir),
            hint=f"pass --engine {IN_PROCESS_ENGINE}",
        )
    spec = EngineSpec(
        model=model,
        tokenizer=tokenizer,
        path=str(target.model_dir),
        dtype=target.config.model.dtype if target.config is not None else None,
        max_prompt_len=max_prompt_len,
        options=opts,
    )
    return build_engine(name, spec)


def run_seed(target: Target) -> int:
    """The sampling seed when none is given: the target's run's ``run.seed`` (the seed its prompts are
    drawn with too), else 0."""
    return target.config.run.seed if target.config is not None else 0


def load_reference(path: str | Path, policy: torch.nn.Module) -> torch.nn.Module:
    """Reference model for the KL; must share the policy's vocabulary (same token ids)."""
    ref_target = resolve_target(path)
    ref, _ = load_target(ref_target)
    if ref.config.vocab_size != policy.config.vocab_size:
        raise ModelError(
            f"reference vocabulary ({ref.config.vocab_size}) differs from the policy's "
            f"({policy.config.vocab_size}); the KL needs the same tokenizer",
            where=str(ref_target.model_dir),
        )
    ref.requires_grad_(False)
    return ref


def run_eval(
    path: str | Path,
    *,
    task: str | None = None,
    task_options: dict[str, Any] | None = None,
    eval_file: str | None = None,
    reward: str | None = None,
    ref: str | Path | None = None,
    size: int | None = None,
    samples: int = 8,
    temperature: float = 1.0,
    max_new_tokens: int | None = None,
    seed: int | None = None,
    pass_k: tuple[int, ...] = (1, 4, 8),
    engine: str | None = None,
    engine_options: Mapping[str, Any] | None = None,
    on_progress: ProgressFn | None = None,
) -> dict[str, Any]:
    """Evaluate the run / checkpoint / model at ``path``; see :func:`tandem.evaluate.suite.evaluate_suite`.
    ``engine``/``engine_options``: see :func:`engine_choice`. The model is loaded in this process only
    for the KL (``ref``); otherwise the engine loads it."""
    target = resolve_target(path)
    data = eval_data(
        target.config,
        task=task,
        task_options=task_options,
        eval_file=eval_file,
        reward=reward,
        size=size,
        seed=seed,
    )
    policy, tokenizer = load_target(target) if ref is not None else (None, None)
    settings = EvalSettings(
        max_new_tokens=data.max_new_tokens if max_new_tokens is None else max_new_tokens,
        stop=data.stop,
        samples=samples,
        temperature=temperature,
        pass_k=pass_k,
        seed=seed if seed is not None else run_seed(target),
    )
    name, _ = engine_choice(target, engine, engine_options)
    sampler = target_engine(
        target,
        data.max_prompt_len,
        engine=engine,
        options=engine_options,
        model=policy,
        tokenizer=tokenizer,
    )
    env = target.config.env if target.config is not None else None
    log: list[EpisodeStats] = []
    if env is not None:  # the run's episodes, not single turns
        sampler = episode_runner(env, sampler)
        sampler.log = log  # every call's episode stats, for the agent metrics
    ref_model = load_reference(ref, policy) if ref is not None else None
    try:
        metrics = evaluate_suite(
            sampler,
            data.rows,
            data.rewards,
            settings,
            policy=policy,
            ref_model=ref_model,
            refusals=refusal_capability(data.task),
            on_progress=on_progress,
            state=target.state,
        )
    except EnvError as err:
        if env is None or not _other_data(target.config, task, eval_file):
            raise
        key, value = ("env.name", env.name) if env.name is not None else ("env.path", env.path)
        hint = f"the run's {key} '{value}' plays every episode, on --task/--eval-file rows too"
        raise EnvError(str(err), hint=hint) from None
    finally:
        sampler.close()
    metrics.update(agent_metrics(log, len(data.rows)))
    return {
        "model": str(target.model_dir),
        "run": str(target.run_dir) if target.run_dir else None,
        "reference": str(ref) if ref is not None else None,
        "data": data.source,
        "engine": name,
        "settings": {**settings.__dict__, "pass_k": list(settings.pass_k)},
        "metrics": metrics,
    }


def agent_metrics(log: list[EpisodeStats], greedy: int) -> dict[str, float]:
    """The agent metrics of an environment run's evaluation from its episode runner's ``log`` (``{}``
    without episodes): ``eval/agent/*`` of the greedy pass, the first ``greedy`` episodes (one per
    prompt), averaged as the training loop's held-out evaluation does
    (:func:`tandem.orchestration.parts.evaluate_heldout`), and ``sampled/agent/*`` of the sampled pass."""
    counts = [0, *accumulate(int(s.returns.numel()) for s in log)]
    split = next((i for i, n in enumerate(counts) if n >= greedy), len(log))
    out = {f"eval/{k}": v for k, v in mean_stats(log[:split]).items()}
    out.update({f"sampled/{k}": v for k, v in mean_stats(log[split:]).items()})
    return out


def _other_data(config: TandemConfig, task: str | None, eval_file: str | None) -> bool:
    """Whether ``--task``/``--eval-file`` ask for other rows than the run's own held-out data."""
    data = config.data
    return (task is not None and task != data.task) or (eval_file is not None and eval_file != data.eval_file)
