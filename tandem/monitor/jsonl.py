"""Append-only JSON Lines files for metrics and samples: one object per line, flushed per write.

Readers (``tail -f``, pandas, the CLI) can follow a live run. A crash can leave a torn last line;
:func:`read_jsonl` skips it, and :func:`keep_rows_up_to` rewrites a file to the rows of steps that a
resumed run will not redo, so a resumed run's files equal an uninterrupted run's.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

from tandem.errors import DataError
from tandem.utils.io import atomic_write_text
from tandem.utils.jsonable import to_jsonable

logger = logging.getLogger(__name__)


class JsonlWriter:
    """Appends JSON objects to ``path``, one per line, flushing after each so readers see it at once."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._handle: IO[str] | None = self.path.open("a", encoding="utf-8")

    def write(self, row: Mapping[str, Any]) -> None:
        """Append ``row``; NaN/inf become ``null`` and numpy/torch scalars plain numbers."""
        if self._handle is None:
            raise ValueError(f"{self.path} is closed")
        line = json.dumps(to_jsonable(row), allow_nan=False, ensure_ascii=False)
        self._handle.write(line + "\n")
        self._handle.flush()

    def close(self) -> None:
        """Close the file; later writes raise. Safe to call twice."""
        if self._handle is not None:
            self._handle.close()
            self._handle = None


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """All objects in a JSON Lines file, in order.

    A torn final line (no trailing newline, from a crash mid-write) is skipped with a log message;
    any other malformed line raises :class:`DataError` naming ``file:line``.
    """
    return [row for _, row in read_jsonl_lines(path)]


def read_jsonl_lines(path: str | Path) -> list[tuple[int, dict[str, Any]]]:
    """``(line number, object)`` for every object in a JSON Lines file (see :func:`read_jsonl`), so a
    reader that checks the objects can name ``file:line``."""
    file = Path(path)
    if not file.is_file():
        raise DataError("file not found", where=str(file), hint="check the run folder path")
    text = file.read_text(encoding="utf-8")
    lines = text.split("\n")
    rows: list[tuple[int, dict[str, Any]]] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            if number == len(lines):  # last line without a trailing newline: torn by a crash
                logger.warning("%s:%d: skipping incomplete last line", file, number)
                continue
            raise DataError(f"malformed JSON ({err.msg})", where=f"{file}:{number}") from None
        except RecursionError:
            raise DataError("JSON nested too deeply", where=f"{file}:{number}") from None
        if not isinstance(row, dict):
            raise DataError("expected a JSON object per line", where=f"{file}:{number}")
        rows.append((number, row))
    return rows


def keep_rows_up_to(path: str | Path, step: int) -> None:
    """Rewrite ``path`` atomically, keeping only rows whose ``"step"`` is ≤ ``step``.

    Used when a run resumes from a checkpoint at ``step``: rows the crashed run logged after that
    checkpoint are dropped because the resumed run logs those steps again. A missing file is left
    missing.
    """
    file = Path(path)
    if not file.exists():
        return
    kept = [row for row in read_jsonl(file) if isinstance(row.get("step"), int) and row["step"] <= step]
    text = "".join(json.dumps(row, allow_nan=False, ensure_ascii=False) + "\n" for row in kept)
    atomic_write_text(file, text)
