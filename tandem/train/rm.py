"""Reward model: a sequence scorer trained on preference pairs with the Bradley–Terry loss.

The model is a Hugging Face sequence-classification model with one label, of one of two kinds read
from its config (:func:`tandem.models.encoder.reward_model_kind`). A causal LM
(``AutoModelForSequenceClassification`` keeps the backbone and adds a fresh scalar ``score`` head): a
sequence is ``prompt + completion + EOS``, left padded, so the score is read at the last column — the
last real token of every row, whatever the pad token is. An encoder classifier (BERT, RoBERTa): the
pair ``(prompt, completion)`` encoded by its own tokenizer, right padded, scored by the classifier's
logit (:mod:`tandem.models.encoder`). Either way the policy's text is re-tokenised with the RM's
tokenizer, so the two need not share a vocabulary. Training minimises
:func:`tandem.algos.reward_model_loss` (optional per-pair ``margin`` and centring); after every epoch the
held-out pairwise accuracy (share of pairs with ``r(chosen) > r(rejected)``) is measured. The result is
an ordinary HF folder plus ``tandem_reward.json`` with the mean/std of training rewards, which RL uses
for fixed normalisation (``reward.model.normalize: fixed``).
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from tandem.algos import reward_model_loss
from tandem.data.outputs import REWARD_MARKER, check_output_dir
from tandem.data.preference import PreferencePair
from tandem.errors import DataError, ModelError
from tandem.models.forward import positions_from_mask
from tandem.train.preference_batch import pair_texts, side_texts
from tandem.utils.io import atomic_write_json
from tandem.utils.seed import seed_everything

STATS_FILE = REWARD_MARKER  # the stats file also marks a reward-model folder (tandem.data.outputs)


@dataclass(frozen=True)
class RMSettings:
    epochs: int = 3
    lr: float = 1e-3
    batch_size: int = 32
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    use_margin: bool = False  # subtract each pair's ``margin`` column inside the sigmoid
    center_coef: float | None = 0.01
    warmup_steps: int = 10
    decay: bool = True  # linear decay of the learning rate to 0 over the run (steadier final epochs)
    seed: int = 0


def load_reward_model(path: str | Path, *, init_head: bool = False) -> tuple[torch.nn.Module, Any]:
    """A one-label sequence-classification model and its tokenizer from a local HF folder.

    ``init_head=True`` allows a causal-LM or base-encoder folder (a fresh scalar head is created);
    otherwise the folder must already be a reward model (its config has one label), so a wrong path is an
    error, not a randomly initialised scorer. A folder that is neither kind is refused in one line.
    """
    from transformers import AutoConfig, AutoModelForSequenceClassification

    from tandem.models.encoder import load_encoder_tokenizer, reward_model_kind
    from tandem.models.loading import check_model_folder, load_tokenizer

    folder = Path(path)
    check_model_folder(folder)
    try:
        config = AutoConfig.from_pretrained(str(folder), local_files_only=True)
    except (OSError, ValueError, KeyError) as err:
        raise ModelError(f"cannot read config.json: {str(err).splitlines()[0]}", where=str(folder)) from err
    kind = reward_model_kind(config, where=str(folder))
    archs = config.architectures or []
    if not init_head and not any(a.endswith("ForSequenceClassification") for a in archs):
        raise ModelError(
            f"not a reward model (architectures: {', '.join(archs) or 'none'})",
            where=str(folder),
            hint="train one with `tandem rm`",
        )
    tokenizer = load_encoder_tokenizer(folder) if kind == "encoder" else load_tokenizer(folder)
    config.num_labels = 1
    if config.pad_token_id is None:
        config.pad_token_id = tokenizer.pad_token_id
    try:
        model = AutoModelForSequenceClassification.from_pretrained(
            str(folder), config=config, local_files_only=True, use_safetensors=True
        )
    except (OSError, ValueError, KeyError) as err:
        raise ModelError(f"cannot load reward model: {str(err).splitlines()[0]}", where=str(folder)) from err
    if kind == "causal" and not hasattr(model, "score"):
        raise ModelError(f"{type(model).__name__} has no 'score' head", where=str(folder))
    return model, tokenizer


def encode_sequences(
    tokenizer: Any, prompts: Sequence[str], completions: Sequence[str]
) -> tuple[torch.Tensor, torch.Tensor]:
    """``prompt + completion + EOS`` per row, left padded: ``(ids [B, T] long, mask [B, T] bool)``."""
    pad, eos = tokenizer.pad_token_id, tokenizer.eos_token_id
    seqs = [
        tokenizer(p, add_special_tokens=False)["input_ids"]
        + tokenizer(c, add_special_tokens=False)["input_ids"]
        + [eos]
        for p, c in zip(prompts, completions, strict=True)
    ]
    T = max(map(len, seqs))
    ids = torch.tensor([[pad] * (T - len(s)) + s for s in seqs])  # [B, T]
    mask = torch.tensor([[False] * (T - len(s)) + [True] * len(s) for s in seqs])  # [B, T]
    return ids, mask


def score_sequences(model: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Scalar reward per row ``[B]``: the ``score`` head on the last column's hidden state (left padding
    makes it the last real token). Naive equivalent: HF's pooled logits when pad != EOS."""
    model = model.get_base_model() if hasattr(model, "get_base_model") else model  # LoRA: PEFT's inner model
    out = model.base_model(input_ids=ids, attention_mask=mask.long(), position_ids=positions_from_mask(mask))
    hidden = out.last_hidden_state[:, -1]  # [B, H]
    return model.score(hidden).squeeze(-1).float()  # [B]


def score_pairs(
    model: torch.nn.Module, tokenizer: Any, prompts: Sequence[str], completions: Sequence[str]
) -> torch.Tensor:
    """Scalar reward per (prompt, completion) text pair ``[B]``, encoded the way the model's kind needs."""
    from tandem.models.encoder import encoder_scores, is_encoder

    if is_encoder(model):
        return encoder_scores(model, tokenizer, prompts, completions)
    return score_sequences(model, *encode_sequences(tokenizer, prompts, completions))


def score_texts(
    model: torch.nn.Module,
    tokenizer: Any,
    prompts: Sequence[Any],
    completions: Sequence[Any],
    *,
    batch_size: int = 64,
) -> list[float]:
    """Rewards of (prompt, completion) pairs, in batches, without gradients."""
    scores: list[float] = []
    with torch.no_grad():
        for i in range(0, len(prompts), batch_size):
            texts = [
                side_texts(tokenizer, p, c)
                for p, c in zip(prompts[i : i + batch_size], completions[i : i + batch_size], strict=True)
            ]
            scores.extend(
                score_pairs(model, tokenizer, [p for p, _ in texts], [c for _, c in texts]).tolist()
            )
    return scores


def _pair_rewards(
    model: torch.nn.Module, tokenizer: Any, pairs: Sequence[PreferencePair]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rewards of chosen and rejected ``([B], [B])`` in one forward of ``2B`` rows."""
    texts = [pair_texts(tokenizer, p) for p in pairs]
    prompts = [p for p, _, _ in texts]
    comps = [c for _, c, _ in texts] + [r for _, _, r in texts]
    r = score_pairs(model, tokenizer, prompts + prompts, comps)  # [2B]
    return r[: len(pairs)], r[len(pairs) :]


def pairwise_accuracy(
    model: torch.nn.Module, tokenizer: Any, pairs: Sequence[PreferencePair], *, batch_size: int = 64
) -> float:
    """Share of pairs whose chosen completion scores strictly higher than the rejected one."""
    if not pairs:
        return math.nan
    was_training = model.training
    model.eval()
    wins = 0
    with torch.no_grad():
        for i in range(0, len(pairs), batch_size):
            rc, rr = _pair_rewards(model, tokenizer, pairs[i : i + batch_size])
            wins += int((rc > rr).sum())
    model.train(was_training)
    return wins / len(pairs)


def train_reward_model(
    model: torch.nn.Module,
    tokenizer: Any,
    train: Sequence[PreferencePair],
    val: Sequence[PreferencePair],
    settings: RMSettings,
    *,
    on_step: Callable[[int, dict[str, float]], None] | None = None,
) -> list[dict[str, float]]:
    """Train in place; returns one metrics dict per epoch (``rm/loss``, ``rm/train_accuracy``,
    ``rm/val_accuracy``, ``rm/margin_mean``). ``on_step(global_step, metrics)`` after every batch."""
    if not train:
        raise DataError("reward-model training set is empty")
    seed_everything(settings.seed)
    rng = random.Random(settings.seed)
    params = [p for p in model.parameters() if p.requires_grad]  # with LoRA: adapters and head only
    opt = torch.optim.AdamW(params, lr=settings.lr, weight_decay=settings.weight_decay)
    total = settings.epochs * math.ceil(len(train) / settings.batch_size)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: _lr_factor(s, total, settings))
    history: list[dict[str, float]] = []
    step = 0
    for epoch in range(1, settings.epochs + 1):
        model.train()
        order = list(range(len(train)))
        rng.shuffle(order)
        loss_sum, wins, gap_sum = 0.0, 0, 0.0
        for start in range(0, len(order), settings.batch_size):
            batch = [train[i] for i in order[start : start + settings.batch_size]]
            rc, rr = _pair_rewards(model, tokenizer, batch)  # [b], [b]
            margin = None
            if settings.use_margin:
                margin = torch.tensor([p.margin or 0.0 for p in batch])  # [b]
            loss = reward_model_loss(rc, rr, margin=margin, center_coef=settings.center_coef)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), settings.max_grad_norm)
            opt.step()
            sched.step()
            step += 1
            loss_sum += float(loss.detach()) * len(batch)
            wins += int((rc > rr).sum())
            gap_sum += float((rc - rr).detach().sum())
            if on_step is not None:
                on_step(step, {"rm/loss": float(loss.detach()), "epoch": float(epoch)})
        row = {
            "epoch": float(epoch),
            "rm/loss": loss_sum / len(train),
            "rm/train_accuracy": wins / len(train),
            "rm/margin_mean": gap_sum / len(train),
            "rm/val_accuracy": pairwise_accuracy(model, tokenizer, val),
        }
        history.append(row)
    model.eval()
    return history


def _lr_factor(step: int, total: int, settings: RMSettings) -> float:
    """Linear warm-up over ``warmup_steps``, then (with ``decay``) linear decay to 0 at ``total``."""
    warm = min(1.0, (step + 1) / max(1, settings.warmup_steps))
    if not settings.decay:
        return warm
    return warm * max(0.0, 1.0 - step / max(1, total))


def reward_stats(model: torch.nn.Module, tokenizer: Any, pairs: Sequence[PreferencePair]) -> dict[str, float]:
    """Mean and std of rewards over all chosen and rejected completions of ``pairs`` (for fixed
    normalisation in RL)."""
    prompts = [p.prompt for p in pairs]
    values = torch.tensor(
        score_texts(
            model, tokenizer, prompts + prompts, [p.chosen for p in pairs] + [p.rejected for p in pairs]
        )
    )
    return {"mean": float(values.mean()), "std": float(values.std().clamp_min(1e-6)), "count": len(values)}


def save_reward_model(
    model: torch.nn.Module,
    tokenizer: Any,
    out_dir: str | Path,
    stats: dict[str, Any],
    *,
    source: str | Path | None = None,
) -> Path:
    """Save the HF folder atomically with ``tandem_reward.json`` (normalisation stats, history) inside.

    That file marks a reward-model folder: only an empty folder or an earlier one is replaced, never an
    unrelated folder or ``source`` (the starting model) or a folder holding it
    (:func:`tandem.data.outputs.check_output_dir`)."""
    from tandem.utils.io import atomic_dir

    check_output_dir(out_dir, "reward", sources=(source,))
    with atomic_dir(out_dir) as tmp:
        model.save_pretrained(str(tmp), safe_serialization=True)
        tokenizer.save_pretrained(str(tmp))
        atomic_write_json(tmp / STATS_FILE, stats)
    return Path(out_dir)


def read_reward_stats(path: str | Path) -> dict[str, Any] | None:
    """``tandem_reward.json`` of a reward-model folder, or None when absent."""
    file = Path(path) / STATS_FILE
    return json.loads(file.read_text()) if file.is_file() else None


def build_reward_model_reward(cfg: Any) -> Any:
    """A :class:`tandem.rewards.model.RewardModelReward` for an RL config's ``reward.model`` section:
    loads the folder, binds :func:`score_texts` as the scorer and resolves fixed normalisation constants
    (explicit ``mean``/``std`` or ``tandem_reward.json``)."""
    from tandem.errors import ConfigError
    from tandem.rewards.model import RewardModelReward

    model, tokenizer = load_reward_model(cfg.path)
    model.eval()
    model.requires_grad_(False)
    mean, std = cfg.mean, cfg.std
    if cfg.normalize == "fixed" and (mean is None or std is None):
        stats = read_reward_stats(cfg.path)
        if stats is None:
            raise ConfigError(
                f"fixed normalisation needs mean/std or {STATS_FILE} in the folder",
                where="reward.model.normalize",
            )
        mean = stats["mean"] if mean is None else mean
        std = stats["std"] if std is None else std

    def scorer(prompts: Sequence[Any], completions: Sequence[Any]) -> list[float]:
        return score_texts(model, tokenizer, prompts, completions, batch_size=cfg.batch_size)

    return RewardModelReward(
        scorer,
        normalize=cfg.normalize,
        mean=mean or 0.0,
        std=std or 1.0,
        clip=cfg.clip,
        batch_size=cfg.batch_size,
    )
