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

from tandem.algos import ADVANTAGE_ESTIMATORS
from tandem.config.schema import DataConfig, ModelConfig, RewardConfig, TandemConfig
from tandem.data import PromptDataset, check_prompt_lengths, load_prompt_dataset, rows_from_task
from tandem.errors import ConfigError, DataError
from tandem.models import init_tiny_model, load_causal_lm, load_model, load_tokenizer
from tandem.models.lora import AdapterDisabled, apply_lora, is_lora
from tandem.models.value import build_shared_value_head, build_value_model
from tandem.models.vocab import check_same_vocab
from tandem.rewards import RewardFunction, RewardSet, format_regex, get_task, load_callable
from tandem.rewards.tasks.base import Task
from tandem.rollout import EngineSpec, RolloutEngine, build_engine
from tandem.rollout.registry import engine_class
from tandem.train.critic import add_value_head_group, build_critic_optimizer

log = logging.getLogger(__name__)


@dataclass
class DataParts:
    task: Task | None
    train: PromptDataset
    eval: PromptDataset | None
    skipped_long_prompts: int = 0  # rows dropped by data.skip_long_prompts (train + eval)


def ensure_model(cfg: ModelConfig, *, seed: int = 0) -> Path:
    """Return the policy folder, building it first when the config asks for that and it is missing."""
    path = Path(cfg.path)
    if path.exists():
        if cfg.warm_start_sft is not None:
            from tandem.train.sft import check_warm_start

            check_warm_start(path, cfg.warm_start_sft.model_dump())
        return path
    if cfg.warm_start_sft is not None:
        from tandem.train.sft import build_warm_start

        log.info("building warm-start model at %s (tandem sft, cached)", path)
        build_warm_start(path, seed=seed, **cfg.warm_start_sft.model_dump())
    elif cfg.init_tiny:
        init_tiny_model(path, seed=seed)
    return path


def build_policy(cfg: ModelConfig, *, seed: int = 0) -> tuple[torch.nn.Module, Any]:
    """Policy model (trainable) and its tokenizer. With ``model.lora.r > 0`` the model is wrapped with a
    fresh PEFT LoRA adapter: only the adapter's parameters are trainable (so only they reach the optimiser)."""
    path = ensure_model(cfg, seed=seed)
    model = load_causal_lm(path, dtype=cfg.dtype)
    if cfg.lora.enabled:
        lo = cfg.lora
        model = apply_lora(
            model, r=lo.r, alpha=lo.alpha, dropout=lo.dropout, target_modules=lo.target_modules
        )
    return model, load_tokenizer(path)


def build_rollout_engine(
    cfg: TandemConfig, *, model: torch.nn.Module | None = None, tokenizer: Any = None, version: int = 0
) -> RolloutEngine:
    """The configured rollout engine (``rollout.backend``, ``rollout.engine_options``): sampling with
    ``model`` when given (the colocated trainer's own module), else with its own copy of ``model.path``
    (a rollout worker)."""
    spec = EngineSpec(
        model=model,
        tokenizer=tokenizer,
        path=str(cfg.model.path),
        dtype=cfg.model.dtype,
        max_prompt_len=cfg.data.max_prompt_len,
        version=version,
        options=cfg.rollout.engine_options,
    )
    _check_engine_temperature(cfg)
    return build_engine(cfg.rollout.backend, spec)


def _check_engine_temperature(cfg: TandemConfig) -> None:
    """The hottest temperature the run samples at — ``rollout.temperature``, or with an adaptive temperature
    its ``max_temperature`` — within the engine's limit (``max_temperature`` of its class; vLLM: 2), before
    the engine starts: an adaptive temperature used to pass it mid-run and stop the run there."""
    limit = getattr(engine_class(cfg.rollout.backend), "max_temperature", None)
    at = cfg.rollout.adaptive_temperature
    key, hottest = ("rollout.temperature", cfg.rollout.temperature)
    if at.target_entropy is not None:
        key, hottest = ("rollout.adaptive_temperature.max_temperature", at.max_temperature)
    if limit is not None and hottest > limit:
        raise ConfigError(
            f"{hottest} is above the {cfg.rollout.backend} engine's highest temperature, {limit}",
            where=key,
            hint=f"use at most {limit}",
        )


def build_reference(
    cfg: ModelConfig, beta: float, *, policy: torch.nn.Module | None = None
) -> torch.nn.Module | None:
    """Frozen reference model, or None when β = 0 (no KL, nothing loaded). For a LoRA ``policy`` without
    ``model.ref_path``, the policy's own base with the adapter disabled (no second copy in memory)."""
    if beta <= 0:
        return None
    if policy is not None and is_lora(policy) and cfg.ref_path is None:
        return AdapterDisabled(policy)
    ref = load_causal_lm(cfg.ref_path or cfg.path, dtype=cfg.dtype)
    ref.eval()
    ref.requires_grad_(False)
    return ref


def build_teacher(cfg: TandemConfig, tokenizer: Any) -> torch.nn.Module | None:
    """The frozen teacher of on-policy distillation (``algorithm.opd.teacher``), or None without one.
    Its tokenizer must equal the student's ``tokenizer`` (ConfigError naming the key otherwise), since the
    two models' log-probs of the same token ids are compared."""
    path = cfg.algorithm.opd.teacher
    if path is None:
        return None
    if not Path(path).exists():
        raise ConfigError(
            f"no teacher model folder at {path}",
            where="algorithm.opd.teacher",
            hint="train or export the teacher first (configs/opd.yaml: tandem train configs/quickstart.yaml)",
        )
    check_same_vocab(tokenizer, load_tokenizer(path), where="algorithm.opd.teacher")
    teacher = load_model(path, dtype=cfg.model.dtype)  # an HF folder or an INT8 export
    teacher.eval()
    teacher.requires_grad_(False)
    return teacher


def build_critic(
    cfg: TandemConfig,
    *,
    seed: int = 0,
    policy: torch.nn.Module | None = None,
    optimizer: torch.optim.Optimizer | None = None,
) -> tuple[torch.nn.Module | None, torch.optim.Optimizer | None]:
    """Value model and its optimiser when the advantage estimator needs values (registry metadata),
    else ``(None, None)``. The backbone comes from ``critic.path`` (default: the policy folder).

    ``critic.shared_backbone``: a value head on ``policy`` instead, whose parameters join ``optimizer``
    (the policy's, built before and given here; build the scheduler after) — returned as ``(head, None)``."""
    if not ADVANTAGE_ESTIMATORS.get(cfg.algorithm.advantage).needs_critic or cfg.critic is None:
        return None, None
    if cfg.critic.shared_backbone:
        if policy is None or optimizer is None:
            raise ValueError("critic.shared_backbone: build_critic needs the policy and its optimizer")
        head = build_shared_value_head(policy, seed=seed)
        add_value_head_group(optimizer, head, cfg.critic, cfg.trainer)
        return head, None
    path = cfg.critic.path or ensure_model(cfg.model, seed=seed)
    critic = build_value_model(path, dtype=cfg.model.dtype, seed=seed)
    return critic, build_critic_optimizer(critic, cfg.critic, cfg.trainer)


def build_data(cfg: DataConfig, *, seed: int) -> DataParts:
    """Training and held-out prompts from a built-in task or from files."""
    if cfg.task is not None:
        task = get_task(cfg.task, **cfg.task_options)
        train = rows_from_task(task, "train", cfg.train_size, seed)
        ev = rows_from_task(task, "test", cfg.eval_size, seed) if cfg.eval_size else None
        return DataParts(task=task, train=train, eval=ev)
    train = load_prompt_dataset(cfg.train_file)
    ev = load_prompt_dataset(cfg.eval_file) if cfg.eval_file and cfg.eval_size else None
    return DataParts(task=None, train=train, eval=ev)


def enforce_prompt_lengths(
    data: DataParts, tokenizer: Any, cfg: DataConfig, *, add_special_tokens: bool = True
) -> DataParts:
    """Check every training and held-out prompt against ``data.max_prompt_len`` before the run starts.

    Lengths are counted as the rollout engine tokenises (same tokenizer, same ``add_special_tokens``), so
    a prompt that passes here never fails mid-run. A longer prompt is a DataError naming its row
    (``file:LINE`` or ``task:NAME/SPLIT:row I``) and the key; with ``data.skip_long_prompts`` such rows are
    dropped instead, counted in ``DataParts.skipped_long_prompts`` and logged.
    """
    train, n_train = _fit_prompts(data.train, "train", tokenizer, cfg, add_special_tokens)
    ev, n_eval = (None, 0)
    if data.eval is not None:
        ev, n_eval = _fit_prompts(data.eval, "eval", tokenizer, cfg, add_special_tokens)
    return DataParts(task=data.task, train=train, eval=ev, skipped_long_prompts=n_train + n_eval)


def _fit_prompts(
    ds: PromptDataset, split: str, tokenizer: Any, cfg: DataConfig, add_special_tokens: bool
) -> tuple[PromptDataset, int]:
    """``ds`` without its over-long rows (and how many were dropped), or DataError at the first one."""
    limit = cfg.max_prompt_len
    lengths = [_prompt_tokens(tokenizer, p, add_special_tokens) for p in ds.prompts]
    if not cfg.skip_long_prompts:
        check_prompt_lengths(ds, lengths, limit, key="data.max_prompt_len")
        return ds, 0
    keep = [i for i, n in enumerate(lengths) if n <= limit]
    if len(keep) == len(ds):
        return ds, 0
    if not keep:
        raise DataError(
            f"all {len(ds)} {split} prompts are longer than data.max_prompt_len={limit} tokens",
            where=ds.source,
            hint="raise data.max_prompt_len",
        )
    first = next(i for i, n in enumerate(lengths) if n > limit)
    dropped = len(ds) - len(keep)
    log.warning(
        "skipped %d of %d %s prompts longer than data.max_prompt_len=%d tokens (first: %s, %d tokens)",
        *(dropped, len(ds), split, limit, ds.locations[first], lengths[first]),
    )
    rows, locations = [ds.rows[i] for i in keep], [ds.locations[i] for i in keep]
    return PromptDataset(rows=rows, source=ds.source, locations=locations), dropped


def _prompt_tokens(tokenizer: Any, prompt: str | list[dict[str, str]], add_special_tokens: bool) -> int:
    """Token count of one prompt: a string as the engine encodes it; messages through the chat template."""
    if isinstance(prompt, str):
        return len(tokenizer(prompt, add_special_tokens=add_special_tokens)["input_ids"])
    if getattr(tokenizer, "chat_template", None):
        ids = tokenizer.apply_chat_template(
            prompt, tokenize=True, add_generation_prompt=True, return_dict=False
        )
        return len(ids)
    text = "\n".join(m["content"] for m in prompt)  # no template: the contents are a lower bound
    return len(tokenizer(text, add_special_tokens=add_special_tokens)["input_ids"])


def build_rewards(cfg: RewardConfig, task: Task | None) -> RewardSet:
    """The weighted reward set: task verifier, format reward and user functions."""
    fns: list[RewardFunction] = []
    if cfg.task_reward and task is not None:
        fns.append(RewardFunction(name=task.name, fn=task.reward, weight=1.0))
    if cfg.format_regex is not None:
        fns.append(RewardFunction(name="format", fn=format_regex(cfg.format_regex), weight=cfg.format_weight))
    for i, spec in enumerate(cfg.functions):
        fn = load_callable(spec.path, key=f"reward.functions.{i}.path")
        name = spec.name or getattr(fn, "__name__", spec.path)
        fns.append(RewardFunction(name=name, fn=fn, weight=spec.weight, source=spec.path))
    if cfg.model is not None:
        from tandem.train.rm import build_reward_model_reward

        fns.append(
            RewardFunction(
                name="reward_model", fn=build_reward_model_reward(cfg.model), weight=cfg.model.weight
            )
        )
    return RewardSet(fns, on_error=cfg.on_error, timeout_s=cfg.timeout_s)


def build_eval_rewards(cfg: TandemConfig, task: Task | None, train_rewards: RewardSet) -> RewardSet:
    """Held-out accuracy uses the task's verifier alone when there is one (so shaping terms do not count)."""
    if task is not None:
        return RewardSet([RewardFunction(name=task.name, fn=task.reward, weight=1.0)], on_error="raise")
    return train_rewards
