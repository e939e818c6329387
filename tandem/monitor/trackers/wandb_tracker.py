"""Weights & Biases (``monitor.report_to: [wandb]``, ``pip install 'tandem-rl[wandb]'``).

W&B reads its own environment: ``WANDB_API_KEY`` (or ``wandb login``), ``WANDB_ENTITY``,
``WANDB_MODE=offline`` (no network: the run is kept in ``<run>/wandb/`` for ``wandb sync``). The project is
``monitor.project``, else ``$WANDB_PROJECT``, else ``tandem``; the W&B run is named after ``run.name`` and
holds the resolved config, and each alert the run raises is a W&B alert. Every row carries Tandem's ``step`` (completed training steps), the x-axis of
every chart (W&B's own counter only ever grows, so a rollback to an earlier checkpoint shows as the curve
going back rather than as rows W&B drops). A resumed run (``--resume``) starts a new W&B run in the same
group, tagged ``resumed@N``, as the Hugging Face trainer's W&B callback does.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

from tandem.errors import ConfigError, first_line
from tandem.monitor.trackers import KEY, TrackerRun

log = logging.getLogger(__name__)
STEP = "step"  # Tandem's step in every W&B row, the x-axis of its charts


class WandbTracker:
    """One W&B run for one Tandem run."""

    def __init__(self, run: TrackerRun) -> None:
        import wandb

        self._wandb = wandb
        tags = list(run.tags) + ([f"resumed@{run.start_step}"] if run.start_step else [])
        try:
            self.run = wandb.init(
                project=run.project or os.environ.get("WANDB_PROJECT") or "tandem",
                name=run.name,
                group=run.group,
                tags=tags or None,
                config=dict(run.config),
                dir=str(run.run_dir),
                job_type="train",
                reinit="create_new",
                settings=wandb.Settings(
                    console="off", quiet=True, save_code=False, x_save_requirements=False
                ),
            )
        except Exception as err:  # no API key, no network, a bad entity: one line, before training
            raise ConfigError(
                f"W&B could not start a run: {type(err).__name__}: {first_line(err)}",
                where=KEY,
                hint="wandb login (or WANDB_API_KEY), or WANDB_MODE=offline to keep the run on this machine",
            ) from None
        self.run.define_metric(STEP)
        self.run.define_metric("*", step_metric=STEP)
        where = self.run.url or os.path.relpath(self.run.dir, run.run_dir)
        log.info("W&B run %s: %s", self.run.id, where)

    def log(self, step: int, values: Mapping[str, float]) -> None:
        numbers = {k: float(v) for k, v in values.items() if isinstance(v, (int, float))}
        if numbers:
            self.run.log({STEP: step, **numbers})

    def log_samples(self, step: int, rows: Sequence[Mapping[str, Any]]) -> None:
        """The step's sample rows as one W&B table (``samples``), a column per field."""
        if not rows:
            return
        columns = list(dict.fromkeys(k for row in rows for k in row))
        data = [[_cell(row.get(c)) for c in columns] for row in rows]
        self.run.log({STEP: step, "samples": self._wandb.Table(columns=columns, data=data)})

    def alert(self, message: str) -> None:
        """A W&B alert (its Slack / e-mail notifications, online), titled by the message's start. W&B holds
        back an alert whose title it sent within ``wait_duration`` (a minute by default); the run's alerts
        are already rate-limited by their rules, so a second is enough to keep each one."""
        self.run.alert(title=message[:64], text=message, level=self._wandb.AlertLevel.WARN, wait_duration=1)

    def close(self, *, failed: bool = False) -> None:
        self.run.finish(exit_code=1 if failed else 0)


def _cell(value: Any) -> Any:
    """A table cell W&B stores as it is (text, a finite number, nothing); anything else as its text."""
    if value is None or isinstance(value, (str, bool, int)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    return str(value)
