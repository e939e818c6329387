"""What a report reads from a run folder, as plain Python data."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tandem.errors import DataError
from tandem.monitor.jsonl import read_jsonl_lines


@dataclass
class RunData:
    """One run: per-step metrics (last row wins when a rollback replayed a step), samples, alerts, config."""

    name: str
    path: Path
    rows: list[dict[str, Any]]
    samples: list[dict[str, Any]] = field(default_factory=list)
    alerts: list[dict[str, Any]] = field(default_factory=list)
    config_text: str = ""
    summary: dict[str, Any] = field(default_factory=dict)

    def series(self, key: str) -> tuple[list[int], list[float]]:
        """(steps, values) of one metric, skipping steps where it is missing or was NaN (``null``)."""
        xs, ys = [], []
        for row in self.rows:
            v = row.get(key)
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                xs.append(int(row["step"]))
                ys.append(float(v))
        return xs, ys

    def metric_names(self) -> set[str]:
        return {k for row in self.rows for k in row if k not in ("step", "time")}

    @property
    def eval_size(self) -> int | None:
        """``data.eval_size`` of the run's config (the held-out prompts per evaluation), if it says."""
        import yaml

        try:
            cfg = yaml.safe_load(self.config_text) if self.config_text else None
        except yaml.YAMLError:
            return None
        size = (cfg or {}).get("data", {}).get("eval_size") if isinstance(cfg, dict) else None
        return size if isinstance(size, int) and size > 0 else None

    @property
    def architecture(self) -> str:
        for line in self.config_text.splitlines():
            if line.strip().startswith("mode:"):
                return line.split(":", 1)[1].strip()
        return "colocated"


def load_run(path: str | Path) -> RunData:
    """Read a run folder; DataError names the folder when it holds no ``metrics.jsonl``."""
    p = Path(path)
    if not (p / "metrics.jsonl").is_file():
        raise DataError("not a run folder (no metrics.jsonl)", where=str(p), hint="pass runs/NAME")
    by_step: dict[int, dict[str, Any]] = {}
    for row in _stepped_rows(p / "metrics.jsonl"):
        by_step.setdefault(row["step"], {}).update(row)  # replayed steps: later values win
    summary_path = p / "summary.json"
    config_path = p / "config.yaml"
    samples, alerts = p / "samples.jsonl", p / "alerts.jsonl"
    return RunData(
        name=p.name,
        path=p,
        rows=[by_step[s] for s in sorted(by_step)],
        samples=_stepped_rows(samples) if samples.is_file() else [],
        alerts=_stepped_rows(alerts, required=False) if alerts.is_file() else [],
        config_text=config_path.read_text(encoding="utf-8") if config_path.is_file() else "",
        summary=_read_json(summary_path) if summary_path.is_file() else {},
    )


def _stepped_rows(path: Path, *, required: bool = True) -> list[dict[str, Any]]:
    """The rows of a run's JSONL file, each ``step`` an integer (absent only if not ``required``);
    anything else is a DataError naming ``file:line`` rather than a crash while plotting."""
    rows = []
    for line, row in read_jsonl_lines(path):
        step = row.get("step")
        if (step is not None or required) and (isinstance(step, bool) or not isinstance(step, int)):
            raise DataError(f"'step' must be an integer, got {repr(step)[:40]}", where=f"{path}:{line}")
        rows.append(row)
    return rows


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise DataError(f"invalid JSON: {exc.msg}", where=f"{path}:{exc.lineno}") from None
