"""Offline DPO (and IPO / hinge / robust variants) with cached reference log-probs.

The reference policy is used exactly once: :func:`reference_logps` scores every pair's chosen and
rejected completion (summed log-probs) before training, the numbers are cached (in memory and, from the
CLI, on disk next to the output), and the reference model is released. Each training step is then one
forward/backward of the policy over the ``2B`` stacked chosen+rejected rows — TRL's default computes a
second, reference forward at every step. Losses come from :func:`tandem.algos.dpo_loss`; metrics use
TRL's names: ``rewards/chosen``, ``rewards/rejected``, ``rewards/margins``, ``rewards/accuracies``
(implicit rewards ``beta * (log pi - log pi_ref)``).

``sft_coef > 0`` adds the chosen completions' per-token NLL to the loss (RPO, Pang et al. 2024): plain DPO
can lower the likelihood of chosen answers along with rejected ones ("likelihood displacement"), which on
the safety scenario turns a correct SFT policy into one that answers neither way; the NLL term anchors it.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from tandem.algos import dpo_loss
from tandem.data.preference import PreferencePair
from tandem.errors import DataError
from tandem.models.forward import response_logprobs
from tandem.models.lora import engine_state_dict
from tandem.train.preference_batch import encode_preference_batch
from tandem.utils.seed import seed_everything


@dataclass(frozen=True)
class DPOSettings:
    beta: float = 0.1
    loss_type: str = "sigmoid"
    label_smoothing: float = 0.0
    length_normalize: bool = False  # margin from per-token log-ratios (TRL's ipo / sigmoid_norm)
    lr: float = 5e-4
    batch_size: int = 16
    epochs: int = 1
    max_steps: int | None = None  # stop early after this many optimiser steps
    warmup_steps: int = 10
    max_grad_norm: float = 1.0
    sft_coef: float = 0.0  # RPO: + sft_coef * mean per-token NLL of the chosen completions
    seed: int = 0
    shared_prefix: bool = True  # run each pair's prompt once for chosen and rejected (same maths)


def sequence_logps(
    model: torch.nn.Module, tokenizer: Any, pairs: Sequence[PreferencePair], *, shared_prefix: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed completion log-probs of chosen and rejected ``([B], [B])`` in one forward of ``2B`` rows
    (gradients flow; wrap in ``no_grad`` to score)."""
    summed, _ = _summed_logps(model, tokenizer, pairs, shared_prefix)
    return summed[: len(pairs)], summed[len(pairs) :]


def _summed_logps(
    model: torch.nn.Module, tokenizer: Any, pairs: Sequence[PreferencePair], shared_prefix: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed log-probs ``[2B]`` (chosen rows then rejected rows) and completion token counts ``[2B]``.

    ``shared_prefix``: a pair's chosen and rejected rows go side by side (c0, r0, c1, r1, …) so that each
    prompt runs through the model once and both completions reuse its KV cache — the same log-probs and
    gradients as two full rows (up to float summation order), with the prompt's forward and backward done
    once instead of twice. Pairs whose prompts differ in tokens fall back to full rows."""
    p_ids, p_mask, r_ids, r_mask = encode_preference_batch(tokenizer, pairs)  # [2B, P], [2B, R]
    if shared_prefix and len(pairs) > 0:
        order = torch.arange(2 * len(pairs)).view(2, -1).t().reshape(-1)  # [2B]: c0, r0, c1, r1, ...
        logps, _ = response_logprobs(
            model, p_ids[order], p_mask[order], r_ids[order], r_mask[order], share_prefix=True
        )  # [2B, R], pair-major
        logps = logps[order.argsort()]  # back to chosen rows, then rejected rows
    else:
        logps, _ = response_logprobs(model, p_ids, p_mask, r_ids, r_mask)  # [2B, R]
    return (logps * r_mask).sum(dim=1), r_mask.sum(dim=1)  # [2B], [2B]


def reference_logps(
    ref: torch.nn.Module,
    tokenizer: Any,
    pairs: Sequence[PreferencePair],
    *,
    batch_size: int = 64,
    on_progress: Callable[[int, dict[str, float]], None] | None = None,
) -> torch.Tensor:
    """Reference log-probs of every pair ``[N, 2]`` (column 0 chosen, 1 rejected), computed once.
    ``on_progress(pairs_done, {})`` after every batch (progress bars)."""
    ref.eval()
    out = []
    with torch.no_grad():
        for i in range(0, len(pairs), batch_size):
            c, r = sequence_logps(ref, tokenizer, pairs[i : i + batch_size])
            out.append(torch.stack([c, r], dim=1))  # [b, 2]
            if on_progress is not None:
                on_progress(min(i + batch_size, len(pairs)), {})
    return torch.cat(out) if out else torch.zeros(0, 2)


def model_identity(model_id: str) -> str:
    """``model_id`` plus, when it names a local model folder, every file's name, size and ``mtime_ns``.

    A folder retrained (or re-exported) in place keeps its path, so the path alone would let a cache keyed
    on it serve the old weights' numbers; stat-ing the files is cheap (no hashing of the weights) and changes
    whenever a file is rewritten. Hidden files (temporaries, locks) are left out. Anything else (a remote
    address, a plain label) is returned unchanged."""
    folder = Path(model_id)
    if not folder.is_dir():
        return model_id
    parts = [model_id]
    for file in sorted(folder.rglob("*")):
        rel = file.relative_to(folder)
        if file.is_file() and not any(part.startswith(".") for part in rel.parts):
            stat = file.stat()
            parts.append(f"{rel.as_posix()}:{stat.st_size}:{stat.st_mtime_ns}")
    return "\n".join(parts)


def pairs_fingerprint(pairs: Sequence[PreferencePair], ref_id: str) -> str:
    """Hash of the pairs' content and the reference model's identity: the key of a ref-logp cache.
    A ``ref_id`` naming a local model folder also covers its files (:func:`model_identity`), so a
    reference retrained in place is scored again instead of reusing the old weights' log-probs."""
    h = hashlib.blake2b(model_identity(ref_id).encode(), digest_size=16)
    for p in pairs:
        h.update(json.dumps([p.prompt, p.chosen, p.rejected], sort_keys=True).encode())
    return h.hexdigest()


def cached_reference_logps(
    cache_file: str | Path | None,
    load_ref: Callable[[], torch.nn.Module],
    tokenizer: Any,
    pairs: Sequence[PreferencePair],
    ref_id: str,
    *,
    on_progress: Callable[[int, dict[str, float]], None] | None = None,
) -> torch.Tensor:
    """Reference log-probs from ``cache_file`` when its fingerprint matches, else computed with a
    freshly loaded reference (released afterwards) and written to the cache atomically."""
    from safetensors.torch import load_file, save_file

    key = pairs_fingerprint(pairs, ref_id)
    path = Path(cache_file) if cache_file else None
    if path is not None and path.is_file():
        data = load_file(str(path))
        if "fingerprint" in data and bytes(data["fingerprint"].tolist()).decode() == key:
            return data["logps"]
    ref = load_ref()
    logps = reference_logps(ref, tokenizer, pairs, on_progress=on_progress)
    del ref  # no reference model in memory while training
    if path is not None:
        from tandem.utils.io import atomic_write_bytes

        tmp = path.with_name(path.name + ".partial")
        path.parent.mkdir(parents=True, exist_ok=True)  # beside an out_dir whose parent may be new too
        save_file(
            {"logps": logps.contiguous(), "fingerprint": torch.tensor(list(key.encode()), dtype=torch.uint8)},
            str(tmp),
        )
        atomic_write_bytes(path, tmp.read_bytes())
        tmp.unlink()
    return logps


def implicit_reward_metrics(
    policy: torch.nn.Module,
    tokenizer: Any,
    pairs: Sequence[PreferencePair],
    ref_logps: torch.Tensor,  # [N, 2]
    beta: float,
    *,
    batch_size: int = 64,
) -> dict[str, float]:
    """Held-out ``rewards/*`` means over ``pairs`` (no gradients); accuracy = share with chosen reward
    strictly above rejected."""
    if not pairs:
        return {}
    was_training = policy.training
    policy.eval()
    chosen, rejected = [], []
    with torch.no_grad():
        for i in range(0, len(pairs), batch_size):
            c, r = sequence_logps(policy, tokenizer, pairs[i : i + batch_size])
            chosen.append(beta * (c - ref_logps[i : i + batch_size, 0]))
            rejected.append(beta * (r - ref_logps[i : i + batch_size, 1]))
    policy.train(was_training)
    rc, rr = torch.cat(chosen), torch.cat(rejected)  # [N], [N]
    return _reward_metrics(rc, rr)


def _reward_metrics(rc: torch.Tensor, rr: torch.Tensor) -> dict[str, float]:
    return {
        "rewards/chosen": float(rc.mean()),
        "rewards/rejected": float(rr.mean()),
        "rewards/margins": float((rc - rr).mean()),
        "rewards/accuracies": float((rc > rr).float().mean()),
    }


@dataclass
class DPOProgress:
    """Where a :func:`train_dpo` run stands between steps: everything besides the policy's weights that a
    resumed run needs to continue exactly (optimiser, scheduler, the data order and its generator, the
    metrics so far). Handed to ``restore`` before the first step and to ``on_checkpoint`` after every
    ``save_every``-th one; :meth:`data_state` / :meth:`load_data_state` are its JSON-able part."""

    step: int  # optimiser steps done
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    data_rng: random.Random  # shuffles each epoch's order
    order: list[int]  # the current epoch's pair indices not yet trained on
    history: list[dict[str, float]]  # per-step metrics of steps 1..step

    def data_state(self) -> dict[str, Any]:
        """``step``, ``order``, ``data_rng`` and ``history`` as JSON-able data."""
        version, internal, gauss = self.data_rng.getstate()
        return {
            "step": self.step,
            "order": list(self.order),
            "data_rng": [version, list(internal), gauss],
            "history": [dict(h) for h in self.history],
        }

    def load_data_state(self, state: Mapping[str, Any]) -> None:
        """Put back what :meth:`data_state` returned (optimiser and scheduler are the caller's)."""
        version, internal, gauss = state["data_rng"]
        self.data_rng.setstate((int(version), tuple(int(x) for x in internal), gauss))
        self.step = int(state["step"])
        self.order = [int(i) for i in state["order"]]
        self.history = [dict(h) for h in state["history"]]


def train_dpo(
    policy: torch.nn.Module,
    tokenizer: Any,
    pairs: Sequence[PreferencePair],
    ref_logps: torch.Tensor,  # [N, 2] from reference_logps
    settings: DPOSettings,
    *,
    on_step: Callable[[int, dict[str, float]], None] | None = None,
    save_every: int = 0,
    on_checkpoint: Callable[[DPOProgress], None] | None = None,
    restore: Callable[[DPOProgress], None] | None = None,
) -> list[dict[str, float]]:
    """Train ``policy`` in place; returns per-step metrics (``loss``, ``rewards/*``, ``grad_norm``).

    Checkpointing without file I/O here: ``on_checkpoint(progress)`` runs after every ``save_every``-th
    step and the last (``save_every`` 0: never) to save the policy and ``progress``; ``restore(progress)``, before the first step, puts
    a saved run back — the policy's weights, ``progress``'s optimiser and scheduler state,
    :meth:`DPOProgress.load_data_state` and the global RNGs — and training continues from
    ``progress.step + 1``, exactly as the uninterrupted run would (the returned history then includes
    the restored steps)."""
    if not pairs:
        raise DataError("DPO training set is empty")
    if ref_logps.shape != (len(pairs), 2):
        raise DataError(
            f"reference log-probs have shape {tuple(ref_logps.shape)}, expected ({len(pairs)}, 2)"
        )
    seed_everything(settings.seed)
    # trainable parameters only: with LoRA the frozen base gets no optimiser state
    opt = torch.optim.AdamW([p for p in policy.parameters() if p.requires_grad], lr=settings.lr)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / max(1, settings.warmup_steps))
    )
    progress = DPOProgress(0, opt, sched, random.Random(settings.seed), [], [])
    if restore is not None:
        restore(progress)
    total = total_steps(len(pairs), settings)
    policy.train()
    for step in range(progress.step + 1, total + 1):
        if not progress.order:
            progress.order = list(range(len(pairs)))
            progress.data_rng.shuffle(progress.order)
        idx, progress.order = progress.order[: settings.batch_size], progress.order[settings.batch_size :]
        metrics = _dpo_step(policy, tokenizer, [pairs[i] for i in idx], ref_logps[idx], settings, opt)
        sched.step()
        progress.step = step
        progress.history.append(metrics)
        if on_step is not None:
            on_step(step, metrics)
        if on_checkpoint is not None and save_every > 0 and (step % save_every == 0 or step == total):
            on_checkpoint(progress)  # the last step too: a stop in the evaluation or save after it keeps it
    policy.eval()
    return progress.history


def _dpo_step(
    policy: torch.nn.Module,
    tokenizer: Any,
    batch: Sequence[PreferencePair],
    ref: torch.Tensor,  # [b, 2]
    settings: DPOSettings,
    opt: torch.optim.Optimizer,
) -> dict[str, float]:
    """One forward/backward/optimiser step on ``batch``; its metrics."""
    summed, lengths = _summed_logps(policy, tokenizer, batch, settings.shared_prefix)  # [2b], [2b]
    pc, pr = summed[: len(batch)], summed[len(batch) :]  # [b], [b]
    b = len(batch)
    norm = (lengths[:b], lengths[b:]) if settings.length_normalize else None
    losses, rc, rr = dpo_loss(
        pc, pr, ref[:, 0], ref[:, 1], settings.beta, settings.loss_type, settings.label_smoothing,
        lengths=norm,
    )  # fmt: skip
    loss = losses.mean()
    nll = -(pc / lengths[: len(batch)].clamp_min(1)).mean()  # chosen per-token NLL
    if settings.sft_coef:
        loss = loss + settings.sft_coef * nll
    opt.zero_grad(set_to_none=True)
    loss.backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(policy.parameters(), settings.max_grad_norm)
    opt.step()
    metrics = {"loss": float(loss.detach()), "grad_norm": float(grad_norm), **_reward_metrics(rc, rr)}
    metrics["logps/chosen"] = float(pc.detach().mean())
    metrics["logps/rejected"] = float(pr.detach().mean())
    metrics["nll/chosen"] = float(nll.detach())
    return metrics


def total_steps(n_pairs: int, settings: DPOSettings) -> int:
    """Optimiser steps for ``epochs`` passes at ``batch_size`` (last partial batch included), capped by
    ``max_steps``."""
    steps = settings.epochs * math.ceil(n_pairs / settings.batch_size)
    return min(steps, settings.max_steps) if settings.max_steps else steps


@dataclass(frozen=True)
class OnlineDPOSettings:
    rounds: int = 3
    max_new_tokens: int = 32
    temperature: float = 1.0
    both_orders: bool = True  # keep a sampled pair only if the judge agrees with itself in both orders
    engine: str | None = None  # rollout engine that samples the rounds (None: the registry's default)
    engine_options: Mapping[str, Any] = field(default_factory=dict)  # EngineSpec.options
    model_path: str | None = None  # the policy's folder, for an engine that loads its own copy


def online_dpo(
    policy: torch.nn.Module,
    tokenizer: Any,
    prompt_rows: Sequence[dict[str, Any]],
    judge: Callable[[str, str, str, dict[str, Any]], str | None],
    settings: DPOSettings,
    online: OnlineDPOSettings,
    *,
    on_round: Callable[[int, dict[str, float]], None] | None = None,
) -> list[dict[str, float]]:
    """Iterative (online) DPO: each round samples two responses per prompt from the current policy,
    labels them with ``judge`` (a rule/verifier, a reward model wrapped as a rule, an LLM judge), and
    trains DPO on the kept pairs with the round's starting policy as the reference — whose log-probs are
    computed once per round from the policy itself, so no second model is ever loaded.

    The sampling engine is ``online.engine`` built through the registry: the in-process engine samples
    with ``policy`` itself; one that keeps its own copy loads ``online.model_path`` and receives the
    policy's weights before every round (``update_weights``)."""
    from tandem.rollout import DEFAULT_ENGINE, EngineSpec, SamplingParams, build_engine
    from tandem.train.labeling import judge_row

    history: list[dict[str, float]] = []
    spec = EngineSpec(
        model=policy,
        tokenizer=tokenizer,
        path=online.model_path,
        add_special_tokens=False,
        options=dict(online.engine_options),
    )
    engine = build_engine(online.engine or DEFAULT_ENGINE, spec)
    for rnd in range(1, online.rounds + 1):
        # last round's update (shared module: no copy; an engine with its own copy: merged LoRA weights)
        engine.update_weights(engine_state_dict(engine, policy), rnd)
        params = SamplingParams(
            max_new_tokens=online.max_new_tokens,
            temperature=online.temperature,
            n=2,
            seed=settings.seed + rnd,
        )
        batch = engine.generate([r["prompt"] for r in prompt_rows], params)
        pairs: list[PreferencePair] = []
        counts = {"kept": 0, "disagree": 0, "tie": 0, "parse_failure": 0, "timeout": 0}
        for i, row in enumerate(prompt_rows):
            a, b = batch.completions[2 * i], batch.completions[2 * i + 1]
            if not a.strip() or not b.strip() or a == b:  # nothing to compare: no preference
                counts["tie"] += 1
                continue
            sample = {**row, "response_a": a, "response_b": b}
            rec = judge_row(
                judge, sample, f"round {rnd} row {i}", both_orders=online.both_orders, noise=0.0, seed=0
            )
            counts[rec["status"]] += 1
            if rec["status"] == "kept":
                p = rec["pair"]
                pairs.append(
                    PreferencePair(p["prompt"], p["chosen"], p["rejected"], where=f"round {rnd} row {i}")
                )
        metrics: dict[str, float] = {
            "round": float(rnd),
            **{f"label/{k}": float(v) for k, v in counts.items()},
        }
        if pairs:
            ref = reference_logps(policy, tokenizer, pairs)  # the round's starting policy is the reference
            steps = train_dpo(policy, tokenizer, pairs, ref, settings)
            metrics.update({k: v for k, v in steps[-1].items() if k.startswith(("loss", "rewards/"))})
        history.append(metrics)
        if on_round is not None:
            on_round(rnd, metrics)
    engine.close()
    return history
