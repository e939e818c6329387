"""Offline knowledge distillation: a student learns a teacher's token distributions on fixed completions.

Three steps, each its own function: :func:`teacher_targets` runs the teacher once over every
(prompt, completion) pair and keeps its ``k`` largest logits per completion token (:class:`TeacherTargets`,
small enough to store: :func:`save_targets`); :func:`run_distill` trains the student on the forward KL to
those targets (:func:`tandem.algos.topk_forward_kl`, temperature ``tau``), optionally mixed with plain SFT
cross-entropy on the completion tokens. :func:`teacher_completions` replaces a dataset's completions by the
teacher's own answers (sequence-level distillation). :func:`student_config` shrinks a teacher's config into
a new student that keeps its tokenizer.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from tandem.algos import topk_forward_kl
from tandem.errors import ConfigError, DataError, first_line
from tandem.models.forward import accepts_logits_to_keep, positions_from_mask
from tandem.models.packing import attended
from tandem.train.sft import encode_pairs, supervised_loop

# init-model style names accepted in a student size, mapped to Hugging Face config attributes
SIZE_KEYS = {
    "hidden_size": "hidden_size",
    "num_layers": "num_hidden_layers",
    "num_heads": "num_attention_heads",
    "num_kv_heads": "num_key_value_heads",
    "intermediate_size": "intermediate_size",
}


@dataclass(frozen=True)
class DistillSettings:
    steps: int = 300
    lr: float = 3e-3
    batch_size: int = 64
    warmup_steps: int = 20
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    temperature: float = 1.0  # tau: softens both distributions; the KL is scaled by tau**2
    sft_weight: float = 0.0  # loss = (1 - w) * KL + w * cross-entropy on the completion tokens
    seed: int = 0


@dataclass(frozen=True)
class TeacherTargets:
    """The teacher's ``k`` largest logits at every completion token of every pair (``N`` pairs, ``R`` the
    longest completion + EOS); rows are right padded like :func:`~tandem.train.sft.encode_pairs`."""

    values: torch.Tensor  # [N, R, k] float16, logits (raw, before any temperature)
    indices: torch.Tensor  # [N, R, k] int32, token ids

    @property
    def top_k(self) -> int:
        return int(self.values.shape[-1])

    def rows(self, idx: list[int], width: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Values and indices of pairs ``idx``, cut to ``width`` completion tokens. ``[b, width, k]``."""
        sel = torch.as_tensor(idx, dtype=torch.long)
        return self.values[sel, :width].float(), self.indices[sel, :width].long()


def completion_logits(
    model: torch.nn.Module,
    prompt_ids: torch.Tensor,  # [B, P] long, left padded
    prompt_mask: torch.Tensor,  # [B, P] bool
    response_ids: torch.Tensor,  # [B, R] long, right padded
    response_mask: torch.Tensor,  # [B, R] bool
) -> torch.Tensor:
    """The logits that predict each response token (position ``P - 1 + t`` for token ``t``). ``[B, R, V]``.
    The same forward as :func:`tandem.models.forward.response_logprobs`, before the log-softmax."""
    R = response_ids.shape[1]
    input_ids = torch.cat([prompt_ids, response_ids], dim=1)  # [B, P+R]
    attention_mask = torch.cat([prompt_mask, attended(response_mask)], dim=1).long()  # [B, P+R]
    kwargs = {"input_ids": input_ids, "attention_mask": attention_mask}
    kwargs["position_ids"] = positions_from_mask(attention_mask)
    if accepts_logits_to_keep(model):
        return model(**kwargs, use_cache=False, logits_to_keep=R + 1).logits[:, :-1]  # [B, R, V]
    return model(**kwargs, use_cache=False).logits[:, -R - 1 : -1]  # [B, R, V]


@torch.no_grad()
def teacher_targets(
    teacher: torch.nn.Module,
    tokenizer: Any,
    pairs: list[tuple[str, str]],
    *,
    top_k: int,
    batch_size: int = 64,
    on_batch: Callable[[int], None] | None = None,
) -> TeacherTargets:
    """Run ``teacher`` over every pair (batches of ``batch_size``) and keep its ``top_k`` largest logits
    per completion token. ``on_batch(rows_done)`` reports progress."""
    if top_k < 1:
        raise ConfigError(f"must be >= 1, got {top_k}", where="--top-k")
    width = max(len(tokenizer(c, add_special_tokens=False)["input_ids"]) + 1 for _, c in pairs)
    teacher.eval()
    values, indices = [], []
    for start in range(0, len(pairs), batch_size):
        p_ids, p_mask, r_ids, r_mask = encode_pairs(tokenizer, pairs[start : start + batch_size])
        logits = completion_logits(teacher, p_ids, p_mask, r_ids, r_mask).float()  # [b, r, V]
        k = min(top_k, logits.shape[-1])
        top = logits.topk(k, dim=-1)  # [b, r, k]
        pad = width - logits.shape[1]
        values.append(torch.nn.functional.pad(top.values, (0, 0, 0, pad)).to(torch.float16))
        indices.append(torch.nn.functional.pad(top.indices, (0, 0, 0, pad)).to(torch.int32))
        if on_batch is not None:
            on_batch(min(start + batch_size, len(pairs)))
    return TeacherTargets(values=torch.cat(values), indices=torch.cat(indices))


def targets_fingerprint(teacher: str | Path, pairs: list[tuple[str, str]], top_k: int) -> str:
    """Hash of everything that determines a targets file: the teacher folder's path and files (size and
    ``mtime_ns`` each, so a teacher retrained in place counts as another teacher), every (prompt,
    completion) pair (which fixes the rows and the completion lengths) and ``top_k``. Stored in the file's
    metadata so that a later run with another teacher or other data recomputes instead of reusing it."""
    from tandem.train.dpo import model_identity

    h = hashlib.blake2b(model_identity(str(teacher)).encode(), digest_size=16)
    h.update(f"\ntop_k={top_k}\n".encode())
    for prompt, completion in pairs:
        h.update(json.dumps([prompt, completion]).encode())
    return h.hexdigest()


def save_targets(targets: TeacherTargets, path: str | Path, fingerprint: str | None = None) -> Path:
    """Write the targets as one safetensors file, atomically (a temporary sibling renamed into place),
    creating its folder; ``fingerprint`` (:func:`targets_fingerprint`) goes into the file's metadata."""
    from safetensors.torch import save_file

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    metadata = {"fingerprint": fingerprint} if fingerprint is not None else None
    save_file({"values": targets.values, "indices": targets.indices}, str(tmp), metadata=metadata)
    tmp.replace(path)
    return path


def stored_fingerprint(path: str | Path) -> str | None:
    """The fingerprint a targets file was saved with (None for files written without one, e.g. by older
    versions); DataError when ``path`` is not a safetensors file, so a wrong file is never overwritten."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            return (f.metadata() or {}).get("fingerprint")
    except (SafetensorError, OSError) as exc:
        reason = first_line(exc)
        raise DataError(f"not a targets file written by tandem distill ({reason})", where=str(path)) from None


def load_targets(path: str | Path, n_pairs: int) -> TeacherTargets:
    """Targets saved by :func:`save_targets`; DataError when the file does not hold ``n_pairs`` rows."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        t = load_file(str(path))
        targets = TeacherTargets(values=t["values"], indices=t["indices"])
    except (SafetensorError, KeyError, OSError) as exc:
        raise DataError(f"not a targets file written by tandem distill ({exc})", where=str(path)) from None
    if targets.values.shape[0] != n_pairs:
        raise DataError(
            f"holds targets for {targets.values.shape[0]} pairs, the data has {n_pairs}",
            where=str(path),
            hint="rebuild it with the same --data/--task and --train-size",
        )
    return targets


@torch.no_grad()
def teacher_completions(
    teacher: torch.nn.Module,
    tokenizer: Any,
    prompts: list[str],
    *,
    max_new_tokens: int,
    temperature: float = 0.0,
    batch_size: int = 64,
    seed: int = 0,
) -> list[tuple[str, str]]:
    """The teacher's own answer to every prompt (greedy at ``temperature`` 0), as (prompt, completion)
    pairs; empty answers are dropped. Sampled with the ``hf`` rollout engine over the teacher module."""
    from tandem.rollout import EngineSpec, build_engine
    from tandem.rollout.base import SamplingParams

    engine = build_engine("hf", EngineSpec(model=teacher, tokenizer=tokenizer))
    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature, n=1, seed=seed)
    pairs: list[tuple[str, str]] = []
    try:
        for start in range(0, len(prompts), batch_size):
            chunk = prompts[start : start + batch_size]
            batch = engine.generate(chunk, params)
            pairs += [(p, c) for p, c in zip(chunk, batch.completions, strict=True) if c]
    finally:
        engine.close()
    if not pairs:
        raise DataError("the teacher answered no prompt (every completion was empty)", where="--generate")
    return pairs


def student_config(teacher_config: Any, size: dict[str, int]) -> Any:
    """A copy of the teacher's Hugging Face config with the sizes in ``size`` (init-model names:
    hidden_size, num_layers, num_heads, num_kv_heads, intermediate_size). The MLP width scales with the
    hidden size unless given; KV heads follow the heads unless given."""
    unknown = sorted(set(size) - set(SIZE_KEYS))
    if unknown:
        raise ConfigError(
            f"unknown size key '{unknown[0]}'; valid: {', '.join(SIZE_KEYS)}", where="--student"
        )
    cfg = teacher_config.__class__.from_dict(teacher_config.to_dict())
    old_hidden = cfg.hidden_size
    for key, value in size.items():
        if not isinstance(value, int) or value < 1:
            raise ConfigError(f"{key} must be a positive integer, got {value!r}", where="--student")
        setattr(cfg, SIZE_KEYS[key], value)
    if "intermediate_size" not in size and hasattr(cfg, "intermediate_size"):
        cfg.intermediate_size = max(1, cfg.intermediate_size * cfg.hidden_size // old_hidden)
    if "num_kv_heads" not in size and hasattr(cfg, "num_key_value_heads"):
        cfg.num_key_value_heads = cfg.num_attention_heads
    if cfg.hidden_size % cfg.num_attention_heads:
        raise ConfigError(
            f"hidden_size {cfg.hidden_size} is not a multiple of num_heads {cfg.num_attention_heads}",
            where="--student",
        )
    if hasattr(cfg, "head_dim"):
        cfg.head_dim = cfg.hidden_size // cfg.num_attention_heads
    return cfg


def run_distill(
    student: torch.nn.Module,
    tokenizer: Any,
    pairs: list[tuple[str, str]],
    targets: TeacherTargets,
    settings: DistillSettings,
    *,
    on_step: Callable[[int, dict[str, float]], None] | None = None,
) -> dict[str, float]:
    """Train ``student`` in place: per step, ``batch_size`` pairs, loss
    ``(1 - sft_weight) * mean_tokens(topk_forward_kl) + sft_weight * mean_tokens(-log p(completion))``.
    Returns the last step's metrics (``distill/kl``, ``distill/ce``, ``distill/loss``, ...)."""
    if not pairs:
        raise DataError("the distillation dataset is empty")
    w = settings.sft_weight

    def step_loss(idx: list[int]) -> tuple[torch.Tensor, dict[str, float]]:
        p_ids, p_mask, r_ids, r_mask = encode_pairs(tokenizer, [pairs[i] for i in idx])
        logits = completion_logits(student, p_ids, p_mask, r_ids, r_mask).float()  # [b, R, V]
        t_values, t_indices = targets.rows(idx, r_ids.shape[1])
        tokens = r_mask.sum().clamp(min=1)
        kl = topk_forward_kl(logits, t_values, t_indices, r_mask, settings.temperature).sum() / tokens
        logp = torch.log_softmax(logits, dim=-1).gather(-1, r_ids.unsqueeze(-1)).squeeze(-1)  # [b, R]
        ce = -(logp * r_mask).sum() / tokens
        loss = (1 - w) * kl + w * ce
        return loss, {
            "distill/loss": float(loss.detach()),
            "distill/kl": float(kl.detach()),
            "distill/ce": float(ce.detach()),
        }

    return supervised_loop(student, len(pairs), settings, step_loss, prefix="distill", on_step=on_step)
