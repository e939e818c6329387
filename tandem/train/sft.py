"""Supervised fine-tuning (warm start): cross-entropy on completion tokens only.

Rows are TRL's prompt-completion (``prompt`` + ``completion``) or language-modelling (``text``) format,
or its conversational format: ``messages`` (every assistant turn trained) or ``prompt`` / ``completion``
message lists (the completion's assistant turns trained). Conversations go through the model's chat
template (:func:`tandem.data.chat.render_training`); only assistant tokens count in the loss, and the
trained tokens end with the template's end-of-turn marker (no EOS is appended to them).
The loss reuses the RL forward (:func:`response_logprobs`), so SFT and RL score tokens identically.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch

from tandem.data.chat import ChatRow, RenderedChat, chat_row, render_training
from tandem.errors import ConfigError, DataError
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


SFTRow = tuple[str, str] | ChatRow  # (prompt, completion) text, or a conversation for the chat template


def sft_pair(row: dict[str, Any], where: str) -> SFTRow:
    """(prompt, completion) of a row in prompt-completion or text format, or the :class:`ChatRow` of a
    conversational row (``messages``, or ``prompt`` / ``completion`` message lists)."""
    chat = chat_row(row, where)
    if chat is not None:
        return chat
    if "text" in row and "completion" not in row:
        if not isinstance(row["text"], str) or not row["text"]:
            raise DataError("'text' must be a non-empty string", where=where)
        return "", row["text"]
    prompt, completion = row.get("prompt"), row.get("completion", row.get("answer"))
    if not isinstance(prompt, str) or not isinstance(completion, str) or not completion:
        raise DataError("a row needs string 'prompt' and non-empty 'completion' (or 'text')", where=where)
    return prompt, completion


def encode_chat(tokenizer: Any, chat: RenderedChat) -> tuple[list[int], list[int], list[bool]]:
    """``(prompt_ids, response_ids, trained)`` of a rendered conversation: each piece tokenised on its
    own; the prompt is every piece before the first trained one, the response runs to the last trained
    piece, and ``trained`` marks its assistant tokens (the other response tokens are attended context)."""
    ids = [(tokenizer(t, add_special_tokens=False)["input_ids"], trained) for t, trained in chat.pieces]
    first = next(i for i, (_, trained) in enumerate(ids) if trained)
    last = max(i for i, (_, trained) in enumerate(ids) if trained)
    prompt = [t for piece, _ in ids[:first] for t in piece]
    response = [t for piece, _ in ids[first : last + 1] for t in piece]
    mask = [trained for piece, trained in ids[first : last + 1] for _ in piece]
    return prompt, response, mask


def encode_pairs(tokenizer: Any, pairs: list[tuple[str, str] | RenderedChat]) -> tuple[torch.Tensor, ...]:
    """Left-padded prompts and right-padded completions (+ EOS): ``(prompt_ids, prompt_mask,
    response_ids, response_mask)``, each ``[B, P]`` / ``[B, R]``. An empty prompt becomes the BOS token.
    A :class:`RenderedChat` row is :func:`encode_chat`'s (no EOS; its mask has holes at non-assistant
    turns, which stay attended, see :func:`tandem.models.packing.attended`)."""
    pad = tokenizer.pad_token_id
    bos = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id
    rows: list[tuple[list[int], list[int], list[bool]]] = []
    for pair in pairs:
        if isinstance(pair, RenderedChat):
            p, c, m = encode_chat(tokenizer, pair)
        else:
            p = tokenizer(pair[0], add_special_tokens=False)["input_ids"]
            c = tokenizer(pair[1], add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
            m = [True] * len(c)
        rows.append((p or [bos], c, m))
    P, R = max(len(p) for p, _, _ in rows), max(len(c) for _, c, _ in rows)
    prompt_ids = torch.tensor([[pad] * (P - len(p)) + p for p, _, _ in rows])
    prompt_mask = torch.tensor([[False] * (P - len(p)) + [True] * len(p) for p, _, _ in rows])
    response_ids = torch.tensor([c + [pad] * (R - len(c)) for _, c, _ in rows])
    response_mask = torch.tensor([m + [False] * (R - len(m)) for _, _, m in rows])
    return prompt_ids, prompt_mask, response_ids, response_mask


def run_sft(
    model: torch.nn.Module,
    tokenizer: Any,
    rows: list[SFTRow],
    settings: SFTSettings,
    *,
    on_step: Callable[[int, dict[str, float]], None] | None = None,
) -> dict[str, float]:
    """Train ``model`` in place on (prompt, completion) pairs and conversations (rendered through the
    chat template before the first step, so a bad row fails fast); returns the last step's metrics."""
    if not rows:
        raise DataError("SFT dataset is empty")
    pairs = [render_training(tokenizer, r) if isinstance(r, ChatRow) else r for r in rows]

    def step_loss(idx: list[int]) -> tuple[torch.Tensor, dict[str, float]]:
        p_ids, p_mask, r_ids, r_mask = encode_pairs(tokenizer, [pairs[i] for i in idx])
        logprobs, _ = response_logprobs(model, p_ids, p_mask, r_ids, r_mask)
        loss = -(logprobs * r_mask).sum() / r_mask.sum()
        return loss, {"sft/loss": float(loss.detach())}

    return supervised_loop(model, len(pairs), settings, step_loss, prefix="sft", on_step=on_step)


class LoopSettings(Protocol):
    """What :func:`supervised_loop` reads from a command's settings (SFT, distillation)."""

    steps: int
    batch_size: int
    lr: float
    weight_decay: float
    warmup_steps: int
    max_grad_norm: float
    seed: int


def cli_option(name: str) -> str:
    """The command-line option of a settings field: ``batch_size`` -> ``--batch-size``."""
    return "--" + name.replace("_", "-")


def check_loop_settings(settings: LoopSettings, option: Callable[[str], str] = cli_option) -> None:
    """Refuse settings the loop cannot train with, as one line naming ``option(field)``: a command calls
    this before it writes anything, since the loop would otherwise fail after the work (no step, so no
    metrics; an empty batch) or in torch's own words (AdamW's invalid learning rate). A NaN or infinite
    value is refused too: it would train a model of NaN weights without an error."""
    steps, batch, lr, decay = settings.steps, settings.batch_size, settings.lr, settings.weight_decay
    warmup, clip = settings.warmup_steps, settings.max_grad_norm
    for name, ok, rule, value in (
        ("steps", steps >= 1, "an integer >= 1", steps),
        ("batch_size", batch >= 1, "an integer >= 1", batch),
        ("lr", math.isfinite(lr) and lr > 0, "a finite number > 0", lr),
        ("weight_decay", math.isfinite(decay) and decay >= 0, "a finite number >= 0", decay),
        ("warmup_steps", warmup >= 0, "an integer >= 0", warmup),
        ("max_grad_norm", math.isfinite(clip) and clip > 0, "a finite number > 0", clip),
    ):
        if not ok:
            raise ConfigError(f"must be {rule}, got {value}", where=option(name))


def supervised_loop(
    model: torch.nn.Module,
    n_rows: int,
    settings: LoopSettings,
    step_loss: Callable[[list[int]], tuple[torch.Tensor, dict[str, float]]],
    *,
    prefix: str,
    on_step: Callable[[int, dict[str, float]], None] | None = None,
) -> dict[str, float]:
    """The supervised training loop SFT and offline distillation share: AdamW with linear warmup, batches of
    ``settings.batch_size`` row indices drawn epoch by epoch in a seeded shuffle, ``step_loss(indices)`` →
    (scalar loss, its metrics), gradient clipping. Adds ``<prefix>/grad_norm`` and ``<prefix>/lr`` to each
    step's metrics; returns the last step's. Settings are checked first (:func:`check_loop_settings`)."""
    check_loop_settings(settings)
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
            fresh = list(range(n_rows))
            rng.shuffle(fresh)
            order.extend(fresh)
        idx, order = order[: settings.batch_size], order[settings.batch_size :]
        loss, metrics = step_loss(idx)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), settings.max_grad_norm)
        opt.step()
        sched.step()
        metrics = {**metrics, f"{prefix}/grad_norm": float(grad_norm), f"{prefix}/lr": sched.get_last_lr()[0]}
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
    recipe = warm_start_recipe(
        task=task,
        task_options=task_options or {},
        steps=steps,
        lr=lr,
        batch_size=batch_size,
        train_size=train_size,
        weight_decay=weight_decay,
        base=base,
        model_options=model_options or {},
    )
    save_pretrained_atomic(
        model,
        tok,
        out_dir,
        created_by="tandem sft (warm start)",
        source=base,
        recipe={**recipe, "seed": seed},
    )
    if not base:
        import shutil

        shutil.rmtree(base_dir, ignore_errors=True)
    return out_dir


def warm_start_recipe(**options: Any) -> dict[str, Any]:
    """``model.warm_start_sft``'s options as recorded in the built folder's ``tandem_model.json`` (JSON
    values: tuples as lists), without the seed — a run with another ``run.seed`` reuses the cache."""
    return json.loads(json.dumps({k: options[k] for k in sorted(options) if k != "seed"}))


def check_warm_start(path: str | Path, options: dict[str, Any]) -> None:
    """A cached warm start at ``path`` must have been built with ``options`` (``model.warm_start_sft``):
    reusing one built with other steps, data or model options silently would train from the wrong model.
    Folders without a recorded recipe (built before it was recorded, or by other means) are used as they
    are. Raises :class:`ConfigError` naming the first options that differ."""
    from tandem.data.outputs import MODEL_MARKER

    marker = Path(path) / MODEL_MARKER
    try:
        built = json.loads(marker.read_text()).get("recipe")
    except (OSError, ValueError):
        return
    if not isinstance(built, dict):
        return
    built = {k: v for k, v in built.items() if k != "seed"}
    wanted = warm_start_recipe(**options)
    changed = sorted(k for k in built.keys() | wanted.keys() if built.get(k) != wanted.get(k))
    if changed:
        shown = ", ".join(f"{k} {built.get(k)!r} -> {wanted.get(k)!r}" for k in changed[:4])
        raise ConfigError(
            f"{path} is a warm start built with other options ({shown})",
            where="model.warm_start_sft",
            hint=f"delete {path} to rebuild it, or set model.path to a new folder",
        )
