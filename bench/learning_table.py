"""The arithmetic of ``bench/learning.py``: best evaluations, the issue-17 targets and the table.

Pure functions over plain data (no torch), so they are unit-tested on their own. One run is a
:class:`Run`: its system, learning rate and the held-out evaluations it made, each an :class:`Eval`
(step, held-out greedy accuracy, training wall and CPU seconds spent up to that step, evaluations
excluded). Step 0 is the warm start itself.

Targets (issue 17), per warm start and seed:

- accuracy: Tandem's default recipe reaches ``min(60 %, start + 25 points)`` at some evaluation at or
  before step ``max_steps`` (300);
- time: Tandem's training wall time to that evaluation (to its best one when the target is not
  reached) is at most a third of TRL's training wall time to *its own* best accuracy, TRL taken at the
  learning rate of its sweep with the highest best accuracy (ties: the faster one).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

ACC_CAP = 0.60  # the absolute target
ACC_GAIN = 0.25  # ... or start + 25 points, whichever is lower
TIME_FRACTION = 1 / 3  # Tandem's wall time to target <= 1/3 of TRL's wall time to its best


@dataclass(frozen=True)
class Eval:
    """One held-out evaluation of a run."""

    step: int
    acc: float  # held-out greedy accuracy, 0..1
    wall: float  # training wall seconds up to this step (evaluations not counted)
    cpu: float  # training process CPU seconds up to this step


@dataclass(frozen=True)
class Run:
    """One training run's evaluations (step 0 first)."""

    system: str  # "tandem" | "trl"
    lr: float
    seed: int
    evals: tuple[Eval, ...]


@dataclass(frozen=True)
class Row:
    """One warm start and seed: Tandem's default recipe against TRL's learning-rate sweep."""

    start: str
    seed: int
    start_acc: float
    target: float
    tandem_best: Eval
    tandem_hit: Eval | None  # first evaluation at or above the target (within max_steps)
    trl_best: dict[float, Eval]  # lr -> that run's best evaluation
    trl_lr: float  # the sweep's best learning rate
    ratio: float  # Tandem's wall to target (else to best) / TRL's wall to its best
    cpu_ratio: float  # the same in process CPU seconds (steadier on a shared machine)
    acc_met: bool
    time_met: bool


def target_accuracy(start_acc: float) -> float:
    """The issue's accuracy target: 60 %, or start + 25 points when that is lower."""
    return min(ACC_CAP, start_acc + ACC_GAIN)


def best_eval(evals: tuple[Eval, ...] | list[Eval], max_steps: int | None = None) -> Eval:
    """The evaluation with the highest accuracy (the earliest of equals), at or before ``max_steps``."""
    kept = [e for e in evals if max_steps is None or e.step <= max_steps]
    if not kept:
        raise ValueError("no evaluation at or before the step limit")
    return max(kept, key=lambda e: (e.acc, -e.step))


def first_reaching(evals: tuple[Eval, ...] | list[Eval], target: float, max_steps: int) -> Eval | None:
    """The first evaluation at or before ``max_steps`` whose accuracy reaches ``target`` (None if none).
    Accuracies are shares of a few hundred prompts: 1e-9 absorbs float rounding of a hit exactly on it."""
    for e in sorted(evals, key=lambda e: e.step):
        if e.step <= max_steps and e.acc >= target - 1e-9:
            return e
    return None


def compare(start: str, tandem: Run, trl: list[Run], max_steps: int = 300) -> Row:
    """Tandem's run against TRL's sweep on one warm start and seed (same warm start, so step 0 agrees;
    Tandem's is taken as the start accuracy)."""
    if not trl:
        raise ValueError("no TRL run to compare with")
    start_acc = min(tandem.evals, key=lambda e: e.step).acc
    target = target_accuracy(start_acc)
    best = best_eval(tandem.evals, max_steps)
    hit = first_reaching(tandem.evals, target, max_steps)
    trl_best = {r.lr: best_eval(r.evals, max_steps) for r in trl}
    lr = max(trl_best, key=lambda k: (trl_best[k].acc, -trl_best[k].wall))
    mine, theirs = hit or best, trl_best[lr]
    ratio = mine.wall / theirs.wall if theirs.wall > 0 else math.inf
    cpu_ratio = mine.cpu / theirs.cpu if theirs.cpu > 0 else math.inf
    return Row(
        start=start,
        seed=tandem.seed,
        start_acc=start_acc,
        target=target,
        tandem_best=best,
        tandem_hit=hit,
        trl_best=trl_best,
        trl_lr=lr,
        ratio=ratio,
        cpu_ratio=cpu_ratio,
        acc_met=hit is not None,
        time_met=hit is not None and ratio <= TIME_FRACTION + 1e-12,
    )


def _pct(x: float) -> str:
    return f"{100 * x:.1f} %"


def _at(e: Eval) -> str:
    return f"{_pct(e.acc)} @{e.step} ({e.wall:.0f} s)"


def format_table(rows: list[Row]) -> str:
    """A markdown table: one line per warm start and seed. ``@N (S s)``: step N, S training wall seconds."""
    lrs = sorted({lr for r in rows for lr in r.trl_best})
    head = ["warm start", "seed", "start", "target", "Tandem best", "Tandem to target"]
    head += [f"TRL lr {lr:g} best" for lr in lrs]
    head += ["TRL best lr", "wall ratio (CPU)", "acc target", "time target (≤ 1/3 wall)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r.start, str(r.seed), _pct(r.start_acc), _pct(r.target), _at(r.tandem_best)]
        cells.append(_at(r.tandem_hit) if r.tandem_hit else "not reached")
        cells += [_at(r.trl_best[lr]) if lr in r.trl_best else "-" for lr in lrs]
        ratio = f"{r.ratio:.2f} ({r.cpu_ratio:.2f})"
        if math.isinf(r.ratio):
            ratio = "inf (TRL best at step 0)"
        elif r.tandem_hit is None and r.tandem_best.step == 0:
            ratio = "- (Tandem best at step 0)"
        cells += [f"{r.trl_lr:g}", ratio, "met" if r.acc_met else "not met"]
        cells.append("met" if r.time_met else "not met")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
