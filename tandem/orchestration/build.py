"""Build the components of a run from its config: models, engine, data, rewards.

Each builder does one thing; the loops receive the built parts (dependency injection), so tests can
swap any of them.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from tandem.config.schema import DataConfig, ModelConfig, RewardConfig, TandemConfig
from tandem.data import PromptDataset, load_prompt_dataset, rows_from_task
from tandem.models import init_tiny_model, load_causal_lm, load_tokenizer
from tandem.rewards import RewardFunction, RewardSet, format_regex, get_task, load_callable
from tandem.rewards.tasks.base import Task

log = logging.getLogger(__name__)


@dataclass
class DataParts:
    task: Task | None
    train: PromptDataset
    eval: PromptDataset | None


def ensure_model(cfg: ModelConfig, *, seed: int = 0) -> Path:
    """Return the policy folder, building it first when the config asks for that and it is missing."""
    path = Path(cfg.path)
    if path.exists():
        return path
    if cfg.warm_start_sft is not None:
        from tandem.train.sft import build_warm_start

        log.info("building warm-start model at %s (tandem sft, cached)", path)
        build_warm_start(path, seed=seed, **cfg.warm_start_sft)
    elif cfg.init_tiny:
        init_tiny_model(path, seed=seed)
    return path


def build_policy(cfg: ModelConfig, *, seed: int = 0) -> tuple[torch.nn.Module, Any]:
    """Policy model (trainable) and its tokenizer."""
    path = ensure_model(cfg, seed=seed)
    model = load_causal_lm(path, dtype=cfg.dtype)
    return model, load_tokenizer(path)


def build_reference(cfg: ModelConfig, beta: float) -> torch.nn.Module | None:
    """Frozen reference model, or None when β = 0 (no KL, nothing loaded)."""
    if beta <= 0:
        return None
    ref = load_causal_lm(cfg.ref_path or cfg.path, dtype=cfg.dtype)
    ref.eval()
    ref.requires_grad_(False)
    return ref


def build_data(cfg: DataConfig, *, seed: int) -> DataParts:
    """Training and held-out prompts from a built-in task or from files."""
    if cfg.task is not None:
        task = get_task(cfg.task, **cfg.task_options)
        train = rows_from_task(task, "train", cfg.train_size, seed)
        ev = rows_from_task(task, "test", cfg.eval_size, seed) if cfg.eval_size else None
        return DataParts(task=task, train=train, eval=ev)
    train = load_prompt_dataset(cfg.train_file)
    ev = load_prompt_dataset(cfg.eval_file) if cfg.eval_file else None
    return DataParts(task=None, train=train, eval=ev)


def build_rewards(cfg: RewardConfig, task: Task | None) -> RewardSet:
    """The weighted reward set: task verifier, format reward and user functions."""
    fns: list[RewardFunction] = []
    if cfg.task_reward and task is not None:
        fns.append(RewardFunction(name=task.name, fn=task.reward, weight=1.0))
    if cfg.format_regex is not None:
        fns.append(RewardFunction(name="format", fn=format_regex(cfg.format_regex), weight=cfg.format_weight))
    for spec in cfg.functions:
        fn = load_callable(spec.path)
        name = spec.name or getattr(fn, "__name__", spec.path)
        fns.append(RewardFunction(name=name, fn=fn, weight=spec.weight))
    return RewardSet(fns, on_error=cfg.on_error)


def build_eval_rewards(cfg: TandemConfig, task: Task | None, train_rewards: RewardSet) -> RewardSet:
    """Held-out accuracy uses the task's verifier alone when there is one (so shaping terms do not count)."""
    if task is not None:
        return RewardSet([RewardFunction(name=task.name, fn=task.reward, weight=1.0)], on_error="raise")
    return train_rewards
