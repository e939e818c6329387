"""Advantage estimators behind one signature.

Every estimator takes the same :class:`AdvantageInputs` and returns ``(advantages [B, T], returns [B, T])``,
both zero where ``response_mask`` is false, so the trainer calls :func:`compute_advantages` with a name
from the config and never branches on it. An estimator declares the optional inputs it needs in its
:class:`AdvantageSpec` (``requires``), e.g. ``gae`` needs ``values`` (a critic).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from tandem.algos.core import group_stats, last_token_mask, masked_mean, masked_whiten
from tandem.algos.registry import PluginError, Registry, call_registered


@dataclass(frozen=True)
class AdvantageInputs:
    """Everything an estimator may use. Shapes: ``B`` samples, ``T`` response tokens."""

    scores: torch.Tensor  # [B] float, sequence reward
    response_mask: torch.Tensor  # [B, T] bool
    group_ids: torch.Tensor  # [B] long, samples of one prompt share an id
    token_rewards: torch.Tensor | None = None  # [B, T] float, e.g. a per-token KL penalty
    # turn_rewards: the part of ``scores`` earned at given tokens (a multi-turn episode's step rewards);
    # token-level estimators credit it there and the rest of the score on the last token
    turn_rewards: torch.Tensor | None = None  # [B, T] float
    values: torch.Tensor | None = None  # [B, T] float, critic values V(s_t)
    baseline_scores: torch.Tensor | None = None  # [B] float, e.g. reward of the greedy sample (ReMax)
    logprobs: torch.Tensor | None = None  # [B, T] float, the sampling policy's log-prob of each token
    teacher_logprobs: torch.Tensor | None = None  # [B, T] float, a teacher's log-prob of the same tokens
    reward_weight: float = 0.0  # opd: weight of the group-centred sequence reward beside the teacher term
    gamma: float = 1.0
    lam: float = 1.0
    norm_by_std: bool = True
    std_scope: str = "group"  # grpo: divide by the std of the group's scores, or of the whole batch's
    eps: float = 1e-6  # added to the group std (grpo); batch whitening adds 1e-8 to the variance
    pass_k: int = 2  # passk: the k of the pass@k objective (clamped to the group size)


EstimatorFn = Callable[[AdvantageInputs], tuple[torch.Tensor, torch.Tensor]]


@dataclass(frozen=True)
class AdvantageSpec:
    """A registered estimator and the facts the config checks derive from it.

    ``requires``: optional inputs it cannot work without (``values`` means a critic). ``group_relative``:
    it compares the samples of one prompt, so groups need two or more (``rollout.n >= 2``).
    ``uses_token_rewards``: it consumes per-token rewards, so a KL penalty can go into the reward.
    ``batch_std``: it can divide by the std of the whole batch's scores instead of the group's
    (``algorithm.std_scope: batch``).
    """

    fn: EstimatorFn
    requires: tuple[str, ...] = ()
    summary: str = ""
    group_relative: bool = False
    uses_token_rewards: bool = False
    batch_std: bool = False

    @property
    def needs_critic(self) -> bool:
        return "values" in self.requires


ADVANTAGE_ESTIMATORS: Registry[AdvantageSpec] = Registry("advantage estimator", AdvantageSpec)


def _register(
    name: str,
    requires: tuple[str, ...] = (),
    summary: str = "",
    *,
    group_relative: bool = False,
    uses_token_rewards: bool = False,
    batch_std: bool = False,
) -> Callable[[EstimatorFn], EstimatorFn]:
    def deco(fn: EstimatorFn) -> EstimatorFn:
        spec = AdvantageSpec(fn, requires, summary, group_relative, uses_token_rewards, batch_std)
        ADVANTAGE_ESTIMATORS.add(name, spec)
        return fn

    return deco


def compute_advantages(
    name: str,
    *,
    scores: torch.Tensor,
    response_mask: torch.Tensor,
    group_ids: torch.Tensor,
    token_rewards: torch.Tensor | None = None,
    turn_rewards: torch.Tensor | None = None,
    values: torch.Tensor | None = None,
    baseline_scores: torch.Tensor | None = None,
    logprobs: torch.Tensor | None = None,
    teacher_logprobs: torch.Tensor | None = None,
    reward_weight: float = 0.0,
    gamma: float = 1.0,
    lam: float = 1.0,
    norm_by_std: bool = True,
    eps: float = 1e-6,
    pass_k: int = 2,
    std_scope: str = "group",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Advantages and returns with the estimator registered as ``name``.

    scores ``[B]``, response_mask ``[B, T]``, group_ids ``[B]`` -> (advantages ``[B, T]``,
    returns ``[B, T]``) float32, zero on masked positions, computed without gradient. ``turn_rewards``
    ``[B, T]``: the part of ``scores`` earned at given tokens (only estimators that use per-token rewards
    look at it).
    Raises ``UnknownNameError`` for an unknown name and ``ValueError`` when a required input is missing.
    """
    spec = ADVANTAGE_ESTIMATORS.get(name)
    inp = AdvantageInputs(
        scores=scores.detach().float(),
        response_mask=response_mask.to(torch.bool),
        group_ids=group_ids,
        token_rewards=None if token_rewards is None else token_rewards.detach().float(),
        turn_rewards=None if turn_rewards is None else turn_rewards.detach().float(),
        values=None if values is None else values.detach().float(),
        baseline_scores=None if baseline_scores is None else baseline_scores.detach().float(),
        logprobs=None if logprobs is None else logprobs.detach().float(),
        teacher_logprobs=None if teacher_logprobs is None else teacher_logprobs.detach().float(),
        reward_weight=reward_weight,
        gamma=gamma,
        lam=lam,
        norm_by_std=norm_by_std,
        eps=eps,
        pass_k=pass_k,
        std_scope=std_scope,
    )
    _check_inputs(name, spec, inp)
    with torch.no_grad():
        out = call_registered("advantage estimator", name, spec.fn, inp)
    adv, ret = _checked_output(name, out, inp.response_mask)
    m = inp.response_mask.to(adv.dtype)
    return adv * m, ret * m


def _checked_output(name: str, out: object, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``out`` as ``(advantages, returns)`` after checking it is two ``[B, T]`` tensors, finite where
    ``mask`` is true. A ``[B]`` result would otherwise broadcast silently along the token axis."""
    want = tuple(mask.shape)
    if not (isinstance(out, tuple) and len(out) == 2 and all(isinstance(x, torch.Tensor) for x in out)):
        got = type(out).__name__ if not isinstance(out, tuple) else f"a tuple of {len(out)}"
        raise PluginError(
            f"advantage estimator {name!r} returned {got}; it must return (advantages, returns), two "
            f"tensors of shape [B, T] = {list(want)}"
        )
    adv, ret = out
    if tuple(adv.shape) != want or tuple(ret.shape) != want:
        raise PluginError(
            f"advantage estimator {name!r} returned advantages {list(adv.shape)} and returns "
            f"{list(ret.shape)}; both must be [B, T] = {list(want)} (one value per response token)"
        )
    bad = ~torch.isfinite(adv) & mask
    if bool(bad.any()):
        row = int(bad.any(dim=1).nonzero()[0])
        raise PluginError(
            f"advantage estimator {name!r} returned non-finite advantages ({int(bad.sum())} tokens, first in "
            f"row {row})"
        )
    return adv, ret


def _check_inputs(name: str, spec: AdvantageSpec, inp: AdvantageInputs) -> None:
    b, t = inp.response_mask.shape
    if inp.scores.shape != (b,) or inp.group_ids.shape != (b,):
        raise ValueError(
            f"advantage {name!r}: scores and group_ids must be [B]={b}, got "
            f"{tuple(inp.scores.shape)} and {tuple(inp.group_ids.shape)}"
        )
    for field in spec.requires:
        if getattr(inp, field) is None:
            raise ValueError(
                f"advantage estimator {name!r} needs {field}=...; pass it or pick another estimator"
            )
    shapes = [
        ("token_rewards", (b, t)),
        ("turn_rewards", (b, t)),
        ("values", (b, t)),
        ("baseline_scores", (b,)),
    ]
    shapes += [("logprobs", (b, t)), ("teacher_logprobs", (b, t))]
    for field, shape in shapes:
        x = getattr(inp, field)
        if x is not None and tuple(x.shape) != shape:
            raise ValueError(f"advantage {name!r}: {field} must have shape {shape}, got {tuple(x.shape)}")


def _broadcast(per_seq: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """[B] -> [B, T], zero on masked positions."""
    return per_seq.unsqueeze(-1) * mask.to(per_seq.dtype)


def _token_rewards(inp: AdvantageInputs, per_seq: torch.Tensor) -> torch.Tensor:
    """Per-token rewards: ``per_seq`` on the last valid token plus ``token_rewards``. ``[B, T]``. With
    ``turn_rewards`` (part of the score earned earlier), those go where they were earned and the last
    token keeps the rest of ``per_seq``: a row's rewards still sum to ``per_seq`` (plus ``token_rewards``)."""
    last = last_token_mask(inp.response_mask).to(per_seq.dtype)  # [B, T]
    rewards = per_seq.unsqueeze(-1) * last
    if inp.turn_rewards is not None:
        placed = inp.turn_rewards * inp.response_mask.to(per_seq.dtype)  # [B, T], on valid tokens only
        rewards = rewards - placed.sum(-1, keepdim=True) * last + placed
    if inp.token_rewards is not None:
        rewards = rewards + inp.token_rewards
    return rewards * inp.response_mask.to(per_seq.dtype)


def discounted_returns(rewards: torch.Tensor, mask: torch.Tensor, gamma: float) -> torch.Tensor:
    """Return-to-go over valid tokens only: ``G_t = r_t + gamma * G_next`` where ``next`` is the next
    valid token of the row (masked positions are skipped, their output is 0). ``[B, T]`` -> ``[B, T]``.

    Naive equivalent: per row, ``for t in reversed(valid_positions): g = r[t] + gamma * g; out[t] = g``.
    Here one backward loop over ``T`` vectorised over ``B``.
    """
    return gae_scan(rewards, torch.zeros_like(rewards), mask, gamma, 1.0)


def gae_scan(
    rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float, lam: float
) -> torch.Tensor:
    """Generalised advantage estimation over the valid tokens of each row.

    ``delta_t = r_t + gamma * V_next - V_t``; ``A_t = delta_t + gamma * lam * A_next``, where ``next`` is
    the next *valid* token (``V_next = 0``, ``A_next = 0`` after the last). Masked positions are skipped
    and get 0. rewards, values, mask ``[B, T]`` -> advantages ``[B, T]``.

    Naive equivalent: the per-row Python loop over valid positions in reverse; here one backward loop
    over ``T`` vectorised over ``B``.
    """
    m = mask.to(torch.bool)
    b, t = rewards.shape
    next_value = rewards.new_zeros(b)  # [B]
    next_adv = rewards.new_zeros(b)  # [B]
    out = torch.zeros_like(rewards)
    for i in range(t - 1, -1, -1):
        valid = m[:, i]  # [B]
        delta = rewards[:, i] + gamma * next_value - values[:, i]
        adv = delta + gamma * lam * next_adv
        out[:, i] = torch.where(valid, adv, torch.zeros_like(adv))
        next_value = torch.where(valid, values[:, i], next_value)
        next_adv = torch.where(valid, adv, next_adv)
    return out


@_register(
    "gae", requires=("values",), summary="GAE(gamma, lambda) with a critic, whitened", uses_token_rewards=True
)
def _gae(inp: AdvantageInputs) -> tuple[torch.Tensor, torch.Tensor]:
    assert inp.values is not None
    values = inp.values * inp.response_mask.to(inp.values.dtype)
    adv = gae_scan(_token_rewards(inp, inp.scores), values, inp.response_mask, inp.gamma, inp.lam)
    returns = adv + values
    if inp.norm_by_std:
        adv = masked_whiten(adv, inp.response_mask)  # variance eps 1e-8, not the group-std eps
    return adv, returns


@_register("grpo", summary="(R - group mean) / (group std + eps)", group_relative=True, batch_std=True)
def _grpo(inp: AdvantageInputs) -> tuple[torch.Tensor, torch.Tensor]:
    """``std_scope="batch"``: divide by the std of every score in the batch instead (TRL's
    ``scale_rewards="batch"``; group mean with batch std, as LitePPO recommends): a group with one success
    in many is not scaled up to advantages of several units."""
    mean, std, _ = group_stats(inp.scores, inp.group_ids)
    adv = inp.scores - mean
    if inp.norm_by_std:
        if inp.std_scope == "batch":
            std = inp.scores.std() if inp.scores.numel() > 1 else torch.zeros(())  # unbiased, as TRL
        adv = adv / (std + inp.eps)
    return _broadcast(adv, inp.response_mask), _broadcast(inp.scores, inp.response_mask)


def weight_positive(advantages: torch.Tensor, weight: float) -> torch.Tensor:
    """Positive advantages times ``weight``, the others as they are: W-REINFORCE (Zhu et al., "The Surprising
    Effectiveness of Negative Reinforcement in LLM Reasoning", 2025) with ``weight`` its λ; 0 keeps only the
    push away from wrong samples (their NSR), 1 is the estimator unchanged. ``[B, T]`` -> ``[B, T]``."""
    if weight == 1.0:
        return advantages
    return torch.where(advantages > 0, advantages * weight, advantages)


@_register("dr_grpo", summary="R - group mean (no std)", group_relative=True)
def _dr_grpo(inp: AdvantageInputs) -> tuple[torch.Tensor, torch.Tensor]:
    mean, _, _ = group_stats(inp.scores, inp.group_ids)
    return _broadcast(inp.scores - mean, inp.response_mask), _broadcast(inp.scores, inp.response_mask)


@_register("rloo", summary="R - mean of the other samples of the group", group_relative=True)
def _rloo(inp: AdvantageInputs) -> tuple[torch.Tensor, torch.Tensor]:
    mean, _, n = group_stats(inp.scores, inp.group_ids)
    # R_i - (n*mean - R_i)/(n-1) == n/(n-1) * (R_i - mean); a group of one has no baseline -> 0.
    adv = torch.where(n > 1, n / (n - 1).clamp(min=1.0) * (inp.scores - mean), torch.zeros_like(mean))
    return _broadcast(adv, inp.response_mask), _broadcast(inp.scores, inp.response_mask)


def _reinforce_pp_common(inp: AdvantageInputs, per_seq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    returns = discounted_returns(_token_rewards(inp, per_seq), inp.response_mask, inp.gamma)
    if inp.norm_by_std:
        adv = masked_whiten(returns, inp.response_mask)  # variance eps 1e-8, not the group-std eps
    else:
        adv = returns - masked_mean(returns, inp.response_mask)
    return adv, returns


@_register(
    "reinforce_pp", summary="REINFORCE++: return-to-go, whitened over the batch", uses_token_rewards=True
)
def _reinforce_pp(inp: AdvantageInputs) -> tuple[torch.Tensor, torch.Tensor]:
    return _reinforce_pp_common(inp, inp.scores)


@_register(
    "reinforce_pp_baseline",
    summary="REINFORCE++ with the group mean subtracted first",
    group_relative=True,
    uses_token_rewards=True,
)
def _reinforce_pp_baseline(inp: AdvantageInputs) -> tuple[torch.Tensor, torch.Tensor]:
    mean, _, _ = group_stats(inp.scores, inp.group_ids)
    return _reinforce_pp_common(inp, inp.scores - mean)


def greedy_baseline(scores: torch.Tensor, group_ids: torch.Tensor, greedy: torch.Tensor) -> torch.Tensor:
    """Each row's ReMax baseline: the score of the greedy row of its group (``rollout.greedy_in_group``).

    scores ``[B]``, group_ids ``[B]``, greedy ``[B]`` bool -> ``[B]`` float32. ValueError when a group holds
    no greedy row or more than one. Naive equivalent:
    ``[scores[(group_ids == g) & greedy].item() for g in group_ids]``."""
    uniq, inverse = torch.unique(group_ids, return_inverse=True)
    count = torch.zeros(uniq.numel(), dtype=torch.long).index_add_(0, inverse, greedy.long())
    if bool((count != 1).any()):
        bad = int(uniq[(count != 1).nonzero()[0, 0]])
        raise ValueError(
            f"group {bad} holds {int(count[uniq == bad])} greedy rows; a greedy baseline needs one"
        )
    base = torch.zeros(uniq.numel(), dtype=torch.float32).index_add_(
        0, inverse[greedy], scores.detach().float()[greedy]
    )
    return base[inverse]


@_register("remax", requires=("baseline_scores",), summary="R - reward of the greedy sample")
def _remax(inp: AdvantageInputs) -> tuple[torch.Tensor, torch.Tensor]:
    assert inp.baseline_scores is not None
    adv = inp.scores - inp.baseline_scores
    return _broadcast(adv, inp.response_mask), _broadcast(inp.scores, inp.response_mask)


@_register(
    "opd",
    requires=("logprobs", "teacher_logprobs"),
    summary="on-policy distillation: log pi_teacher - log pi_student per token (+ w * (R - group mean))",
)
def _opd(inp: AdvantageInputs) -> tuple[torch.Tensor, torch.Tensor]:
    """Each sampled token's advantage is the negative of its reverse-KL sample estimate,
    ``A_t = -(log pi_student(y_t) - log pi_teacher(y_t))``: positive where the teacher likes the token more
    than the student, so maximising it minimises KL(student || teacher) on the student's own samples. No
    discount: a token's advantage is its own term (gamma, lam and norm_by_std are not used). With
    ``reward_weight`` w,
    ``w * (R - mean of R over the group)`` is added to every token of the sample (0 for a group of one)."""
    assert inp.logprobs is not None and inp.teacher_logprobs is not None
    adv = inp.teacher_logprobs - inp.logprobs  # [B, T]
    if inp.reward_weight:
        mean, _, _ = group_stats(inp.scores, inp.group_ids)
        adv = adv + inp.reward_weight * (inp.scores - mean).unsqueeze(-1)
    adv = torch.where(inp.response_mask, adv, torch.zeros_like(adv))  # padding may hold any value
    return adv, adv


def pass_k_advantages(n: int, c: int, k: int, eps: float = 1e-6) -> tuple[float, float]:
    """Analytical pass@k advantages of one group of ``n`` samples of which ``c`` are correct (Chen et al.
    2025, "Pass@k Training", arXiv 2508.10751): the group reward is pass@k of a random ``k``-subset,
    ``R = 1 - C(n-c, k) / C(n, k)``, ``sigma = sqrt(R (1 - R))``; a correct sample gets ``(1 - R) / sigma``,
    an incorrect one ``(1 - R - C(n-c-1, k-1) / C(n-1, k-1)) / sigma`` (its share of the subsets that
    still fail). ``k`` is clamped to ``[1, n]``; k = 1 is GRPO with the population std. Returns
    ``(A_correct, A_incorrect)``; both 0 when none is correct or every k-subset holds a correct one
    (``c > n - k``: the group's pass@k is 1 whatever the sample). Per group the advantages sum to 0, as
    GRPO's; what changes is the weight of a group: those with few successes (hard prompts) count more."""
    k = max(1, min(k, n))
    if c <= 0 or c > n - k:
        return 0.0, 0.0
    r = 1.0 - math.comb(n - c, k) / math.comb(n, k)
    sigma = math.sqrt(max(r * (1.0 - r), 0.0)) + eps
    fail_share = math.comb(n - c - 1, k - 1) / math.comb(n - 1, k - 1)
    return (1.0 - r) / sigma, (1.0 - r - fail_share) / sigma


@_register(
    "passk",
    summary="pass@k group advantage (0/1 rewards; algorithm.pass_k): keeps exploring",
    group_relative=True,
)
def _passk(inp: AdvantageInputs) -> tuple[torch.Tensor, torch.Tensor]:
    correct = inp.scores > 0.5  # [B]; a 0/1 verifier's success
    _, inverse = torch.unique(inp.group_ids, return_inverse=True)  # [B] in 0..G-1
    g = int(inverse.max()) + 1 if inverse.numel() else 0
    groups = inverse.cpu()
    n = torch.zeros(g, dtype=torch.long).index_add_(0, groups, torch.ones_like(groups))  # [G] samples
    c = torch.zeros(g, dtype=torch.long).index_add_(0, groups, correct.long().cpu())  # [G] correct
    table = torch.tensor(
        [pass_k_advantages(int(ni), int(ci), inp.pass_k, inp.eps) for ni, ci in zip(n, c, strict=True)],
        dtype=inp.scores.dtype,
    ).reshape(g, 2)  # [G, 2]: (A_correct, A_incorrect)
    per_group = table.to(inp.scores.device)[inverse]  # [B, 2]
    adv = torch.where(correct, per_group[:, 0], per_group[:, 1])  # [B]
    return _broadcast(adv, inp.response_mask), _broadcast(inp.scores, inp.response_mask)
