"""The best model of a run (``checkpoint.best_metric``): kept in ``<run>/best/`` whenever an evaluation beats it.

RL on a small held-out set is noisy: accuracy often peaks mid-run and drifts down by a few points before the
last step (issue 17's curves), so the final checkpoint is not the model a user wants. With
``checkpoint.best_metric`` (e.g. ``eval/accuracy``) every evaluation, the step-0 one included, is compared
with the best so far (``checkpoint.best_mode``: ``max`` or ``min``); a better one replaces ``best/``
atomically: the policy and tokenizer as a Hugging Face folder (what ``tandem export``, ``tandem serve`` and
``model.path`` read) and ``best.json`` (step, metric, value, the reward functions' ``trainer_state``) inside it, so the two never disagree. A resumed
run reads ``best/best.json`` and keeps competing against it. Only the weights are kept, not the optimiser:
``best/`` is a model to use, not a point to resume from.
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Any

from tandem.data.outputs import BEST_RECORD
from tandem.train.checkpoint import save_model_folder

log = logging.getLogger(__name__)

BEST_DIR = "best"


class BestModel:
    """Tracks the best value of ``metric`` and writes ``<run_dir>/best/`` when it improves."""

    def __init__(self, run_dir: Path, metric: str, mode: str = "max") -> None:
        if mode not in ("max", "min"):
            raise ValueError(f"checkpoint.best_mode: expected max or min, got {mode!r}")
        self.folder, self.metric, self.mode = Path(run_dir) / BEST_DIR, metric, mode
        self.record: dict[str, Any] | None = None
        path = self.folder / BEST_RECORD
        if path.is_file():  # a resumed run competes against what it already kept
            self.record = json.loads(path.read_text(encoding="utf-8"))

    def improves(self, value: float) -> bool:
        """True when ``value`` beats the best so far (ties keep the earlier model; NaN never wins)."""
        if not math.isfinite(value):
            return False
        if self.record is None:
            return True
        best = float(self.record["value"])
        return value > best if self.mode == "max" else value < best

    def candidate(self, metrics: dict[str, Any]) -> float | None:
        """The metric's value in ``metrics`` when it beats the best so far, else ``None`` (also when the
        row holds no evaluation)."""
        value = metrics.get(self.metric)
        if isinstance(value, (int, float)) and self.improves(float(value)):
            return float(value)
        return None

    def save(
        self,
        step: int,
        value: float,
        policy: Any,
        tokenizer: Any | None,
        trainer_state: dict[str, Any] | None = None,
    ) -> None:
        """Replace ``best/`` with ``policy`` (and ``tokenizer``) and the record of ``step`` and ``value``
        (and ``trainer_state``: what the reward functions saw in that evaluation, which ``tandem eval``
        passes them again)."""
        record = {"step": step, "metric": self.metric, "mode": self.mode, "value": value}
        if trainer_state is not None:
            record["trainer_state"] = trainer_state
        save_model_folder(self.folder, policy, tokenizer, extra_files={BEST_RECORD: record})
        self.record = record
        log.info("best %s so far: %.4f at step %d -> %s", self.metric, value, step, self.folder)

    def summary(self) -> dict[str, Any]:
        """``summary.json``'s ``best`` entry: the record and the folder (empty when nothing was kept)."""
        return {} if self.record is None else {**self.record, "path": str(self.folder)}
