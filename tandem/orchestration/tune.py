"""``tandem tune``: a short hyper-parameter search by successive halving on the held-out metric.

Candidates are points of a small grid of dotted overrides (e.g. ``trainer.lr`` ×
``algorithm.adaptive_group.enabled``).
Rung 0 trains every candidate for a few steps; each later rung keeps the best ``1/eta`` of the previous
one (ranked by the held-out metric, ``eval/accuracy`` by default, at the end of its run) and trains it for
``eta`` times more steps; the last rung trains one candidate for the config's ``trainer.total_steps`` (or
fewer, when the budget is short). A run that does badly early is stopped early: that is the saving.

Each rung's run is a fresh, complete run of its length (its own warm-up and cosine schedule), not a resumed
one: resuming a run with a longer ``total_steps`` would change its learning-rate schedule half way.
The plan is the longest one whose total fits ``--budget`` (training steps over all runs together).

Confirmation (on by default): one held-out evaluation of a few hundred prompts has a standard error of
≈ 3 points, more than the differences between neighbouring learning rates, so the highest score is often
noise (docs/learning.md, "Does `tandem tune` pay for itself?"). When the winner differs from the config
as given, the config itself is trained for the final rung's length too (and both on more seeds with
``--confirm-seeds``), both final models answer prompts the sweep did not rank on greedily, and the winner
replaces the config only if a paired sign test on the prompts they answer differently says it is better
(``tandem.evaluate.stats.decide``) — the rule ``tandem ab`` gates a promotion on. The plan holds back
budget for those runs (``reserve``).

Why our own ~100 lines rather than Optuna or Ray Tune: trials are whole training runs that use every core
of the machine, so a scheduler's parallel trials buy nothing; the grid is small; this is deterministic,
needs no new dependency (Optuna would bring SQLAlchemy and Alembic) and no Ray runtime (≈ 3 s, 700 MB at
start) for a loop a user can read in one screen.
"""

from __future__ import annotations

import itertools
import json
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tandem.errors import ConfigError


@dataclass
class Trial:
    """One candidate: its overrides and the metric of each rung it ran (``None`` = no evaluation)."""

    index: int
    overrides: list[str]
    scores: dict[int, float | None] = field(default_factory=dict)  # steps -> metric

    def last(self) -> float:
        """The metric of its longest run (``-inf`` without one), what rungs rank on."""
        if not self.scores:
            return -math.inf
        value = self.scores[max(self.scores)]
        return -math.inf if value is None or math.isnan(value) else value


def grid(space: dict[str, Sequence[str]]) -> list[list[str]]:
    """Every combination of the space's values as override lists, in a stable order."""
    keys = list(space)
    return [
        [f"{k}={v}" for k, v in zip(keys, combo, strict=True)] for combo in itertools.product(*space.values())
    ]


def plan_rungs(
    n: int, max_steps: int, budget: int, eta: int = 2, min_steps: int = 1, reserve: int = 0
) -> list[tuple[int, int]]:
    """The rungs ``[(candidates, steps), ...]`` of successive halving over ``n`` candidates.

    Candidates shrink ``n, ceil(n / eta), ..., 1``; steps grow ``eta``-fold per rung up to ``top`` on the
    last rung (never below ``min_steps``). ``top`` is the largest value up to ``max_steps`` whose total
    (``sum(candidates × steps)``, plus ``reserve`` more runs of ``top`` steps: the confirmation's runs)
    fits ``budget``; ConfigError when none does."""
    if n < 1 or eta < 2 or min_steps < 1:
        raise ConfigError(
            f"successive halving needs candidates, min_steps >= 1 and eta >= 2 (got {n}, {eta})"
        )
    ks = [n]
    while ks[-1] > 1:
        ks.append(math.ceil(ks[-1] / eta))
    last = len(ks) - 1
    for top in range(max_steps, 0, -1):
        steps = [min(top, max(min_steps, top // eta ** (last - i))) for i in range(len(ks))]
        rungs = list(zip(ks, steps, strict=True))
        if sum(k * s for k, s in rungs) + reserve * steps[-1] <= budget:
            return rungs
    cheapest = sum(k * min_steps for k in ks) + reserve * min_steps
    raise ConfigError(
        f"--budget {budget} is too small for {n} candidates: the smallest plan needs {cheapest} steps",
        hint="raise --budget, lower --min-steps or shrink the search space",
    )


def successive_halving(
    candidates: list[list[str]],
    rungs: list[tuple[int, int]],
    run: Callable[[list[str], int], float | None],
    on_result: Callable[[Trial, int], None] | None = None,
) -> tuple[Trial, list[Trial]]:
    """Run the plan: ``run(overrides, steps)`` trains one candidate and returns its held-out metric.
    Returns the winner and every trial (with the metric of each rung it reached)."""
    trials = [Trial(i, list(o)) for i, o in enumerate(candidates)]
    alive = trials
    for i, (k, steps) in enumerate(rungs):
        if i > 0:  # promote the best k of the previous rung
            alive = sorted(alive, key=lambda t: (-t.last(), t.index))[:k]
        for trial in alive:
            trial.scores[steps] = run(trial.overrides, steps)
            if on_result is not None:
                on_result(trial, steps)
    winner = min(alive, key=lambda t: (-t.last(), t.index))
    return winner, trials


TRIAL_FOLDER = re.compile(r"\d{5}-")  # a trial run's folder: its steps, then its overrides' values


def earlier_trials(out_dir: Path) -> list[Path]:
    """The trial run folders an earlier sweep left in ``out_dir``: named as ``tandem tune`` names them and
    holding a run's ``config.yaml``. Other files and folders there are not trials."""
    if not out_dir.is_dir():
        return []
    return sorted(
        p
        for p in out_dir.iterdir()
        if p.is_dir() and TRIAL_FOLDER.match(p.name) and (p / "config.yaml").is_file()
    )


def finished_run(folder: Path, resolved: str) -> dict[str, float] | None:
    """The held-out metrics of a finished run in ``folder`` (``summary.json`` written last, and not by
    an alert's stop) that was trained with exactly the resolved config ``resolved`` (its own
    ``run.output_dir`` aside, so a sweep folder that was moved or copied still resumes); None when it
    must train."""
    summary, written = folder / "summary.json", folder / "config.yaml"
    if not (summary.is_file() and written.is_file()) or _placed(written.read_text()) != _placed(resolved):
        return None
    done = json.loads(summary.read_text())
    return None if "stopped_by_alert" in done else dict(done.get("eval_after", {}))


def _placed(config_yaml: str) -> Any:
    """A resolved config as data, without the folder it was written for."""
    data = yaml.safe_load(config_yaml)
    data.get("run", {}).pop("output_dir", None)
    return data
