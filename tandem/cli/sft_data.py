"""Load SFT pairs for the CLI from a file or a built-in task."""

from __future__ import annotations

import json
from pathlib import Path

from tandem.data.chat import ChatRow
from tandem.errors import ConfigError, DataError
from tandem.train.sft import SFTRow, sft_pair


def sft_pairs(
    *,
    data: Path | None,
    task: str | None,
    train_size: int,
    seed: int,
    task_options: dict | None = None,
    conversational: bool = True,
) -> list[SFTRow]:
    """(prompt, completion) pairs from ``--data`` (JSONL/Parquet) or ``--task`` (reference answers);
    conversational rows as :class:`ChatRow` (DataError at the first one when ``conversational`` is False)."""
    pairs = _rows(data=data, task=task, train_size=train_size, seed=seed, task_options=task_options)
    chat = next((p for p in pairs if isinstance(p, ChatRow)), None)
    if chat is not None and not conversational:
        raise DataError(
            "conversational rows are not supported here; use string prompt/completion rows", where=chat.where
        )
    return pairs


def _rows(
    *, data: Path | None, task: str | None, train_size: int, seed: int, task_options: dict | None
) -> list[SFTRow]:
    if (data is None) == (task is None):
        raise ConfigError("give exactly one of --data or --task")
    if task is not None:
        from tandem.data import rows_from_task
        from tandem.rewards import get_task

        rows = rows_from_task(get_task(task, **(task_options or {})), "train", train_size, seed).rows
        return [sft_pair(r, f"task {task} row {i}") for i, r in enumerate(rows)]
    if not data.is_file():
        raise DataError(f"data file not found: {data}")
    if data.suffix == ".parquet":
        from tandem.data.prompts import read_parquet_rows

        rows = read_parquet_rows(data)
        return [sft_pair(r, f"{data}:row {i + 1}") for i, r in enumerate(rows)]
    pairs = []
    for lineno, line in enumerate(data.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DataError(f"invalid JSON ({exc.msg})", where=f"{data}:{lineno}") from None
        if not isinstance(row, dict):
            raise DataError("line is not a JSON object", where=f"{data}:{lineno}")
        pairs.append(sft_pair(row, f"{data}:{lineno}"))
    if not pairs:
        raise DataError("dataset is empty", where=str(data))
    return pairs
