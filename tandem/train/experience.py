"""Turn a scored rollout into an :class:`Experience`: old/ref log-probs, KL-in-reward, advantages.

The estimator is looked up by name in the algorithm library; one signature serves all of them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import torch

from tandem.algos import (
    ADVANTAGE_ESTIMATORS,
    PluginError,
    compute_advantages,
    explained_variance,
    greedy_baseline,
    kl_penalty,
    logprob_mismatch,
    weight_positive,
)
from tandem.config.schema import AlgorithmConfig
from tandem.errors import ConfigError
from tandem.models.forward import response_logprobs
from tandem.models.packing import row_lengths, token_budget_chunks
from tandem.train.update import autocast_context
from tandem.types import Experience, RolloutBatch


@dataclass(frozen=True)
class ExperienceSettings:
    advantage: str
    gamma: float
    lam: float
    norm_by_std: bool
    beta: float
    kl_kind: str
    kl_in_reward: bool
    temperature: float
    autocast_bf16: bool
    micro_batch_size: int | None
    needs_values: bool = False  # the estimator needs critic values (registry metadata, not a name)
    share_prefix: bool = False  # rows of a group share a prompt: score each run of one prompt once
    dedupe: bool = False  # identical rows are scored once (response_logprobs ``dedupe``)
    micro_batch_tokens: int | None = None  # score packed chunks of this many real tokens (not rows)
    needs_teacher: bool = False  # the estimator needs a teacher's log-probs (registry metadata)
    reward_weight: float = 0.0  # opd: weight of the task reward beside the teacher term
    pass_k: int = 2  # the passk estimator's k
    std_scope: str = "group"  # grpo: the std of the group's scores or of the batch's (algorithm.std_scope)
    needs_baseline: bool = False  # the estimator needs the greedy rows' scores (remax; registry metadata)
    mask_truncated: bool = False  # truncated samples (finish reason "length") leave the loss
    positive_weight: float = 1.0  # positive advantages times this (algorithm.positive_weight, W-REINFORCE)

    @classmethod
    def from_config(
        cls,
        algo: AlgorithmConfig,
        *,
        temperature: float,
        autocast_bf16: bool,
        micro_batch_size: int | None,
        share_prefix: bool = False,
        micro_batch_tokens: int | None = None,
        dedupe: bool = False,
    ) -> ExperienceSettings:
        return cls(
            advantage=algo.advantage,
            gamma=algo.gamma,
            lam=algo.lam,
            norm_by_std=bool(algo.norm_by_std),
            beta=algo.beta,
            kl_kind=algo.kl.kind,
            kl_in_reward=algo.kl.where == "reward",
            temperature=temperature if temperature > 0 else 1.0,
            autocast_bf16=autocast_bf16,
            micro_batch_size=micro_batch_size,
            needs_values=ADVANTAGE_ESTIMATORS.get(algo.advantage).needs_critic,
            share_prefix=share_prefix,
            dedupe=dedupe,
            micro_batch_tokens=micro_batch_tokens,
            needs_teacher="teacher_logprobs" in ADVANTAGE_ESTIMATORS.get(algo.advantage).requires,
            reward_weight=algo.opd.reward_weight,
            pass_k=algo.pass_k,
            std_scope=algo.std_scope,
            needs_baseline="baseline_scores" in ADVANTAGE_ESTIMATORS.get(algo.advantage).requires,
            mask_truncated=algo.mask_truncated,
            positive_weight=algo.positive_weight,
        )


# a no-grad per-token pass: (model, batch, settings) -> [B, R] float32 (scoring_logprobs, critic_values)
Scorer = Callable[[torch.nn.Module, RolloutBatch, ExperienceSettings], torch.Tensor]


@torch.no_grad()
def scoring_logprobs(model: torch.nn.Module, r: RolloutBatch, s: ExperienceSettings) -> torch.Tensor:
    """Log-probs of the sampled response tokens under ``model`` (no grad, eval mode). ``[B, R]``."""
    was_training = model.training
    model.eval()
    try:
        with autocast_context(s.autocast_bf16):
            lp, _ = response_logprobs(
                model,
                r.prompt_ids,
                r.prompt_mask,
                r.response_ids,
                r.response_mask,
                temperature=s.temperature,
                micro_batch_size=s.micro_batch_size,
                share_prefix=s.share_prefix,
                micro_batch_tokens=s.micro_batch_tokens,
                dedupe=s.dedupe,
            )
    finally:
        model.train(was_training)
    return lp.float()


def scoring_chunks(r: RolloutBatch, rows: torch.Tensor, s: ExperienceSettings) -> list[torch.Tensor]:
    """The forwards a scoring pass over ``rows`` of ``r`` takes, as :func:`scoring_logprobs` splits them:
    chunks of ``s.micro_batch_size`` rows, or with ``s.micro_batch_tokens`` rows whose real tokens fit the
    budget. ``rows`` ``[b]`` -> list of ``[b_i]`` long positions in ``rows``, together ``range(b)``."""
    if not len(rows):
        return []
    if s.micro_batch_tokens is not None:
        lengths = row_lengths(r.prompt_mask[rows], r.response_mask[rows]).cpu()  # [b]
        return token_budget_chunks(lengths, s.micro_batch_tokens)
    return list(torch.arange(len(rows)).split(s.micro_batch_size or len(rows)))


@torch.no_grad()
def critic_values(critic: torch.nn.Module, r: RolloutBatch, s: ExperienceSettings) -> torch.Tensor:
    """Values of the response tokens under ``critic`` (no grad, eval mode). ``[B, R]`` float32."""
    was_training = critic.training
    critic.eval()
    step = s.micro_batch_size or max(1, r.batch_size)
    try:
        with autocast_context(s.autocast_bf16):
            chunks = [
                critic.values(
                    r.prompt_ids[i : i + step],
                    r.prompt_mask[i : i + step],
                    r.response_ids[i : i + step],
                    r.response_mask[i : i + step],
                )
                for i in range(0, r.batch_size, step)
            ]  # each [b, R]
    finally:
        critic.train(was_training)
    return torch.cat(chunks).float() if chunks else torch.zeros(r.response_ids.shape)


def make_experience(
    rollout: RolloutBatch,
    scores: torch.Tensor,  # [B]
    s: ExperienceSettings,
    *,
    policy: torch.nn.Module | None = None,
    ref_model: torch.nn.Module | None = None,
    critic: torch.nn.Module | None = None,
    teacher: torch.nn.Module | None = None,
    beta: float | None = None,
    logprobs_fn: Scorer | None = None,
    values_fn: Scorer | None = None,
) -> tuple[Experience, dict[str, float]]:
    """Compute what the update needs. ``policy`` is given only when old log-probs must be recomputed
    (several epochs or mini-batches); otherwise the update uses its own first forward as the old policy.
    ``critic`` gives the old values when the estimator needs them; ``teacher`` scores the sampled tokens
    when it needs a teacher's log-probs (on-policy distillation, metric ``distill/reverse_kl``: the mean
    per-token ``log pi_student - log pi_teacher``); ``beta`` overrides ``s.beta`` (an
    adaptive KL controller's current coefficient). ``logprobs_fn`` replaces :func:`scoring_logprobs`
    (a data-parallel learner shards these passes over its ranks); ``values_fn`` likewise replaces
    :func:`critic_values`.

    With recomputed old log-probs the metrics include the train–inference mismatch
    ``rollout/logprob_diff_mean``, ``rollout/logprob_diff_max``, ``rollout/ratio_outside_frac``
    (:func:`~tandem.algos.logprob_mismatch` of old vs behaviour log-probs); without them the update
    measures it on its first forward instead, so either way it costs no extra forward."""
    mask = rollout.response_mask
    beta = s.beta if beta is None else beta
    score = logprobs_fn or scoring_logprobs
    old = score(policy, rollout, s) if policy is not None else None
    ref = score(ref_model, rollout, s) if ref_model is not None and beta > 0 else None
    if s.needs_values and critic is None:
        raise ValueError(f"advantage '{s.advantage}' needs critic values: pass critic=...")
    values = (values_fn or critic_values)(critic, rollout, s) if s.needs_values else None  # [B, R]
    if s.needs_teacher and teacher is None:
        raise ValueError(f"advantage '{s.advantage}' needs a teacher's log-probs: pass teacher=...")
    teacher_lp = score(teacher, rollout, s) if s.needs_teacher else None  # [B, R]
    metrics: dict[str, float] = {}
    if old is not None:
        mismatch = logprob_mismatch(old, rollout.behavior_logprobs, mask)
        metrics.update({f"rollout/{k}": v for k, v in mismatch.items()})
    token_rewards = None
    current = old if old is not None else rollout.behavior_logprobs  # the student's, this step
    if teacher_lp is not None:
        gap = torch.where(mask, current - teacher_lp, torch.zeros_like(teacher_lp))
        metrics["distill/reverse_kl"] = float(gap.sum() / mask.sum().clamp(min=1))
    if ref is not None:
        kl = kl_penalty(current, ref, s.kl_kind) * mask  # [B, R]
        metrics["actor/kl_ref"] = float(kl.sum() / mask.sum().clamp(min=1))
        if s.kl_in_reward:
            token_rewards = -beta * kl
    baseline = None
    if s.needs_baseline:  # remax: each group's greedy answer (rollout.greedy_in_group) is its baseline
        if rollout.greedy is None:
            raise ValueError(f"advantage '{s.advantage}' needs greedy rows: set rollout.greedy_in_group=true")
        baseline = greedy_baseline(scores, rollout.group_ids, rollout.greedy)
    try:
        advantages, returns = compute_advantages(
            s.advantage,
            scores=scores,
            response_mask=mask,
            group_ids=rollout.group_ids,
            token_rewards=token_rewards,
            turn_rewards=rollout.turn_rewards,  # per-turn environment rewards (env.turn_rewards=per_turn)
            gamma=s.gamma,
            lam=s.lam,
            norm_by_std=s.norm_by_std,
            values=values,
            baseline_scores=baseline,
            logprobs=current if teacher_lp is not None else None,
            teacher_logprobs=teacher_lp,
            reward_weight=s.reward_weight,
            pass_k=s.pass_k,
            std_scope=s.std_scope,
        )
    except PluginError as exc:  # a run.plugins estimator raised or returned the wrong shape: one line
        raise ConfigError(str(exc), where="algorithm.advantage") from None
    advantages = weight_positive(advantages, s.positive_weight)  # [B, R]
    exp = Experience(
        rollout=rollout,
        scores=scores,
        old_logprobs=old,
        advantages=advantages,
        returns=returns,
        ref_logprobs=ref,
        token_rewards=token_rewards,
        values=values,
    )
    if s.mask_truncated:
        exp, metrics["actor/truncated_masked_frac"] = without_truncated(exp)
        mask = exp.rollout.response_mask
    valid = mask.sum().clamp(min=1)
    metrics["actor/advantage_mean"] = float((advantages * mask).sum() / valid)
    metrics["actor/advantage_abs"] = float((advantages.abs() * mask).sum() / valid)
    if values is not None:
        metrics["critic/values_mean"] = float((values * mask).sum() / valid)
        metrics["critic/explained_var"] = explained_variance(values, returns, mask)
    return exp, metrics


def without_truncated(exp: Experience) -> tuple[Experience, float]:
    """``exp`` with its truncated samples (finish reason ``"length"``) out of the loss: their response
    mask and every ``[B, R]`` tensor zeroed (the update's token and sequence counts then leave them out too),
    after their scores served the group statistics. Returns it and the share of samples masked."""
    r = exp.rollout
    cut = r.truncated.to(r.response_mask.device)  # [B]
    if not bool(cut.any()):
        return exp, 0.0
    keep = r.response_mask & ~cut.unsqueeze(1)  # [B, R]

    def masked(t: torch.Tensor | None) -> torch.Tensor | None:
        return None if t is None else torch.where(keep, t, torch.zeros_like(t))

    rollout = dataclasses.replace(
        r,
        response_mask=keep,
        behavior_logprobs=masked(r.behavior_logprobs),
        turn_rewards=masked(r.turn_rewards),
    )
    fields = ("old_logprobs", "advantages", "returns", "ref_logprobs", "token_rewards", "values")
    return (
        dataclasses.replace(exp, rollout=rollout, **{f: masked(getattr(exp, f)) for f in fields}),
        float(cut.float().mean()),
    )
