"""Alerts during training: rules on metrics (pure, testable) and the side effects of raising one.

A rule (:class:`tandem.config.schema.AlertRuleConfig`) watches one metric:

- ``nonfinite`` — the value is NaN/Inf (or ``None``, how JSON stores them);
- ``above`` / ``below`` — the value crosses ``threshold``;
- ``spike`` — value > threshold × median of the previous ``window`` values (needs ``min_history``);
- ``growth`` — value > threshold × mean of the first ``min_history`` values (e.g. response-length blow-up);
- ``diverge`` — reward hacking: at an evaluation step the held-out metric ``against`` is at least
  ``threshold`` below its best of the last ``window`` evaluations while the train ``metric`` is at or above
  its value at that best.

Every rule may ask for ``patience`` consecutive checks on which its condition holds before it fires (a
step where the rule cannot be checked — its metric absent, for ``diverge`` no held-out value — neither
counts nor breaks the run of checks).

:class:`AlertEngine` keeps the per-rule history and returns :class:`Alert` objects; it never acts.
The training loop acts (skip, stop, rollback); :class:`AlertSink` records every alert in
``alerts.jsonl``, shows it in the progress display and POSTs it to a webhook for ``warn`` (and all others).
"""

from __future__ import annotations

import json
import logging
import math
import os
import statistics
import sys
import time
import urllib.error
import urllib.request
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tandem.config.schema import AlertRuleConfig
from tandem.monitor.jsonl import JsonlWriter, read_jsonl

log = logging.getLogger(__name__)

ALERTS_FILE = "alerts.jsonl"


@dataclass(frozen=True)
class Alert:
    """One fired rule at one step."""

    step: int
    rule: str
    metric: str
    value: float | None
    action: str
    message: str

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def rule_label(rule: AlertRuleConfig) -> str:
    return rule.name or f"{rule.metric}:{rule.kind}"


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


class _RuleState:
    """History one rule needs: recent values (spike), first values (growth), (train, held-out) pairs."""

    def __init__(self, rule: AlertRuleConfig) -> None:
        self.rule = rule
        self.recent: deque[float] = deque(maxlen=rule.window)
        self.first: list[float] = []
        self.pairs: deque[tuple[float, float]] = deque(maxlen=rule.window)
        self.active = False  # warn rules fire on the rising edge only, not again until the condition clears
        self.streak = 0  # consecutive checks on which the condition held (``patience``)

    def checkable(self, metrics: Mapping[str, Any]) -> bool:
        """Whether this step's metrics let the rule be checked (a step that does not leaves ``streak``)."""
        if self.rule.metric not in metrics:
            return False
        return self.rule.kind != "diverge" or _finite(metrics.get(self.rule.against or "", _MISSING))

    def test(self, metrics: Mapping[str, Any]) -> str | None:
        """Why the rule fires on ``metrics`` given the history so far, or None."""
        r, v = self.rule, metrics.get(self.rule.metric, _MISSING)
        if v is _MISSING:
            return None
        if r.kind == "nonfinite":
            return None if _finite(v) else f"{r.metric} is {v}"
        if not _finite(v):
            return None
        t = float(r.threshold) if r.threshold is not None else math.inf
        if r.kind == "above" and v > t:
            return f"{r.metric} = {v:.4g} above {t:.4g}"
        if r.kind == "below" and v < t:
            return f"{r.metric} = {v:.4g} below {t:.4g}"
        if r.kind == "spike" and len(self.recent) >= r.min_history:
            med = statistics.median(self.recent)
            if v > t * med:
                return f"{r.metric} = {v:.4g} is > {t:g}× its running median {med:.4g}"
        if r.kind == "growth" and len(self.first) >= r.min_history:
            base = sum(self.first) / len(self.first)
            if v > t * base:
                return f"{r.metric} = {v:.4g} grew > {t:g}× its start {base:.4g}"
        if r.kind == "diverge":
            return self._diverges(float(v), metrics.get(r.against or "", _MISSING), t)
        return None

    def _diverges(self, train: float, held: Any, t: float) -> str | None:
        if not _finite(held) or len(self.pairs) < self.rule.min_history - 1 or not self.pairs:
            return None
        best_train, best_held = max(self.pairs, key=lambda p: p[1])
        if best_held - held >= t and train >= best_train:
            return (
                f"{self.rule.metric} rose to {train:.4g} while {self.rule.against} fell "
                f"{best_held:.4g} -> {held:.4g} (reward hacking?)"
            )
        return None

    def record(self, metrics: Mapping[str, Any]) -> None:
        v = metrics.get(self.rule.metric)
        if not _finite(v):
            return
        self.recent.append(float(v))
        if len(self.first) < self.rule.min_history:
            self.first.append(float(v))
        held = metrics.get(self.rule.against or "")
        if self.rule.kind == "diverge" and _finite(held):
            self.pairs.append((float(v), float(held)))

    @property
    def key(self) -> list[str]:
        """What ties a saved history to a rule: its label, metric and kind (a threshold may change)."""
        return [rule_label(self.rule), self.rule.metric, self.rule.kind]

    def state_dict(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "recent": list(self.recent),
            "first": list(self.first),
            "pairs": [list(p) for p in self.pairs],
            "active": self.active,
            "streak": self.streak,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """The history :meth:`state_dict` saved, cut to this rule's ``window`` and ``min_history``."""
        self.recent = deque((float(v) for v in state["recent"]), maxlen=self.rule.window)
        self.first = [float(v) for v in state["first"]][: self.rule.min_history]
        self.pairs = deque(((float(a), float(b)) for a, b in state["pairs"]), maxlen=self.rule.window)
        self.active = bool(state["active"])
        self.streak = int(state["streak"])


_MISSING = object()


class AlertEngine:
    """Evaluates rules against each step's metrics; pure apart from its own history."""

    def __init__(self, rules: Sequence[AlertRuleConfig]) -> None:
        self.states = [_RuleState(r) for r in rules]

    @property
    def rules(self) -> list[AlertRuleConfig]:
        return [s.rule for s in self.states]

    def state_dict(self) -> dict[str, Any]:
        """Every rule's history as plain JSON data (a checkpoint keeps it: :meth:`load_state_dict`)."""
        return {"rules": [s.state_dict() for s in self.states]}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from :meth:`state_dict`'s history. A rule takes the saved history of the rule with its
        label, metric and kind (in order, when several share them); a rule with none starts fresh, and a
        saved history no rule claims is dropped (``monitor.alerts`` changed on resume). Raises
        ``ValueError`` naming what is malformed."""
        try:
            saved: dict[tuple[str, ...], list[Mapping[str, Any]]] = {}
            for entry in state["rules"]:
                saved.setdefault(tuple(entry["key"]), []).append(entry)
            fresh = [_RuleState(s.rule) for s in self.states]
            for s in fresh:
                queue = saved.get(tuple(s.key))
                if queue:
                    s.load_state_dict(queue.pop(0))
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(f"malformed alert history: {type(err).__name__}: {err}") from None
        self.states = fresh

    def veto(self, metrics: Mapping[str, Any]) -> list[Alert]:
        """``skip`` rules that fire on partial metrics (inside the update, before ``optimizer.step()``);
        history is not updated. ``step`` of the returned alerts is −1 (not known here)."""
        fired = self._fire(-1, metrics, actions=("skip",))
        return [a for s, a in fired if s.streak + 1 >= s.rule.patience]

    def check(self, step: int, metrics: Mapping[str, Any]) -> list[Alert]:
        """All rules that fire on this step's metrics; then the history takes this step's values.

        A rule fires once its condition has held on ``patience`` consecutive checks. A ``warn`` rule then
        reports once and stays quiet while the condition keeps holding (one webhook call per incident);
        the other actions fire on every step they match.
        """
        fired = self._fire(step, metrics, actions=None)
        hit = {id(s) for s, _ in fired}
        for s in self.states:
            if id(s) in hit:
                s.streak += 1
            elif s.checkable(metrics):
                s.streak = 0
        ripe = [(s, a) for s, a in fired if s.streak >= s.rule.patience]
        alerts = [a for s, a in ripe if s.rule.action != "warn" or not s.active]
        ripe_ids = {id(s) for s, _ in ripe}
        for s in self.states:
            s.active = id(s) in ripe_ids
            s.record(metrics)
        return alerts

    def _fire(
        self, step: int, metrics: Mapping[str, Any], actions: tuple[str, ...] | None
    ) -> list[tuple[_RuleState, Alert]]:
        out = []
        for s in self.states:
            if actions is not None and s.rule.action not in actions:
                continue
            why = s.test(metrics)
            if why is not None:
                v = metrics.get(s.rule.metric)
                value = float(v) if isinstance(v, (int, float)) else None
                msg = f"step {step}: {why} -> {s.rule.action}" if step >= 0 else f"{why} -> {s.rule.action}"
                out.append((s, Alert(step, rule_label(s.rule), s.rule.metric, value, s.rule.action, msg)))
        return out


def post_webhook(url: str, payload: Mapping[str, Any], *, timeout: float = 5.0) -> bool:
    """POST ``payload`` as JSON to ``url``; a failing webhook is logged, never fatal. True on 2xx."""
    data = json.dumps(payload, allow_nan=False, default=str).encode("utf-8")
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310 - user-configured URL
            return 200 <= resp.status < 300
    except (urllib.error.URLError, OSError, ValueError) as exc:
        log.warning("alert webhook %s failed: %s", url, exc)
        return False


class AlertSink:
    """Where fired alerts go: ``alerts.jsonl`` in the run folder, the display (``show``) and a webhook."""

    def __init__(
        self, run_dir: str | Path, *, webhook: str | None, show: Callable[[str], None], run: str = ""
    ) -> None:
        self.writer = JsonlWriter(Path(run_dir) / ALERTS_FILE)
        self.webhook = webhook
        self.show = show
        self.run = run

    def emit(self, alert: Alert, *, effect: str) -> None:
        """Record ``alert`` and what the loop did about it (``effect``, e.g. "update skipped")."""
        row = {**alert.to_json(), "effect": effect, "time": round(time.time(), 3)}
        self.writer.write(row)
        self.show(f"[{alert.action}] {alert.message} ({effect})")
        if self.webhook:
            post_webhook(self.webhook, {"run": self.run, **row})

    def close(self) -> None:
        self.writer.close()


def read_alerts(run_dir: str | Path) -> list[dict[str, Any]]:
    """Rows of ``run_dir/alerts.jsonl`` (empty when the run raised none)."""
    path = Path(run_dir) / ALERTS_FILE
    return read_jsonl(path) if path.exists() else []


def system_metrics() -> dict[str, float]:
    """Host memory in use as a fraction of physical memory (``system/host_mem_frac``), and the GPU's
    (``system/gpu_mem_frac``, reserved / total) when torch has initialised CUDA. Cheap: sysconf only."""
    out: dict[str, float] = {}
    try:
        total, avail = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_AVPHYS_PAGES")
        if total > 0:
            out["system/host_mem_frac"] = 1.0 - avail / total
    except (ValueError, OSError, AttributeError):  # pragma: no cover - non-POSIX
        pass
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        free, total = torch.cuda.mem_get_info()
        out["system/gpu_mem_frac"] = 1.0 - free / total
    return out
