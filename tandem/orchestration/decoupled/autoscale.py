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
"""

from __future__ import annotations

from dataclasses import dataclass

from tandem.config.schema import AutoscaleConfig


@dataclass
class Autoscaler:
    """``decide(...)`` → +1 (add a worker), −1 (retire one) or 0, from one step's measurements."""

    cfg: AutoscaleConfig
    _starved: int = 0
    _full: int = 0
    _cooldown: int = 0

    def decide(self, *, learner_idle: float, rollout_idle: float, waiting: int, workers: int) -> int:
        """``learner_idle``/``rollout_idle``: idle shares of the last step; ``waiting``: batches queued
        (channel + learner buffer); ``workers``: live, non-retiring rollout workers."""
        cfg = self.cfg
        if self._cooldown > 0:  # the last action's effect is not measurable yet: do not count this step
            self._cooldown -= 1
            return 0
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
