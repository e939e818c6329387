"""TensorBoard scalars and text, imported lazily and optional.

``torch.utils.tensorboard`` needs the ``tensorboard`` package; without it training must still run, so
the writer logs one warning and turns into a no-op instead of failing.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)


class TensorBoardWriter:
    """Writes numeric metrics as scalars under ``log_dir``; a no-op if tensorboard is not installed.

    ``purge_step`` hides events at or after that step left by a crashed earlier run in the same folder,
    so a resumed run's curves do not double back.
    """

    def __init__(self, log_dir: str | Path, *, purge_step: int | None = None, flush_secs: int = 10) -> None:
        self.log_dir = Path(log_dir)
        self._writer: Any = None
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as err:
            logger.warning("TensorBoard logging disabled: %s (pip install tensorboard)", err)
            return
        self._writer = SummaryWriter(log_dir=str(self.log_dir), purge_step=purge_step, flush_secs=flush_secs)

    @property
    def enabled(self) -> bool:
        """True when events are being written."""
        return self._writer is not None

    def scalars(self, step: int, metrics: Mapping[str, Any]) -> None:
        """Add every numeric value of ``metrics`` (bools as 0/1) as a scalar at ``step``; skip the rest."""
        if self._writer is None:
            return
        for key, value in metrics.items():
            if isinstance(value, (int, float)):  # NaN/inf are kept: TensorBoard marks them
                self._writer.add_scalar(key, float(value), global_step=step)

    def text(self, tag: str, markdown: str, step: int) -> None:
        """Add a markdown text entry (e.g. a table of samples) at ``step``."""
        if self._writer is not None:
            self._writer.add_text(tag, markdown, global_step=step)

    def close(self) -> None:
        """Flush and close the event file; safe to call twice."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None
