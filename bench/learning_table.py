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

Beside the targets, each row also says how long Tandem took to first reach *TRL's* best accuracy (the same
bar for both systems), in wall and CPU seconds against TRL's time to it: the like-for-like speed-up when
the two reach a similar plateau.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

ACC_CAP = 0.60  # the absolute target
ACC_GAIN = 0.25  # ... or start + 25 points, whichever is lower
TIME_FRACTION = 1 / 3  # Tandem's wall time to target <= 1/3 of TRL's wall time to its best
DEFAULT = "default"  # the variant label of Tandem's default recipe in results.jsonl


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
    tandem_match: Eval | None  # Tandem's first evaluation at or above TRL's best accuracy (within max_steps)
    match_ratio: float  # Tandem's wall to TRL's best accuracy / TRL's wall to it (inf: never reached)
    match_cpu_ratio: float  # the same in process CPU seconds
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


def _ratio(mine: float, theirs: float) -> float:
    return mine / theirs if theirs > 0 else math.inf


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
    match = first_reaching(tandem.evals, theirs.acc, max_steps)
    return Row(
        start=start,
        seed=tandem.seed,
        start_acc=start_acc,
        target=target,
        tandem_best=best,
        tandem_hit=hit,
        trl_best=trl_best,
        trl_lr=lr,
        ratio=_ratio(mine.wall, theirs.wall),
        cpu_ratio=_ratio(mine.cpu, theirs.cpu),
        tandem_match=match,
        match_ratio=_ratio(match.wall, theirs.wall) if match else math.inf,
        match_cpu_ratio=_ratio(match.cpu, theirs.cpu) if match else math.inf,
        acc_met=hit is not None,
        time_met=hit is not None and _ratio(mine.wall, theirs.wall) <= TIME_FRACTION + 1e-12,
    )


def run_from_result(r: dict[str, Any]) -> Run:
    """A :class:`Run` from one line of ``bench/learning.py``'s ``results.jsonl``."""
    evals = tuple(Eval(int(e["step"]), e["acc"], e["wall"], e["cpu"]) for e in r["evals"])
    return Run(r["system"], r["lr"], r["seed"], evals)


def best_lr(runs: list[Run], max_steps: int | None = None) -> float:
    """The learning rate of a sweep over seeds: the one whose runs have the highest mean best accuracy
    (ties: the lower mean wall time to the best). The table picks per seed; plots pick once per warm start."""
    by_lr: dict[float, list[Eval]] = {}
    for r in runs:
        by_lr.setdefault(r.lr, []).append(best_eval(r.evals, max_steps))
    if not by_lr:
        raise ValueError("no run to choose a learning rate from")

    def key(lr: float) -> tuple[float, float]:
        bests = by_lr[lr]
        return (sum(e.acc for e in bests) / len(bests), -sum(e.wall for e in bests) / len(bests))

    return max(by_lr, key=key)


def mean_curve(runs: list[Run]) -> list[Eval]:
    """The seeds' mean curve: accuracy, wall and CPU seconds averaged over ``runs`` at every step all of
    them evaluated (runs of different lengths or intervals share only those steps)."""
    if not runs:
        raise ValueError("no run to average")
    points = [{e.step: e for e in r.evals} for r in runs]
    steps = sorted(set.intersection(*(set(p) for p in points)))
    n = len(runs)
    return [
        Eval(
            s,
            sum(p[s].acc for p in points) / n,
            sum(p[s].wall for p in points) / n,
            sum(p[s].cpu for p in points) / n,
        )
        for s in steps
    ]


INTERLEAVE_S = 3600.0  # runs finished further apart than this are not comparable in wall time


def far_apart(finished: dict[str, float | None], limit_s: float = INTERLEAVE_S) -> str | None:
    """A one-line warning when the runs a row divides finished more than ``limit_s`` apart (``finished``:
    run label -> Unix time it finished, ``None`` for results recorded before the bench kept it). The same
    deterministic run took 1.3-1.4x the wall a few hours later on one machine (docs/benchmarks.md), so a
    time ratio is only as good as the interleaving of its two runs. ``None`` when all are within the
    limit or fewer than two times are known."""
    known = {k: t for k, t in finished.items() if t is not None}
    if len(known) < 2:
        return None
    first, last = min(known, key=known.__getitem__), max(known, key=known.__getitem__)
    gap = known[last] - known[first]
    if gap <= limit_s:
        return None
    return f"{first} and {last} finished {gap / 3600:.1f} h apart: their wall ratio may reflect the machine's drift"


def _pct(x: float) -> str:
    return f"{100 * x:.1f} %"


def _num(x: float, fmt: str) -> str:
    """``x`` in ``fmt``, or "-" where it is unknown (NaN: a decoupled run has no one CPU clock)."""
    return "-" if math.isnan(x) else format(x, fmt)


def _at(e: Eval) -> str:
    return f"{_pct(e.acc)} @{e.step} ({e.wall:.0f} s, CPU {_num(e.cpu, '.0f')} s)"


def _match(r: Row) -> str:
    """Tandem's time to TRL's best accuracy, as ratios of TRL's time to it."""
    if r.tandem_match is None:
        return "not reached"
    if r.tandem_match.step == 0:
        return f"@0 (TRL best {_pct(r.trl_best[r.trl_lr].acc)} = start)"
    return f"@{r.tandem_match.step}: {r.match_ratio:.2f} ({_num(r.match_cpu_ratio, '.2f')})"


def format_table(rows: list[Row]) -> str:
    """A markdown table: one line per warm start and seed. ``@N (S s, CPU C s)``: step N, S training wall
    seconds, C process CPU seconds. Ratios are wall (CPU) of Tandem over TRL at its best learning rate."""
    lrs = sorted({lr for r in rows for lr in r.trl_best})
    head = ["warm start", "seed", "start", "target", "Tandem best", "Tandem to target"]
    head += [f"TRL lr {lr:g} best" for lr in lrs]
    head += ["TRL best lr", "wall ratio (CPU)", "Tandem to TRL's best: ratio (CPU)"]
    head += ["acc target", "time target (≤ 1/3 wall)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r.start, str(r.seed), _pct(r.start_acc), _pct(r.target), _at(r.tandem_best)]
        cells.append(_at(r.tandem_hit) if r.tandem_hit else "not reached")
        cells += [_at(r.trl_best[lr]) if lr in r.trl_best else "-" for lr in lrs]
        ratio = f"{r.ratio:.2f} ({_num(r.cpu_ratio, '.2f')})"
        if math.isinf(r.ratio):
            ratio = "inf (TRL best at step 0)"
        elif r.tandem_hit is None and r.tandem_best.step == 0:
            ratio = "- (Tandem best at step 0)"
        cells += [f"{r.trl_lr:g}", ratio, _match(r), "met" if r.acc_met else "not met"]
        cells.append("met" if r.time_met else "not met")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
