"""Tandem's algorithm library side by side with verl 0.9.1's ``core_algos.py`` and TRL 1.16's DPO loss.

Every check runs both implementations on the same random inputs and states the relation it expects:

- ``agrees``: same values (gradients too, where the item says so) within float tolerance;
- ``differs``: a convention difference documented in ``docs/algorithms.md`` ("Conventions and how they
  compare to verl and TRL"). The peer's value must equal the documented formula *and* Tandem's must
  differ from it, so the check fails both when the peer changes and when the difference disappears;
- ``tandem``: a property only Tandem promises (a group of equal rewards gives exactly 0); the peer's value
  is shown for reference.

How the peers are obtained (verl with ``--no-deps``, not a dependency) is in ``bench/oracle_peers.py``.
``tests/unit/algos/test_oracle_verl.py`` asserts every check and skips, saying why, when a peer is not
installed. This script prints them as a table and a final count line::

    .venv/bin/pip install --no-deps verl==0.9.1 && .venv/bin/pip install "trl==1.16.*"
    .venv/bin/python bench/algos_oracle.py [--seeds 3] [--no-trl]
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import types
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

import tandem.algos as A


def _sibling(name: str) -> types.ModuleType:
    """A module beside this file, loaded by path (no ``sys.path`` change in the importing process)."""
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, Path(__file__).resolve().parent / f"{name}.py")
        assert spec is not None and spec.loader is not None
        sys.modules[name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules[name])
    return sys.modules[name]


peers = _sibling("oracle_peers")
PeerUnavailableError = peers.PeerUnavailableError
Verl = peers.Verl
load_verl, load_trl_dpo = peers.load_verl, peers.load_trl_dpo

# -------------------------------------------------------------------------------------------- checks


# Rows of the conventions table in docs/algorithms.md, one per convention where Tandem and verl/TRL differed.
# Aligned rows are now "agrees" checks; kept ones are "differs" checks carrying the row's key.
CONVENTIONS = (
    "whitening-eps",
    "singleton-groups",
    "rpp-baseline-discount",
    "dual-clip",
    "gspo-clamp",
    "cispo-value",
    "mis-weight",
    "rs-bounds",
    "rejected-tokens-count",
    "ipo-length",
    "dpo-label-smoothing",
    "kl-abs",
    "kl-k3plus",
    "constant-groups",
    "returns",
    "remax-token-rewards",
)


@dataclass(frozen=True)
class Check:
    """One comparison. ``expected_peer`` is the documented formula for the peer's value (``differs``)."""

    item: str
    relation: str  # "agrees" | "differs" | "tandem"
    ours: torch.Tensor
    peer: torch.Tensor
    expected_peer: torch.Tensor | None = None
    atol: float = 1e-5
    rtol: float = 1e-4
    key: str = ""  # for "differs" / "tandem": the row of the conventions table in docs/algorithms.md

    def _close(self, a: torch.Tensor, b: torch.Tensor) -> bool:
        return torch.allclose(a.double(), b.double(), atol=self.atol, rtol=self.rtol)

    def holds(self) -> bool:
        if self.relation == "agrees":
            return self._close(self.ours, self.peer)
        if self.relation == "differs":
            assert self.expected_peer is not None
            return self._close(self.peer, self.expected_peer) and not self._close(self.ours, self.peer)
        return bool(self.ours.eq(0).all())  # "tandem": exactly zero

    def max_diff(self) -> float:
        return float((self.ours.double() - self.peer.double()).abs().max()) if self.ours.numel() else 0.0

    def describe(self) -> str:
        text = f"{self.item} [{self.relation}] max|ours − peer| = {self.max_diff():.3g}"
        if self.expected_peer is not None:
            text += f", max|peer − documented| = {float((self.peer - self.expected_peer).abs().max()):.3g}"
        return text


@dataclass(frozen=True)
class Batch:
    """Random padded inputs shared by the checks: ragged rows with holes, groups of 4, 4, 3 and 1."""

    mask: torch.Tensor  # [B, T] bool
    ids: torch.Tensor  # [B] long
    scores: torch.Tensor  # [B]
    token_rewards: torch.Tensor  # [B, T], a KL-like penalty
    values: torch.Tensor  # [B, T]
    gen: torch.Generator

    @property
    def index(self) -> np.ndarray:
        return self.ids.numpy()

    def full_rewards(self, token_rewards: bool = True) -> torch.Tensor:
        """verl's ``token_level_rewards``: the score on the last valid token (+ the token rewards)."""
        r = self.scores.unsqueeze(-1) * A.last_token_mask(self.mask).float()
        return (r + self.token_rewards * token_rewards) * self.mask.float()

    def multi(self) -> torch.Tensor:
        """Rows whose group has more than one sample."""
        return torch.bincount(self.ids)[self.ids] > 1


def make_batch(seed: int, sizes: tuple[int, ...] = (4, 4, 3, 1), t: int = 8) -> Batch:
    gen = torch.Generator().manual_seed(seed)
    b = sum(sizes)
    lengths = torch.randint(2, t + 1, (b,), generator=gen)
    mask = torch.arange(t).unsqueeze(0) < lengths.unsqueeze(1)
    holes = torch.rand(b, t, generator=gen) < 0.1
    holes[:, 0] = False
    ids = torch.cat([torch.full((n,), g) for g, n in enumerate(sizes)])
    scores = torch.randint(0, 3, (b,), generator=gen).float() + torch.rand(b, generator=gen)
    token_rewards = -0.05 * torch.rand(b, t, generator=gen)
    return Batch(mask & ~holes, ids, scores, token_rewards, torch.randn(b, t, generator=gen), gen)


def _ours_adv(name: str, x: Batch, **kw: Any) -> tuple[torch.Tensor, torch.Tensor]:
    return A.compute_advantages(name, scores=x.scores, response_mask=x.mask, group_ids=x.ids, **kw)


def _on(mask: torch.Tensor, *tensors: torch.Tensor) -> list[torch.Tensor]:
    return [t[mask] for t in tensors]


def advantage_checks(v: Verl, seed: int) -> list[Check]:
    x = make_batch(seed)
    m, multi = x.mask, x.multi()
    cfg = types.SimpleNamespace(gamma=0.9)
    out: list[Check] = []
    ours, ours_ret = _ours_adv("gae", x, token_rewards=x.token_rewards, values=x.values, gamma=0.95, lam=0.9)
    peer, peer_ret = v.core.compute_gae_advantage_return(x.full_rewards(), x.values, m.float(), 0.95, 0.9)
    out += [Check("gae advantages (γ .95, λ .9, token rewards, whitened)", "agrees", *_on(m, ours, peer))]
    out += [Check("gae returns", "agrees", *_on(m, ours_ret, peer_ret))]
    for name, norm in (("grpo", True), ("dr_grpo", False)):
        ours, _ = _ours_adv(name, x)
        peer, _ = v.core.compute_grpo_outcome_advantage(x.full_rewards(False), m.float(), x.index, 1e-6, norm)
        sel = m & multi.unsqueeze(-1)
        out.append(Check(f"{name} (groups of ≥ 2)", "agrees", *_on(sel, ours, peer)))
        single = m & ~multi.unsqueeze(-1)
        documented = x.scores.unsqueeze(-1).expand_as(m) / (1 + 1e-6 if norm else 1.0)
        label = f"{name} singleton group: ours 0, verl {'R/(1+ε)' if norm else 'R'}"
        out.append(Check(label, "differs", *_on(single, ours, peer, documented), key="singleton-groups"))
    ours, ours_ret = _ours_adv("grpo", x)
    peer, peer_ret = v.core.compute_grpo_outcome_advantage(x.full_rewards(False), m.float(), x.index)
    label = "grpo returns: ours R, verl the advantages"
    out.append(Check(label, "differs", *_on(m, ours_ret, peer_ret, peer), key="returns"))
    ours, _ = _ours_adv("rloo", x)
    peer, _ = v.core.compute_rloo_outcome_advantage(x.full_rewards(False), m.float(), x.index)
    vec, _ = v.core.compute_rloo_vectorized_outcome_advantage(x.full_rewards(False), m.float(), x.index)
    sel, single = m & multi.unsqueeze(-1), m & ~multi.unsqueeze(-1)
    out.append(Check("rloo (groups of ≥ 2)", "agrees", *_on(sel, ours, peer)))
    documented = x.scores.unsqueeze(-1).expand_as(m)
    label = "rloo singleton group: ours 0, verl rloo R"
    out.append(Check(label, "differs", *_on(single, ours, peer, documented), key="singleton-groups"))
    out.append(Check("rloo vs verl rloo_vectorized (singletons 0 in both)", "agrees", *_on(m, ours, vec)))
    ours, ours_ret = _ours_adv("reinforce_pp", x, token_rewards=x.token_rewards, gamma=0.9)
    peer, peer_ret = v.core.compute_reinforce_plus_plus_outcome_advantage(
        x.full_rewards(), m.float(), config=cfg
    )
    out += [Check("reinforce_pp (γ .9, token rewards)", "agrees", *_on(m, ours, peer))]
    out += [Check("reinforce_pp returns", "agrees", *_on(m, ours_ret, peer_ret))]
    out += _reinforce_baseline_checks(v, seed)
    base = torch.rand(x.scores.shape, generator=x.gen) * 2
    ours, _ = _ours_adv("remax", x, baseline_scores=base)
    peer, _ = v.core.compute_remax_outcome_advantage(x.full_rewards(False), base, m.float())
    out.append(Check("remax", "agrees", *_on(m, ours, peer)))
    ours, _ = _ours_adv("remax", x, baseline_scores=base, token_rewards=x.token_rewards)
    peer, _ = v.core.compute_remax_outcome_advantage(x.full_rewards(), base, m.float())
    documented = A.discounted_returns(x.full_rewards(), m, 1.0) - base.unsqueeze(-1)
    label = "remax + token rewards: ours ignores them, verl reward-to-go"
    out.append(Check(label, "differs", *_on(m, ours, peer, documented), key="remax-token-rewards"))
    return out


def _reinforce_baseline_checks(v: Verl, seed: int) -> list[Check]:
    x = make_batch(seed, sizes=(4, 4, 3))
    m, out = x.mask, []
    ours, _ = _ours_adv("reinforce_pp_baseline", x)
    peer, _ = v.core.compute_reinforce_plus_plus_baseline_outcome_advantage(
        x.full_rewards(False), m.float(), x.index
    )
    out.append(Check("reinforce_pp_baseline (γ 1, no token rewards)", "agrees", *_on(m, ours, peer)))
    ours, _ = _ours_adv("reinforce_pp_baseline", x, token_rewards=x.token_rewards, gamma=0.9)
    peer, _ = v.core.compute_reinforce_plus_plus_baseline_outcome_advantage(
        x.full_rewards(), m.float(), x.index
    )
    total = x.full_rewards().sum(-1)  # verl: S = Σ_t r_t, minus the group mean of S, on every token
    mean, _, _ = A.group_stats(total, x.ids)
    documented = A.masked_whiten((total - mean).unsqueeze(-1).expand_as(m), m)
    label = "reinforce_pp_baseline γ .9 + token rewards: ours discounted reward-to-go"
    out.append(Check(label, "differs", *_on(m, ours, peer, documented), key="rpp-baseline-discount"))
    x = make_batch(seed, sizes=(4, 4, 3, 1))
    m = x.mask
    ours, _ = _ours_adv("reinforce_pp_baseline", x)
    peer, _ = v.core.compute_reinforce_plus_plus_baseline_outcome_advantage(
        x.full_rewards(False), m.float(), x.index
    )
    mean, _, n = A.group_stats(x.scores, x.ids)
    centred = torch.where(n > 1, x.scores - mean, x.scores)  # verl: a singleton keeps R
    documented = A.masked_whiten(centred.unsqueeze(-1).expand_as(m), m)
    label = "reinforce_pp_baseline singleton: ours 0, verl R (before whitening)"
    out.append(Check(label, "differs", *_on(m, ours, peer, documented), key="singleton-groups"))
    return out


def constant_group_checks(v: Verl, seed: int) -> list[Check]:
    """8 samples all rewarded 3.3 (the reported defect) plus a group of random equal float32 values."""
    gen = torch.Generator().manual_seed(seed)
    value = float(torch.randn((), generator=gen) * 100)
    scores = torch.tensor([3.3] * 8 + [value] * 5)
    ids = torch.tensor([0] * 8 + [1] * 5)
    mask = torch.ones(13, 4, dtype=torch.bool)
    rewards = scores.unsqueeze(-1) * A.last_token_mask(mask).float()
    out = []
    for name, norm in (("grpo", True), ("dr_grpo", False)):
        ours, _ = A.compute_advantages(name, scores=scores, response_mask=mask, group_ids=ids)
        peer, _ = v.core.compute_grpo_outcome_advantage(rewards, mask.float(), ids.numpy(), 1e-6, norm)
        label = f"{name}: constant groups (8 × 3.3, 5 × a random value) give exactly 0"
        out.append(Check(label, "tandem", ours, peer, key="constant-groups"))
    ours, _ = A.compute_advantages("rloo", scores=scores, response_mask=mask, group_ids=ids)
    peer, _ = v.core.compute_rloo_outcome_advantage(rewards, mask.float(), ids.numpy())
    out.append(Check("rloo: constant groups give exactly 0", "tandem", ours, peer, key="constant-groups"))
    return out


def _grad(loss: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    (g,) = torch.autograd.grad(loss, x)
    return g


def aggregation_checks(v: Verl, seed: int) -> list[Check]:
    x = make_batch(seed)
    loss = torch.randn(x.mask.shape, generator=x.gen)
    sub = slice(0, 5)  # a micro-batch, normalised by the counts of the whole batch
    n_tok, n_seq, const = float(x.mask.sum()), float(x.mask.any(-1).sum()), 11.0
    out = []
    for mode in A.AGGREGATIONS.names():
        ours = A.aggregate(loss, x.mask, mode)
        peer = v.core.agg_loss(loss, x.mask.float(), mode)
        out.append(Check(f"aggregation {mode}", "agrees", ours, peer))
        ours = A.aggregate(loss[sub], x.mask[sub], mode, n_tok, global_seqs=n_seq, norm_constant=const)
        peer = v.core.agg_loss(loss[sub], x.mask[sub].float(), mode, 1, n_tok, n_seq, loss_scale_factor=const)
        out.append(Check(f"aggregation {mode}, micro-batch with global normalisers", "agrees", ours, peer))
    return out


def kl_checks(v: Verl, seed: int) -> list[Check]:
    gen = torch.Generator().manual_seed(seed)
    lp = (torch.rand(6, 9, generator=gen) * -4).requires_grad_(True)
    ref = lp.detach() + torch.randn(6, 9, generator=gen)
    out = []
    for kind in ("k1", "k2", "k3", "low_var_kl", "abs", "k3+"):
        ours, peer = A.kl_penalty(lp, ref, kind), v.core.kl_penalty(lp, ref, kind)
        out.append(Check(f"KL {kind} value", "agrees", ours.detach(), peer.detach()))
        out.append(Check(f"KL {kind} gradient", "agrees", _grad(ours.sum(), lp), _grad(peer.sum(), lp)))
    return out


def _policy_inputs(seed: int, spread: float = 2.0) -> tuple[torch.Tensor, ...]:
    x = make_batch(seed)
    old = torch.rand(x.mask.shape, generator=x.gen) * -3
    lp = (old + (torch.rand(x.mask.shape, generator=x.gen) - 0.5) * spread).requires_grad_(True)
    adv = torch.randn(x.mask.shape, generator=x.gen)
    return lp, old, adv, x.mask


def policy_checks(v: Verl, seed: int) -> list[Check]:
    lp, old, adv, mask = _policy_inputs(seed, spread=3.0)  # ratios up to e^1.5 = 4.5: dual clip bites
    cfg = v.ActorConfig(0.2, 0.28, 3.0)
    kw = {"logprobs": lp, "old_logprobs": old, "advantages": adv, "response_mask": mask}
    out = []
    for mode in ("token-mean", "seq-mean-token-mean"):
        ours, _ = A.policy_loss(
            "ppo_clip", clip_low=0.2, clip_high=0.28, dual_clip=3.0, aggregation=mode, **kw
        )
        peer, _ = v.core.compute_policy_loss_vanilla(old, lp, adv, mask.float(), mode, cfg)
        label = f"ppo_clip clip-higher .2/.28 + dual clip 3, {mode}"
        out += [Check(label, "agrees", ours.detach(), peer.detach())]
        out += [Check(label + ", gradient", "agrees", _grad(ours, lp), _grad(peer, lp))]
    ours, _ = A.policy_loss("ppo_clip", clip_low=0.2, clip_high=0.28, **kw)  # Tandem default: no dual clip
    peer, _ = v.core.compute_policy_loss_vanilla(old, lp, adv, mask.float(), "token-mean", cfg)
    documented, _ = A.policy_loss("ppo_clip", clip_low=0.2, clip_high=0.28, dual_clip=3.0, **kw)
    label = "ppo_clip default: ours no dual clip, verl always c = 3"
    out.append(Check(label, "differs", ours.detach(), peer.detach(), documented.detach(), key="dual-clip"))
    out += _gspo_checks(v, seed)
    ours, _ = A.policy_loss("cispo", clip_low=0.2, clip_high=0.28, **kw)
    peer, _ = v.core.compute_policy_loss_cispo(old, lp, adv, mask.float(), "token-mean", cfg)
    w = torch.exp(lp.detach() - old).clamp(0.8, 1.28)
    documented = A.aggregate(-w * adv * lp.detach(), mask)  # verl's value carries log π
    out += [Check("cispo gradient", "agrees", _grad(ours, lp), _grad(peer, lp))]
    label = "cispo value: ours −w·A (straight-through), verl −w·A·log π"
    out += [Check(label, "differs", ours.detach(), peer.detach(), documented, key="cispo-value")]
    return out


def _gspo_checks(v: Verl, seed: int) -> list[Check]:
    lp, old, adv, mask = _policy_inputs(seed, spread=0.5)
    cfg = v.ActorConfig(3e-4, 4e-4)
    kw = {"old_logprobs": old, "advantages": adv, "response_mask": mask, "clip_low": 3e-4, "clip_high": 4e-4}
    mode = "seq-mean-token-mean"
    ours, _ = A.policy_loss("gspo", logprobs=lp, aggregation=mode, **kw)
    peer, _ = v.core.compute_policy_loss_gspo(old, lp, adv, mask.float(), mode, cfg)
    out = [Check("gspo (|sequence log-ratio| < 10)", "agrees", ours.detach(), peer.detach())]
    out += [Check("gspo gradient", "agrees", _grad(ours, lp), _grad(peer, lp))]
    # Row 0 drifts far: sequence log-ratio 12 with a negative advantage.
    far = lp.detach() + 12.0 * mask[0].float() * (torch.arange(mask.shape[0]) == 0).float().unsqueeze(-1)
    far.requires_grad_(True)
    adv = torch.where(torch.arange(mask.shape[0]).unsqueeze(-1) == 0, -adv.abs(), adv)
    kw["advantages"] = adv
    ours, _ = A.policy_loss("gspo", logprobs=far, aggregation=mode, **kw)
    peer, _ = v.core.compute_policy_loss_gspo(old, far, adv, mask.float(), mode, cfg)
    m = mask.float()
    seq = ((far.detach() - old) * m).sum(-1) / m.sum(-1).clamp(min=1)
    s = torch.exp(seq.clamp(max=10.0)).unsqueeze(-1)  # verl: token-level clamp of the log-ratio at 10
    documented = A.aggregate(torch.maximum(-adv * s, -adv * s.clamp(1 - 3e-4, 1 + 4e-4)), mask, mode)
    label = "gspo sequence log-ratio 12: ours clamps at ±20, verl at 10"
    return out + [
        Check(label, "differs", ours.detach(), peer.detach(), documented, rtol=1e-4, key="gspo-clamp")
    ]


def correction_checks(v: Verl, seed: int) -> list[Check]:
    x = make_batch(seed)
    m = x.mask
    behav = torch.rand(m.shape, generator=x.gen) * -3
    old = behav + 0.4 * torch.randn(m.shape, generator=x.gen)  # log ρ = old − behav
    log_rho = old - behav

    def ours(kind: str, low: float | None, high: float) -> torch.Tensor:
        return A.correction_weights(kind, old, behav, m, low, high)

    def is_w(level: str, threshold: str | float) -> torch.Tensor:
        return v.corr.compute_rollout_correction_weights(log_rho, m.float(), level, threshold)[0]

    def rs_mask(option: str, threshold: str) -> torch.Tensor:
        return v.corr.compute_rollout_rejection_mask(log_rho, m.float(), option, threshold)[0].float()

    out = [
        Check("token_tis (cap 2)", "agrees", ours("token_tis", None, 2.0)[m], is_w("token", 2.0)[m]),
        Check("seq_tis (cap 2)", "agrees", ours("seq_tis", None, 2.0)[m], is_w("sequence", 2.0)[m]),
        Check(
            "token_mis = IcePop [0.5, 2]",
            "agrees",
            ours("token_mis", 0.5, 2.0)[m],
            is_w("token", "0.5_2.0")[m],
        ),
        Check(
            "seq_mis = sequence IcePop [0.5, 2]",
            "agrees",
            ours("seq_mis", 0.5, 2.0)[m],
            is_w("sequence", "0.5_2.0")[m],
        ),
        Check(
            "token_mis, asymmetric [0.8, 1.5] on ρ",
            "agrees",
            ours("token_mis", 0.8, 1.5)[m],
            is_w("token", "0.8_1.5")[m],
        ),
        Check(
            "token_rs = verl token_k1 rejection [0.5, 2]",
            "agrees",
            ours("token_rs", 0.5, 2.0)[m],
            rs_mask("token_k1", "0.5_2.0")[m],
        ),
        Check(
            "seq_rs = verl seq_sum_k1 rejection [0.5, 2]",
            "agrees",
            ours("seq_rs", 0.5, 2.0)[m],
            rs_mask("seq_sum_k1", "0.5_2.0")[m],
        ),
    ]
    documented = ours("token_rs", 1 / 1.5, 1 / 0.8)[m]  # verl's k1 bounds apply to 1/ρ
    peer = rs_mask("token_k1", "0.8_1.5")[m]
    label = "asymmetric rejection [0.8, 1.5]: ours on ρ, verl k1 on 1/ρ"
    out.append(Check(label, "differs", ours("token_rs", 0.8, 1.5)[m], peer, documented, key="rs-bounds"))
    lp, _, adv, _ = _policy_inputs(seed)
    kw = {
        "logprobs": lp,
        "old_logprobs": old,
        "advantages": adv,
        "response_mask": m,
        "behavior_logprobs": behav,
    }
    loss, _ = A.policy_loss("ppo_clip", correction="token_rs", correction_low=0.5, correction_high=2.0, **kw)
    kept = rs_mask("token_k1", "0.5_2.0")  # verl drops rejected tokens from the mask itself
    peer, _ = v.core.compute_policy_loss_vanilla(
        old, lp, adv, kept, "token-mean", v.ActorConfig(0.2, 0.2, 1e9)
    )
    documented = loss.detach() * m.sum() / kept.sum()
    label = "rejected tokens: ours keep them in the token-mean count, verl drops them"
    out.append(Check(label, "differs", loss.detach(), peer.detach(), documented, key="rejected-tokens-count"))
    return out


def value_entropy_checks(v: Verl, seed: int) -> list[Check]:
    x = make_batch(seed)
    old = x.values
    vpred = (old + 0.5 * torch.randn(x.mask.shape, generator=x.gen)).requires_grad_(True)
    ret = old + torch.randn(x.mask.shape, generator=x.gen)
    ours, ours_frac = A.value_loss(vpred, old, ret, x.mask, clip=0.2)
    peer, peer_frac = v.core.compute_value_loss(vpred, ret, old, x.mask.float(), 0.2)
    out = [
        Check("value loss (clip 0.2)", "agrees", ours.detach(), peer.detach()),
        Check("value loss gradient", "agrees", _grad(ours, vpred), _grad(peer, vpred)),
        Check("value clipfrac", "agrees", torch.tensor(ours_frac), peer_frac.detach()),
    ]
    logits = torch.randn(*x.mask.shape, 17, generator=x.gen) * 3
    ent = A.entropy_from_logits(logits)
    out.append(Check("entropy per token", "agrees", ent, v.F.entropy_from_logits(logits)))
    for mode in ("token-mean", "seq-mean-token-mean"):
        peer = v.core.compute_entropy_loss(logits, x.mask.float(), mode)
        out.append(Check(f"entropy, {mode}", "agrees", A.aggregate(ent, x.mask, mode), peer))
    return out


def dpo_checks(trl_loss: Callable[..., torch.Tensor], seed: int) -> list[Check]:
    gen = torch.Generator().manual_seed(seed)
    b, length = 6, 7
    mask = torch.arange(length).unsqueeze(0) < torch.randint(1, length + 1, (2 * b, 1), generator=gen)
    tok = (torch.rand(2 * b, length, generator=gen) * -2 * mask).requires_grad_(True)
    ref = (tok.detach() * mask).sum(-1) + torch.randn(2 * b, generator=gen) * 3
    lengths = mask.sum(-1).float()

    def ours(loss_type: str, eps: float = 0.0, norm: bool = False) -> torch.Tensor:
        summed = (tok * mask).sum(-1)
        lens = (lengths[:b], lengths[b:]) if norm else None
        losses, _, _ = A.dpo_loss(summed[:b], summed[b:], ref[:b], ref[b:], 0.1, loss_type, eps, lengths=lens)
        return losses.mean()

    def peer(loss_type: str, eps: float = 0.0) -> torch.Tensor:
        return trl_loss(
            token_logps=tok, completion_mask=mask, ref_chosen=ref[:b], ref_rejected=ref[b:],
            loss_type=loss_type, beta=0.1, label_smoothing=eps,
        )  # fmt: skip

    # Gradients are compared on completion tokens: TRL sums every position of the log-probs it is given
    # (its fused LM head returns 0 outside the completion), so padding has a gradient there only.
    out = []
    for loss_type, eps in (("sigmoid", 0.0), ("hinge", 0.0), ("robust", 0.1)):
        o, p = ours(loss_type, eps), peer(loss_type, eps)
        out.append(Check(f"DPO {loss_type} (ε {eps})", "agrees", o.detach(), p.detach()))
        out.append(Check(f"DPO {loss_type} gradient", "agrees", _grad(o, tok)[mask], _grad(p, tok)[mask]))
    o, p = ours("ipo", norm=True), peer("ipo")
    out += [Check("DPO ipo with lengths= (TRL length-normalises)", "agrees", o.detach(), p.detach())]
    out += [Check("DPO ipo with lengths=, gradient", "agrees", _grad(o, tok)[mask], _grad(p, tok)[mask])]
    label = "DPO ipo default: ours summed log-probs, TRL per-token"
    out.append(Check(label, "differs", ours("ipo").detach(), p.detach(), o.detach(), key="ipo-length"))
    o, p = ours("sigmoid", 0.1), peer("sigmoid", 0.1)
    label = "DPO sigmoid ε 0.1: ours cDPO, TRL ignores ε"
    out.append(
        Check(label, "differs", o.detach(), p.detach(), ours("sigmoid").detach(), key="dpo-label-smoothing")
    )
    return out


VERL_GROUPS: dict[str, Callable[[Verl, int], list[Check]]] = {
    "advantages": advantage_checks,
    "constant groups": constant_group_checks,
    "aggregation": aggregation_checks,
    "kl": kl_checks,
    "policy losses": policy_checks,
    "corrections": correction_checks,
    "value and entropy": value_entropy_checks,
}


def run(seeds: int, with_trl: bool) -> list[tuple[str, Check]]:
    """Every check for ``seeds`` random seeds; raises :class:`PeerUnavailableError` when a peer is missing."""
    v = load_verl()
    rows = [(group, c) for seed in range(seeds) for group, fn in VERL_GROUPS.items() for c in fn(v, seed)]
    if with_trl:
        trl_loss = load_trl_dpo()
        rows += [("dpo (TRL)", c) for seed in range(seeds) for c in dpo_checks(trl_loss, seed)]
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=3, help="random inputs per check")
    ap.add_argument("--no-trl", action="store_true", help="skip the TRL DPO checks")
    args = ap.parse_args()
    torch.set_num_threads(1)
    try:
        rows = run(args.seeds, not args.no_trl)
    except PeerUnavailableError as err:
        sys.exit(f"algos_oracle: {err}")
    worst: dict[tuple[str, str, str], tuple[float, bool]] = {}
    for group, c in rows:
        key = (group, c.item, c.relation)
        diff, ok = worst.get(key, (0.0, True))
        worst[key] = (max(diff, c.max_diff()), ok and c.holds())
    print(f"| group | check | relation | max abs(ours − peer) over {args.seeds} seeds | holds |")
    print("|---|---|---|---:|---|")
    for (group, item, relation), (diff, ok) in worst.items():
        print(f"| {group} | {item} | {relation} | {diff:.3g} | {'yes' if ok else '**NO**'} |")
    failed = sum(not ok for _, ok in worst.values())
    count = {r: sum(k[2] == r for k in worst) for r in ("agrees", "differs", "tandem")}
    print(
        f"checks: {len(worst)} ({count['agrees']} agree, {count['differs']} documented differences, "
        f"{count['tandem']} Tandem-only), failed: {failed}"
    )
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
