"""Load SFT pairs for the CLI from a file or a built-in task."""

from __future__ import annotations

from pathlib import Path

from tandem.data.chat import ChatRow
from tandem.data.jsonl import iter_json_objects
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
        if train_size < 1:
            raise ConfigError(f"must be an integer >= 1, got {train_size}", where="--train-size")
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
    # The same reader as tandem train and tandem data: not UTF-8, bad JSON or a non-object is file:line.
    pairs = [sft_pair(row, f"{data}:{lineno}") for lineno, row in iter_json_objects(data)]
    if not pairs:
        raise DataError("dataset is empty", where=str(data))
    return pairs
