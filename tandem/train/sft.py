"""Supervised fine-tuning (warm start): cross-entropy on completion tokens only.

Rows are TRL's prompt-completion (``prompt`` + ``completion``) or language-modelling (``text``) format.
The loss reuses the RL forward (:func:`response_logprobs`), so SFT and RL score tokens identically.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from tandem.errors import DataError
from tandem.models.forward import response_logprobs
from tandem.utils.seed import seed_everything


@dataclass(frozen=True)
class SFTSettings:
    steps: int = 500
    lr: float = 1e-3
    batch_size: int = 64
    warmup_steps: int = 20
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    seed: int = 0


def sft_pair(row: dict[str, Any], where: str) -> tuple[str, str]:
    """(prompt, completion) of a row in prompt-completion or text format."""
    if "text" in row and "completion" not in row:
        if not isinstance(row["text"], str) or not row["text"]:
            raise DataError("'text' must be a non-empty string", where=where)
        return "", row["text"]
    prompt, completion = row.get("prompt"), row.get("completion", row.get("answer"))
    if not isinstance(prompt, str) or not isinstance(completion, str) or not completion:
        raise DataError("a row needs string 'prompt' and non-empty 'completion' (or 'text')", where=where)
    return prompt, completion


def encode_pairs(tokenizer: Any, pairs: list[tuple[str, str]]) -> tuple[torch.Tensor, ...]:
    """Left-padded prompts and right-padded completions (+ EOS): ``(prompt_ids, prompt_mask,
    response_ids, response_mask)``, each ``[B, P]`` / ``[B, R]``. An empty prompt becomes the BOS token."""
    pad = tokenizer.pad_token_id
    bos = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id
    prompts = [tokenizer(p, add_special_tokens=False)["input_ids"] or [bos] for p, _ in pairs]
    comps = [tokenizer(c, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id] for _, c in pairs]
    P, R = max(map(len, prompts)), max(map(len, comps))
    prompt_ids = torch.tensor([[pad] * (P - len(p)) + p for p in prompts])
    prompt_mask = torch.tensor([[False] * (P - len(p)) + [True] * len(p) for p in prompts])
    response_ids = torch.tensor([c + [pad] * (R - len(c)) for c in comps])
    response_mask = torch.tensor([[True] * len(c) + [False] * (R - len(c)) for c in comps])
    return prompt_ids, prompt_mask, response_ids, response_mask


def run_sft(
    model: torch.nn.Module,
    tokenizer: Any,
    pairs: list[tuple[str, str]],
    settings: SFTSettings,
    *,
    on_step: Callable[[int, dict[str, float]], None] | None = None,
) -> dict[str, float]:
    """Train ``model`` in place on (prompt, completion) pairs; returns the last step's metrics."""
    if not pairs:
        raise DataError("SFT dataset is empty")
    seed_everything(settings.seed)
    rng = random.Random(settings.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=settings.lr, weight_decay=settings.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / max(1, settings.warmup_steps))
    )
    model.train()
    order: list[int] = []
    metrics: dict[str, float] = {}
    for step in range(1, settings.steps + 1):
        if len(order) < settings.batch_size:
            fresh = list(range(len(pairs)))
            rng.shuffle(fresh)
            order.extend(fresh)
        idx, order = order[: settings.batch_size], order[settings.batch_size :]
        p_ids, p_mask, r_ids, r_mask = encode_pairs(tokenizer, [pairs[i] for i in idx])
        logprobs, _ = response_logprobs(model, p_ids, p_mask, r_ids, r_mask)
        loss = -(logprobs * r_mask).sum() / r_mask.sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), settings.max_grad_norm)
        opt.step()
        sched.step()
        metrics = {
            "sft/loss": float(loss.detach()),
            "sft/grad_norm": float(grad_norm),
            "sft/lr": sched.get_last_lr()[0],
        }
        if on_step is not None:
            on_step(step, metrics)
    return metrics


def build_warm_start(
    out_dir: str | Path,
    *,
    task: str,
    task_options: dict[str, Any] | None = None,
    steps: int = 300,
    lr: float = 3e-3,
    batch_size: int = 64,
    train_size: int = 4096,
    weight_decay: float = 0.0,
    base: str | None = None,
    seed: int = 0,
    model_options: dict[str, Any] | None = None,
    on_step: Callable[[int, dict[str, float]], None] | None = None,
) -> Path:
    """Build a warm-start policy: a new small model (``model_options`` are :func:`init_model`'s: a
    char-level Llama by default, or e.g. ``{arch: qwen2, tokenizer: bpe}``), or ``base``, fine-tuned on a
    built-in task's reference answers, saved atomically to ``out_dir``. Equivalent CLI::

        tandem init-model BASE --seed SEED [--arch qwen2 --tokenizer bpe ...] && \\
        tandem sft BASE --task arith --task-option digits=2 --steps 300 --weight-decay 0.0 --seed SEED --out OUT
    """
    from tandem.data import rows_from_task
    from tandem.data.outputs import check_output_dir
    from tandem.models import init_model, load_causal_lm, load_tokenizer, save_pretrained_atomic
    from tandem.rewards import get_task

    out_dir = Path(out_dir)
    check_output_dir(out_dir, "model", sources=(base,))  # before training: refused folders cost nothing
    base_dir = (
        Path(base)
        if base
        else init_model(
            out_dir.with_name(out_dir.name + ".base"),
            seed=seed,
            created_by="tandem sft (warm-start base)",
            **(model_options or {}),
        )
    )
    model, tok = load_causal_lm(base_dir), load_tokenizer(base_dir)
    rows = rows_from_task(get_task(task, **(task_options or {})), "train", train_size, seed).rows
    pairs = [sft_pair(r, f"task {task} row {i}") for i, r in enumerate(rows)]
    run_sft(
        model,
        tok,
        pairs,
        SFTSettings(steps=steps, lr=lr, batch_size=batch_size, weight_decay=weight_decay, seed=seed),
        on_step=on_step,
    )
    save_pretrained_atomic(model, tok, out_dir, created_by="tandem sft (warm start)", source=base)
    if not base:
        import shutil

        shutil.rmtree(base_dir, ignore_errors=True)
    return out_dir
