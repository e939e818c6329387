"""``monitor``: alert rules (and their presets), evaluation and sample logging, dashboards."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from tandem.config.base import Section


class AlertRuleConfig(Section):
    """One alert rule: when ``metric`` meets the condition ``kind``/``threshold``, take ``action``."""

    name: str | None = Field(None, description="Label shown in alerts; defaults to metric and kind.")
    metric: str = Field(..., description="Metric name, e.g. actor/grad_norm, actor/kl, eval/reward_mean.")
    kind: Literal["nonfinite", "above", "below", "spike", "growth", "diverge"] = Field(
        ...,
        description="nonfinite: NaN/Inf; above/below: vs threshold; spike: > threshold × running median of "
        "the last `window` values; growth: > threshold × the mean of the first `min_history` values; "
        "diverge: `metric` (train) rose while `against` (held-out) fell by ≥ threshold from its best.",
    )
    threshold: float | None = Field(
        None, description="Bound or factor; null only for nonfinite and the staleness preset (uses η)."
    )
    against: str | None = Field(None, description="Held-out metric compared with `metric` (kind diverge).")
    window: int = Field(20, ge=1, description="History length for spike (median) and diverge (best).")
    min_history: int = Field(3, ge=1, description="Values needed before spike/growth/diverge can fire.")
    patience: int = Field(
        1,
        ge=1,
        description="Consecutive checks the condition must hold before the rule fires (diverge counts "
        "evaluations only): 2 ignores a single noisy held-out dip.",
    )
    action: Literal["warn", "skip", "stop", "rollback"] = Field(
        "warn",
        description="warn: log + webhook; skip: drop the step's update; stop: checkpoint and exit non-zero; "
        "rollback: restore the last good checkpoint and scale the LR by `lr_scale`.",
    )
    lr_scale: float = Field(0.5, gt=0, le=1, description="LR multiplier applied on rollback.")

    @model_validator(mode="after")
    def _needs_threshold(self) -> AlertRuleConfig:
        if self.kind != "nonfinite" and self.threshold is None and not self.metric.startswith("staleness/"):
            raise ValueError(f"alert rule on {self.metric}: kind '{self.kind}' needs a threshold")
        if self.kind == "diverge" and not self.against:
            raise ValueError(f"alert rule on {self.metric}: kind 'diverge' needs `against` (held-out metric)")
        return self


ALERT_PRESETS: dict[str, dict[str, Any]] = {
    "nan_loss": {"metric": "actor/pg_loss", "kind": "nonfinite", "action": "skip"},
    "nan_reward": {"metric": "reward/mean", "kind": "nonfinite", "action": "stop"},
    "nan_grad": {"metric": "actor/grad_norm", "kind": "nonfinite", "action": "skip"},
    "grad_spike": {"metric": "actor/grad_norm", "kind": "spike", "threshold": 10.0, "action": "warn"},
    "kl_high": {"metric": "actor/kl", "kind": "above", "threshold": 1.0, "action": "warn"},
    "entropy_collapse": {"metric": "actor/entropy", "kind": "below", "threshold": 0.01, "action": "warn"},
    "length_blowup": {"metric": "response/length_mean", "kind": "growth", "threshold": 3.0, "action": "warn"},
    "reward_hacking": {
        "metric": "reward/mean",
        "kind": "diverge",
        "against": "eval/reward_mean",
        "threshold": 0.1,
        "window": 5,
        "min_history": 2,
        "patience": 2,  # a 200-prompt evaluation dips 10 points now and then; a real divergence persists
        "action": "warn",
    },
    "staleness": {"metric": "staleness/max", "kind": "above", "action": "warn"},
    "host_memory": {"metric": "system/host_mem_frac", "kind": "above", "threshold": 0.95, "action": "warn"},
    "gpu_memory": {"metric": "system/gpu_mem_frac", "kind": "above", "threshold": 0.95, "action": "warn"},
}
DEFAULT_ALERTS = tuple(ALERT_PRESETS)


def _alert_rules(value: Any) -> Any:
    """Expand preset names (strings) in ``monitor.alerts`` into rule dicts; dicts pass through."""
    if not isinstance(value, list):
        return value
    out = []
    for i, item in enumerate(value):
        if isinstance(item, str):
            if item not in ALERT_PRESETS:
                raise ValueError(
                    f"item {i}: unknown alert preset '{item}'; valid: {', '.join(ALERT_PRESETS)}"
                )
            out.append({"name": item, **ALERT_PRESETS[item]})
        else:
            out.append(item)
    return out


class MonitorConfig(Section):
    alerts: list[AlertRuleConfig] = Field(
        default_factory=lambda: list(DEFAULT_ALERTS),
        validate_default=True,
        description="Alert rules: preset names (see ALERT_PRESETS in tandem/config/monitor.py and "
        "docs/evaluation.md) or rule objects {metric, kind, threshold, action, ...}; [] disables alerts.",
    )
    alert_webhook: str | None = Field(
        None, description="URL that receives every alert as a JSON POST (warn and all other actions)."
    )
    max_rollbacks: int = Field(
        3, ge=0, description="Rollbacks allowed before a rollback alert stops the run."
    )

    @field_validator("alerts", mode="before")
    @classmethod
    def _expand_alert_presets(cls, value: Any) -> Any:
        return _alert_rules(value)

    eval_every: int = Field(
        25, ge=0, description="Evaluate on held-out prompts every N steps (0 = only start/end)."
    )
    sample_every: int = Field(
        25, ge=0, description="Log a sample of prompts/completions/rewards every N steps."
    )
    num_samples: int = Field(4, ge=0, description="Completions logged each time.")
    tensorboard: bool = Field(True, description="Write TensorBoard event files.")
    report_to: list[str] = Field(
        default_factory=list,
        description="Experiment trackers that also receive every metric row, the samples and the resolved "
        "config (TRL's report_to): names in tandem.monitor.trackers.TRACKERS — wandb (pip install "
        "'tandem-rl[wandb]'; it reads WANDB_API_KEY, WANDB_ENTITY, WANDB_MODE=offline from the environment). "
        "A string is a list of one; 'none' or [] reports nowhere. Checked before the run starts.",
    )
    project: str | None = Field(
        None, description="The trackers' project; None: $WANDB_PROJECT for W&B, else 'tandem'."
    )
    group: str | None = Field(
        None,
        description="The trackers' group, to compare runs together (tandem tune sets it to its output "
        "folder's name for its trials when unset).",
    )
    tags: list[str] = Field(default_factory=list, description="Tags of the trackers' run.")
    progress: bool = Field(True, description="Show a progress bar.")

    @field_validator("report_to", mode="before")
    @classmethod
    def _one_tracker(cls, value: Any) -> Any:
        if isinstance(value, str):  # TRL's report_to="wandb" / "none"
            return [] if value.strip().lower() == "none" else [value]
        return value
