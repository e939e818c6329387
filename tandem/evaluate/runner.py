"""Load models for ``tandem eval`` and run the suite; returns a JSON-ready result."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from tandem.errors import ModelError
from tandem.evaluate.heldout import ProgressFn
from tandem.evaluate.refusal import refusal_capability
from tandem.evaluate.suite import EvalSettings, evaluate_suite
from tandem.evaluate.targets import Target, eval_data, resolve_target
from tandem.models import load_causal_lm, load_tokenizer
from tandem.rollout import DEFAULT_ENGINE, EngineSpec, RolloutEngine, build_engine


def load_target(target: Target) -> tuple[torch.nn.Module, Any]:
    """The target's model (eval mode, dtype from its run config) and tokenizer."""
    dtype = target.config.model.dtype if target.config is not None else "float32"
    model = load_causal_lm(target.model_dir, dtype=dtype)
    model.eval()
    return model, load_tokenizer(target.model_dir)


def target_engine(
    target: Target, model: torch.nn.Module, tokenizer: Any, max_prompt_len: int | None
) -> RolloutEngine:
    """The rollout engine to evaluate ``target`` with: its run's ``rollout.backend`` (and options) when it
    belongs to a run, else the default engine; it samples with ``model`` (already loaded)."""
    rollout = target.config.rollout if target.config is not None else None
    spec = EngineSpec(
        model=model,
        tokenizer=tokenizer,
        path=str(target.model_dir),
        max_prompt_len=max_prompt_len,
        options=rollout.engine_options if rollout is not None else {},
    )
    return build_engine(rollout.backend if rollout is not None else DEFAULT_ENGINE, spec)


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
    on_progress: ProgressFn | None = None,
) -> dict[str, Any]:
    """Evaluate the run / checkpoint / model at ``path``; see :func:`tandem.evaluate.suite.evaluate_suite`."""
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
    policy, tokenizer = load_target(target)
    settings = EvalSettings(
        max_new_tokens=max_new_tokens or data.max_new_tokens,
        stop=data.stop,
        samples=samples,
        temperature=temperature,
        pass_k=pass_k,
        seed=seed if seed is not None else 0,
    )
    engine = target_engine(target, policy, tokenizer, data.max_prompt_len)
    ref_model = load_reference(ref, policy) if ref is not None else None
    metrics = evaluate_suite(
        engine,
        data.rows,
        data.rewards,
        settings,
        policy=policy,
        ref_model=ref_model,
        refusals=refusal_capability(data.task),
        on_progress=on_progress,
    )
    return {
        "model": str(target.model_dir),
        "run": str(target.run_dir) if target.run_dir else None,
        "reference": str(ref) if ref is not None else None,
        "data": data.source,
        "settings": {**settings.__dict__, "pass_k": list(settings.pass_k)},
        "metrics": metrics,
    }
