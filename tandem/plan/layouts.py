"""Candidate layouts for a cluster, their predicted throughput and lag, and a recommendation.

Colocated uses every device for every phase. Decoupled splits the devices into a rollout side and a
training side (a share ``r`` of the devices for rollout, rounded to whole engines) and runs one worker per
engine group; every worker count from 1 to ``min(η + 1, engines)`` is simulated (under the admission rule no
more than η + 1 tickets are unconsumed, so more workers would idle) and the fastest kept — fewer workers
when more are not 1 % faster. Each candidate is simulated (:mod:`tandem.plan.simulate`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from tandem.plan.cost import (
    Efficiency,
    PhaseTimes,
    Workload,
    colocated_phases,
    decoupled_phases,
    min_train_devices,
    tensor_parallel,
)
from tandem.plan.devices import Device
from tandem.plan.simulate import Layout, SimResult, simulate

ROLLOUT_SHARES = (0.25, 0.5, 0.625, 0.75, 0.875)
ETAS = (0, 1, 2, 4)


@dataclass(frozen=True)
class Candidate:
    layout: Layout
    rollout_devices: int  # colocated: all devices (shared)
    train_devices: int
    phases: PhaseTimes
    result: SimResult

    @property
    def name(self) -> str:
        if self.layout.mode == "colocated":
            return f"colocated {self.train_devices}"
        return f"split {self.rollout_devices}:{self.train_devices} η={self.layout.staleness}"


@dataclass(frozen=True)
class Recommendation:
    best: Candidate
    baseline: Candidate  # the colocated layout
    settings: list[str]  # config overrides (dotted keys) the recommended layout needs
    reasons: list[str]

    @property
    def speedup(self) -> float:
        return self.best.result.samples_per_s / self.baseline.result.samples_per_s


def candidates(
    w: Workload,
    device: Device,
    devices: int,
    *,
    eff: Efficiency | None = None,
    shares: Sequence[float] = ROLLOUT_SHARES,
    etas: Sequence[int] = ETAS,
    streaming: bool = False,
    steps: int = 60,
) -> list[Candidate]:
    """Colocated plus every feasible decoupled split × η, each simulated; sorted by samples/s (best first)."""
    eff = eff or Efficiency()
    tp = tensor_parallel(w.model, device)
    need = min_train_devices(w.model, device, eff)
    out: list[Candidate] = []
    if devices >= max(tp, need):
        phases = colocated_phases(w, device, devices, eff)
        res = simulate(phases, Layout(), samples_per_step=w.samples_per_step, steps=steps)
        out.append(Candidate(Layout(), devices, devices, phases, res))
    splits = sorted({_rollout_devices(devices, share, tp) for share in shares})
    for rollout in splits:
        train = devices - rollout
        if rollout < tp or train < need:
            continue
        engines = rollout // tp
        for eta in etas:
            best: Candidate | None = None
            for workers in range(1, min(eta + 1, engines) + 1):
                phases = decoupled_phases(
                    w,
                    device,
                    rollout_devices=rollout,
                    train_devices=train,
                    workers=workers,
                    eff=eff,
                    streaming=streaming,
                )
                layout = Layout(mode="decoupled", workers=workers, staleness=eta)
                res = simulate(phases, layout, samples_per_step=w.samples_per_step, steps=steps)
                if best is None or res.samples_per_s > best.result.samples_per_s * 1.01:
                    best = Candidate(layout, rollout, train, phases, res)
            if best is not None:
                out.append(best)
    return sorted(out, key=lambda c: -c.result.samples_per_s)


def _rollout_devices(devices: int, share: float, tp: int) -> int:
    """``share`` of the devices, rounded to whole engines, leaving at least one device to train."""
    r = max(tp, round(devices * share / tp) * tp)
    return min(r, (devices - 1) // tp * tp)


def recommend(cands: Sequence[Candidate], *, tolerance: float = 0.05) -> Recommendation | None:
    """The fastest layout, except that a smaller η within ``tolerance`` of its samples/s wins (staleness
    costs learning: see docs/architectures.md); None when no layout fits the devices."""
    if not cands:
        return None
    top = max(c.result.samples_per_s for c in cands)
    close = [c for c in cands if c.result.samples_per_s >= (1 - tolerance) * top]
    best = min(
        close,
        key=lambda c: (c.layout.staleness if c.layout.mode == "decoupled" else -1, -c.result.samples_per_s),
    )
    colocated = [c for c in cands if c.layout.mode == "colocated"]
    baseline = colocated[0] if colocated else best
    return Recommendation(best, baseline, settings_for(best), _reasons(best, baseline))


def settings_for(c: Candidate) -> list[str]:
    """Config overrides that run candidate ``c`` safely (the loss its staleness needs)."""
    if c.layout.mode == "colocated":
        return ["architecture.mode=colocated"]
    eta = c.layout.staleness
    out = [
        "architecture.mode=decoupled",
        f"architecture.staleness={eta}",
        f"architecture.num_workers={c.layout.workers}",
    ]
    if eta >= 2:
        out += ["algorithm.name=decoupled_ppo"]  # behaviour-vs-proximal token importance weight
    return out


def _reasons(best: Candidate, base: Candidate) -> list[str]:
    p = best.phases
    if best.layout.mode == "colocated":
        return [
            "decoupling does not pay here: the best split is within the tolerance of colocated or slower "
            "(the idle side of a split costs more than the overlap gains)"
        ]
    eta = best.layout.staleness
    why = [
        f"rollout {p.rollout_s:.1f} s per batch on {best.rollout_devices // best.layout.workers} devices × "
        f"{best.layout.workers} worker(s), learner {p.learn_s + p.weight_sync:.1f} s on {best.train_devices}: "
        f"rollout busy {best.result.rollout_util:.0%}, learner busy {best.result.learner_util:.0%}",
        f"policy lag: mean {best.result.mean_lag:.2f} (bound η={eta})",
    ]
    if eta >= 2:
        why.append("η ≥ 2 needs an off-policy correction: decoupled_ppo (or algorithm.correction=token_tis)")
    elif eta == 1:
        why.append("η = 1: any loss with a PPO ratio is safe (the learner recomputes the proximal log-probs)")
    return why


def split_label(rollout: int, train: int) -> str:
    g = math.gcd(rollout, train) or 1
    return f"{rollout // g}:{train // g}"


def target_workers(
    phases: PhaseTimes,
    staleness: int,
    *,
    min_workers: int,
    max_workers: int,
    samples_per_step: int = 1,
    tolerance: float = 0.05,
    in_flight: bool = False,
    steps: int = 60,
) -> int:
    """The rollout worker count for a running decoupled job: the fewest workers in ``[min, max]`` whose
    predicted samples/s is within ``tolerance`` of the best. Each worker is assumed to bring its own
    devices, so its per-batch phase times stay the measured ones."""
    rates = {
        n: simulate(
            phases,
            Layout(mode="decoupled", workers=n, staleness=staleness, in_flight=in_flight),
            samples_per_step=samples_per_step,
            steps=steps,
        ).samples_per_s
        for n in range(min_workers, max_workers + 1)
    }
    top = max(rates.values())
    return min(n for n, r in rates.items() if r >= (1 - tolerance) * top)
