"""The evaluation suite behind ``tandem eval``: greedy and sampled accuracy, pass@k, mean reward,
response-length statistics, the KL divergence to a reference model on the eval prompts and, for tasks
with the refusal capability (:mod:`tandem.evaluate.refusal`), refusal precision / recall / F1.

The greedy pass uses exactly the settings of the training loop's held-out evaluation
(:func:`tandem.evaluate.heldout.evaluate_prompts`: temperature 0, ``rollout.max_new_tokens``,
``rollout.stop``, chunks of 64 prompts), so ``eval/*`` here equals the ``eval/*`` a run logged for the
same checkpoint.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

from tandem.evaluate.heldout import ProgressFn, ScoredRollouts, correct, generate_scored
from tandem.evaluate.refusal import RefusalTask, completion_refusals, refusal_metrics
from tandem.models import response_logprobs
from tandem.rewards import RewardSet, TrainerState
from tandem.rollout.base import RolloutEngine, SamplingParams
from tandem.types import RolloutBatch


@dataclass(frozen=True)
class EvalSettings:
    """What ``tandem eval`` measures. ``samples == 0`` skips the sampled pass (and pass@k, KL)."""

    max_new_tokens: int = 32
    stop: list[str] = field(default_factory=list)
    samples: int = 8
    temperature: float = 1.0
    top_p: float = 1.0
    pass_k: tuple[int, ...] = (1, 4, 8)
    batch_size: int = 64
    seed: int = 0


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k (Chen et al. 2021): probability that at least one of ``k`` samples drawn without
    replacement from ``n`` (``c`` correct) is correct, ``1 - C(n-c, k) / C(n, k)``."""
    if k > n:
        raise ValueError(f"pass@{k} needs at least {k} samples per prompt, got {n}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def length_stats(lengths: torch.Tensor, truncated: torch.Tensor, prefix: str) -> dict[str, float]:
    """Mean, median, p90 and max response length and the share cut at ``max_new_tokens``.
    lengths ``[N]`` float, truncated ``[N]`` bool."""
    return {
        f"{prefix}/length_mean": float(lengths.mean()),
        f"{prefix}/length_p50": float(lengths.quantile(0.5)),
        f"{prefix}/length_p90": float(lengths.quantile(0.9)),
        f"{prefix}/length_max": float(lengths.max()),
        f"{prefix}/clip_ratio": float(truncated.float().mean()),
    }


def greedy_metrics(out: ScoredRollouts) -> dict[str, float]:
    """``eval/*``: the same accuracy / reward / mean length as the training loop's held-out evaluation."""
    return {
        "eval/accuracy": float(correct(out.scores).float().mean()),
        "eval/reward_mean": float(out.scores.mean()),
        **length_stats(out.lengths, out.truncated, "eval"),
    }


def sampled_metrics(out: ScoredRollouts, n: int, ks: tuple[int, ...]) -> dict[str, float]:
    """``sampled/*``: accuracy over all samples, mean reward, pass@k per prompt averaged over prompts."""
    ok = correct(out.scores).view(-1, n)  # [N, n] bool, rows in prompt order
    per_prompt = ok.sum(dim=1).tolist()
    metrics = {
        "sampled/accuracy": float(ok.float().mean()),
        "sampled/reward_mean": float(out.scores.mean()),
        **length_stats(out.lengths, out.truncated, "sampled"),
    }
    for k in ks:
        if k <= n:
            metrics[f"sampled/pass@{k}"] = sum(pass_at_k(n, c, k) for c in per_prompt) / len(per_prompt)
    return metrics


@torch.no_grad()
def kl_to_reference(
    policy: torch.nn.Module,
    ref_model: torch.nn.Module,
    batches: list[RolloutBatch],
    temperature: float,
) -> dict[str, float]:
    """Monte-Carlo KL(π‖π_ref) on the policy's own samples: per sequence Σ_t (log π − log π_ref) (the k1
    estimator, unbiased for samples drawn from π at this temperature), plus the per-token k3 estimator
    mean (≥ 0, lower variance). Both models score under ``softmax(logits / temperature)``."""
    seq_kl, k3_sum, tokens = [], 0.0, 0
    for b in batches:
        args = (b.prompt_ids, b.prompt_mask, b.response_ids, b.response_mask)
        lp, _ = response_logprobs(policy, *args, temperature=temperature)  # [B, R]
        lr, _ = response_logprobs(ref_model, *args, temperature=temperature)  # [B, R]
        mask = b.response_mask.float()  # [B, R]
        d = (lp - lr) * mask  # [B, R] log-ratio on real tokens
        seq_kl.append(d.sum(dim=1))
        k3_sum += float(((torch.exp(-d) + d - 1.0) * mask).sum())
        tokens += int(mask.sum())
    kl = torch.cat(seq_kl)
    return {"kl/seq_mean": float(kl.mean()), "kl/token_k3_mean": k3_sum / max(1, tokens)}


def evaluate_suite(
    engine: RolloutEngine,
    rows: list[dict[str, Any]],
    rewards: RewardSet,
    settings: EvalSettings,
    *,
    policy: torch.nn.Module | None = None,
    ref_model: torch.nn.Module | None = None,
    refusals: RefusalTask | None = None,
    on_progress: ProgressFn | None = None,
    state: TrainerState | None = None,
) -> dict[str, float]:
    """Run the whole suite on ``rows``; ``on_progress(done, total)`` counts prompt-passes (greedy, sampled).
    ``state``: the reward functions' ``trainer_state`` (the one the run recorded for the model, so that
    a step-dependent reward scores as the run's own evaluation did; None when there is none).

    The KL needs ``policy`` (the engine's model) and ``ref_model``, and the sampled pass. With
    ``refusals`` (a task with the refusal capability) the safety suite adds ``eval/refusal_*`` (greedy)
    and ``sampled/refusal_*`` (every sample).
    """
    passes = 1 + (settings.samples > 0)
    total = passes * len(rows)

    def progress(offset: int):
        return None if on_progress is None else (lambda done, _n: on_progress(offset + done, total))

    greedy = SamplingParams(max_new_tokens=settings.max_new_tokens, temperature=0.0, stop=list(settings.stop))
    out = generate_scored(
        engine, rows, rewards, greedy, batch_size=settings.batch_size, on_progress=progress(0), state=state
    )
    metrics = {"eval/num_prompts": float(len(rows)), **greedy_metrics(out)}
    labels = refusals.refusal_labels(rows) if refusals is not None else []
    if refusals is not None:
        metrics.update(refusal_metrics(labels, completion_refusals(refusals, _completions(out)), "eval"))
    if settings.samples > 0:
        params = SamplingParams(
            max_new_tokens=settings.max_new_tokens,
            temperature=settings.temperature,
            top_p=settings.top_p,
            n=settings.samples,
            stop=list(settings.stop),
            seed=settings.seed,
        )
        chunk = max(1, settings.batch_size // settings.samples)
        sampled = generate_scored(
            engine, rows, rewards, params, batch_size=chunk, on_progress=progress(len(rows)), state=state
        )
        metrics.update(sampled_metrics(sampled, settings.samples, settings.pass_k))
        if refusals is not None:  # samples are in prompt order, ``samples`` per prompt
            repeated = [y for y in labels for _ in range(settings.samples)]
            refused = completion_refusals(refusals, _completions(sampled))
            metrics.update(refusal_metrics(repeated, refused, "sampled"))
        if ref_model is not None and policy is not None and settings.temperature > 0:
            metrics.update(kl_to_reference(policy, ref_model, sampled.batches, settings.temperature))
    return metrics


def _completions(out: ScoredRollouts) -> list[str]:
    """Every completion of an evaluation pass, in the order of ``out.scores``."""
    return [c for b in out.batches for c in b.completions]
