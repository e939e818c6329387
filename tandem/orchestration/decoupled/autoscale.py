"""Elastic rollout workers: decide after each learner step whether to add or retire a worker.

Signals (both already measured by the decoupled learner):

* the learner *starves* — it waited for data for more than ``starve_ratio`` of the step
  (``idle/learner_ratio``) while the workers were busy generating (``idle/rollout_ratio`` below one half).
  A busy-but-slow rollout side is what one more worker fixes; workers that sit idle because the staleness
  bound η admits no new batch are not helped by more workers, so that case never scales up;
* the channel is *full* — at least ``full_depth`` batches wait (channel depth + the learner's buffer):
  the rollout side outruns the learner and the waiting samples only grow stale, so one worker is retired.

A condition must hold for ``patience`` consecutive steps, and after an action the policy waits
``cooldown`` steps (not counted towards ``patience``); the worker count stays within ``[min_workers, max_workers]``. Pure bookkeeping — the
runtime applies the decision (``supervisor.add_worker`` / ``remove_worker``) without stopping the learner.

With ``target: planner`` the two signals are replaced by the planner (:mod:`tandem.plan`): the step metrics
of ``planner_window`` steps are fitted into phase times (``tandem.plan.calibrate.fit_phases``), the
simulator predicts samples/s for every worker count in the bounds at the run's η, and the policy moves one
worker towards the fewest workers within ``planner_tolerance`` of the best; then it waits ``cooldown``
steps and fits a fresh window (the measurements of the old count no longer apply).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from tandem.config.schema import AutoscaleConfig
from tandem.plan.calibrate import fit_phases
from tandem.plan.layouts import target_workers


@dataclass
class Autoscaler:
    """``decide(...)`` → +1 (add a worker), −1 (retire one) or 0, from one step's measurements."""

    cfg: AutoscaleConfig
    staleness: int = 0  # the run's η (target planner)
    in_flight: bool = False  # the run's weight_sync is in_flight (target planner)
    _starved: int = 0
    _full: int = 0
    _cooldown: int = 0
    _window: list[dict[str, float]] = field(default_factory=list)
    last_target: int | None = None  # the planner's last answer (target planner)

    def decide(
        self,
        *,
        learner_idle: float,
        rollout_idle: float,
        waiting: int,
        workers: int,
        metrics: Mapping[str, float] | None = None,
    ) -> int:
        """``learner_idle``/``rollout_idle``: idle shares of the last step; ``waiting``: batches queued
        (channel + learner buffer); ``workers``: live, non-retiring rollout workers; ``metrics``: the
        step's metrics (``timing/*``, ``worker/sync_s``, ``idle/learner_ratio``; target planner)."""
        cfg = self.cfg
        if self._cooldown > 0:  # the last action's effect is not measurable yet: do not count this step
            self._cooldown -= 1
            return 0
        if cfg.target == "planner":
            return self._plan(dict(metrics or {}), workers)
        starving = learner_idle > cfg.starve_ratio and rollout_idle < 0.5
        full = waiting >= cfg.full_depth
        self._starved = self._starved + 1 if starving else 0
        self._full = self._full + 1 if full else 0
        decision = 0
        if self._starved >= cfg.patience and workers < cfg.max_workers:
            decision = 1
        elif self._full >= cfg.patience and workers > cfg.min_workers:
            decision = -1
        elif workers < cfg.min_workers:
            decision = 1
        if decision:
            self._starved = self._full = 0
            self._cooldown = cfg.cooldown
        return decision

    def _plan(self, metrics: dict[str, float], workers: int) -> int:
        cfg = self.cfg
        if workers < cfg.min_workers:
            return self._act(1)
        if "timing/step" in metrics:
            self._window.append(metrics)
        if len(self._window) < cfg.planner_window:
            return 0
        phases = fit_phases(self._window, "decoupled")
        self._window = []
        self.last_target = target_workers(
            phases,
            self.staleness,
            min_workers=cfg.min_workers,
            max_workers=cfg.max_workers,
            tolerance=cfg.planner_tolerance,
            in_flight=self.in_flight,
        )
        if self.last_target == workers:
            return 0
        return self._act(1 if self.last_target > workers else -1)

    def _act(self, decision: int) -> int:
        self._window = []
        self._cooldown = self.cfg.cooldown
        return decision
