"""Alerts acting on the training loop (both architectures): the rules come from ``monitor.alerts`` (pure
engine in :mod:`tandem.monitor.alerts`); this module carries out their actions.

- ``warn`` — recorded in ``alerts.jsonl``, shown in the progress display, POSTed to ``monitor.alert_webhook``.
- ``skip`` — the update is dropped before ``optimizer.step()`` (the trainer's ``pre_update`` veto).
- ``stop`` — the runner saves a checkpoint and raises :class:`AlertStopError` (exit code 3).
- ``rollback`` — the last good checkpoint (saved at a step that raised no alert, at least two steps
  before the alert: see :func:`rollback_target`) is restored — weights, optimiser, scheduler, learner
  state — and the learning rate is multiplied by ``lr_scale``. A colocated run also replays the same
  prompts; a decoupled run publishes the restored weights under a new version, drops every batch sampled
  before it and carries on with new tickets (the ticket accounting is never rolled back).
  After ``monitor.max_rollbacks`` rollbacks a further one stops the run instead.

The controller's state — every rule's history (baselines, recent values, ``patience`` streaks, active
``warn`` incidents) and the rollback count — is saved in each checkpoint (``extra_state["alerts"]``) and
restored on ``--resume``, so a resumed run raises the alerts an uninterrupted one would, and
``monitor.max_rollbacks`` counts over the whole run, not per process. A rollback rewinds the rule history to
the restored checkpoint's (the steps after it are undone, so their metrics no longer describe the run),
while the rollback count only grows.

Both architectures use the same controller on the same :class:`~tandem.orchestration.trainer.Trainer`.
With a DDP learner (``trainer.world_size > 1``) a rollback restores rank 0 and then hands its whole state
to the other ranks, as at start; with FSDP2 every rank reads its own shards of the checkpoint and then
takes rank 0's schedule and learner state. A weight average (``trainer.ema_decay``) restarts from the
checkpoint's: from its ``model/`` where rank 0 averages alone, from its shards where every rank keeps
its shards of the average (FSDP2, decoupled).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from tandem.config.schema import TandemConfig
from tandem.errors import TandemError
from tandem.monitor.alerts import Alert, AlertEngine, AlertSink, rule_label, system_metrics
from tandem.train.checkpoint import latest_checkpoint, list_checkpoints

log = logging.getLogger(__name__)

ALERT_STATE_KEY = "alerts"  # the controller's state in a checkpoint's extra_state


class AlertStopError(TandemError):
    """A ``stop`` alert ended the run (after saving a checkpoint)."""

    exit_code = 3


class AlertTarget(Protocol):
    """What the controller acts on (:class:`~tandem.orchestration.trainer.Trainer`): ``pre_update`` may
    veto an update, ``restore`` continues from a checkpoint's extra state."""

    pre_update: Callable[[dict[str, float]], bool] | None
    step: int

    learn: Any  # the LearnerStep: its live optimiser and schedule (live_optimizer)

    def load_checkpoint(self, folder: Path, parts: Any) -> dict[str, Any]: ...

    def restore(self, extra_state: dict[str, Any], *, rollback: bool = False) -> None: ...

    def sync_ranks(self) -> None: ...


def resolve_rules(cfg: TandemConfig) -> list[Any]:
    """The configured rules, with the staleness preset's bound filled from ``architecture.staleness``."""
    rules = []
    for rule in cfg.monitor.alerts:
        if rule.threshold is None and rule.kind != "nonfinite":
            rule = rule.model_copy(update={"threshold": float(cfg.architecture.staleness)})
        rules.append(rule)
    return rules


class AlertController:
    """Checks every step's metrics and performs the fired rules' actions on the trainer."""

    def __init__(
        self,
        cfg: TandemConfig,
        run_dir: Path,
        trainer: AlertTarget,
        show: Callable[[str], None],
    ) -> None:
        self.cfg = cfg
        self.trainer = trainer
        self.ckpt_root = run_dir / "checkpoints"
        self.engine = AlertEngine(resolve_rules(cfg))
        self.sink = AlertSink(run_dir, webhook=cfg.monitor.alert_webhook, show=show, run=cfg.run.name)
        self.rollbacks = 0
        self.fired_this_step = False
        self._pending_scale: float | None = None
        if any(r.action == "skip" for r in self.engine.rules):
            trainer.pre_update = self.pre_update

    @property
    def wants_initial_checkpoint(self) -> bool:
        """Rollback needs something to restore: the runner saves step 0 when no checkpoint exists."""
        return any(r.action == "rollback" for r in self.engine.rules)

    def pre_update(self, metrics: dict[str, float]) -> bool:
        """Veto (False) the optimiser step when a ``skip`` rule fires on the step's metrics so far."""
        return not self.engine.veto(metrics)

    def after_step(self, step: int, metrics: dict[str, Any]) -> str:
        """Add system metrics, evaluate all rules and record them; returns ``"ok"``, ``"stop"`` or
        ``"rollback"`` (the strongest action that fired)."""
        metrics.update(system_metrics())
        alerts = self.engine.check(step, metrics)
        self.fired_this_step = bool(alerts)
        outcome = "ok"
        for alert in alerts:
            effect, act = self._effect(alert, metrics)
            self.sink.emit(alert, effect=effect)
            if act == "stop" or (act == "rollback" and outcome != "stop"):
                outcome = act
        return outcome

    def _effect(self, alert: Alert, metrics: dict[str, Any]) -> tuple[str, str]:
        if alert.action == "skip":
            skipped = metrics.get("actor/skipped_by_alert", 0) or metrics.get("actor/skipped_nonfinite", 0)
            return ("update skipped" if skipped else "not skipped: metric known only after the update"), "ok"
        if alert.action == "stop":
            return "run stopped with a checkpoint", "stop"
        if alert.action == "rollback":
            if self.rollbacks >= self.cfg.monitor.max_rollbacks or latest_checkpoint(self.ckpt_root) is None:
                return (
                    f"no rollback left (monitor.max_rollbacks={self.cfg.monitor.max_rollbacks}): stop",
                    "stop",
                )
            rule = next(r for r in self.engine.rules if rule_label(r) == alert.rule)
            self._pending_scale = min(self._pending_scale or 1.0, rule.lr_scale)
            return "rolled back to the last good checkpoint", "rollback"
        return "logged", "ok"

    def rollback(self, parts: Any, lr_scale: float | None = None) -> Path:
        """Restore the newest checkpoint into ``parts`` and the trainer; scale the LR. Returns its folder."""
        ckpt = rollback_target(self.ckpt_root, self.trainer.step)
        if ckpt is None:  # pragma: no cover - guarded by _effect
            raise AlertStopError("rollback requested but no checkpoint exists", where=str(self.ckpt_root))
        scale = lr_scale if lr_scale is not None else (self._pending_scale or 1.0)
        self._pending_scale = None
        optimizer, sched = self.trainer.learn.live_optimizer()
        base = list(sched.base_lrs) if sched is not None else [g["lr"] for g in optimizer.param_groups]
        state = self.trainer.load_checkpoint(ckpt, parts)
        self.trainer.restore(state["extra_state"], rollback=True)
        self._rewind(state["extra_state"])
        scale_lr(optimizer, sched, [b * scale for b in base])
        self.trainer.sync_ranks()  # a DDP learner's other ranks take the restored state
        self.rollbacks += 1
        log.warning("rolled back to %s (step %d); LR × %g", ckpt, self.trainer.step, scale)
        return ckpt

    def state_dict(self) -> dict[str, Any]:
        """Plain JSON data for a checkpoint: the rules' history, the rollback count and a pending LR scale
        (set only when a ``stop`` at the same step overrode a ``rollback``)."""
        return {
            "engine": self.engine.state_dict(),
            "rollbacks": self.rollbacks,
            "pending_lr_scale": self._pending_scale,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from :meth:`state_dict` (a resume). Raises ``ValueError`` when it is malformed."""
        try:
            rollbacks = int(state["rollbacks"])
            scale = state.get("pending_lr_scale")
            scale = None if scale is None else float(scale)
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(f"malformed alert state: {type(err).__name__}: {err}") from None
        self.engine.load_state_dict(state.get("engine", {"rules": []}))
        self.rollbacks, self._pending_scale = rollbacks, scale

    def _rewind(self, extra_state: dict[str, Any]) -> None:
        """A rollback's rule history: the restored checkpoint's, so the replayed steps are judged as the
        first time (their baselines and streaks as they were then, the undone steps forgotten; a ``warn``
        incident that clears in the replay may be reported again). The rollback count is not rewound: it
        only grows, or ``monitor.max_rollbacks`` could never stop a run that keeps rolling back. A
        checkpoint without alert state (written by an older version) leaves the history as it is."""
        saved = extra_state.get(ALERT_STATE_KEY)
        if isinstance(saved, dict) and "engine" in saved:
            try:
                self.engine.load_state_dict(saved["engine"])
            except ValueError as err:
                log.warning("alert history of the rollback target not restored: %s", err)

    def close(self) -> None:
        self.sink.close()


def rollback_target(ckpt_root: Path, step: int) -> Path | None:
    """The newest checkpoint saved at least two steps before ``step`` (else the oldest one).

    An update's damage shows in the *next* step's metrics (KL, entropy, lengths are measured on the
    following rollout), so the checkpoint written right after the bad update looked healthy; skipping
    it restores weights from before the fault."""
    found = list_checkpoints(ckpt_root)
    safe = [p for p in found if _ckpt_step(p) <= step - 2]
    return safe[-1] if safe else (found[0] if found else None)


def _ckpt_step(path: Path) -> int:
    return int(path.name.split("-", 1)[1])


def scale_lr(optimizer: Any, scheduler: Any, new_base: list[float]) -> None:
    """Set the scheduler's peak LRs to ``new_base`` and the optimiser's current LRs to match the schedule."""
    if scheduler is None:
        for group, lr in zip(optimizer.param_groups, new_base, strict=True):
            group["lr"] = lr
        return
    scheduler.base_lrs = list(new_base)
    lambdas = getattr(scheduler, "lr_lambdas", None)
    for i, (group, lr) in enumerate(zip(optimizer.param_groups, new_base, strict=True)):
        factor = lambdas[i](scheduler.last_epoch) if lambdas else 1.0
        group["lr"] = lr * factor
