"""Prompt datasets for RL: rows with a ``prompt`` plus any extra columns (handed to reward functions).

A prompt is either a string or TRL's conversational format, a list of ``{"role", "content"}`` messages,
kept as is (the model layer applies the chat template). Files (JSON Lines, Parquet) and built-in tasks
both become a :class:`PromptDataset`, and every row remembers where it came from (``file:LINE``) so later
stages can name it in errors.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from tandem.data.jsonl import iter_json_objects
from tandem.data.parquet import read_parquet_rows
from tandem.errors import DataError

JSONL_SUFFIXES = (".jsonl", ".json")
PARQUET_SUFFIXES = (".parquet",)


class RowSource(Protocol):
    """What :func:`rows_from_task` needs from a task (``tandem.rewards.tasks.Task`` satisfies it); declared
    here because ``tandem.data`` and ``tandem.rewards`` are independent layers that do not import each other."""

    name: str

    def make_rows(self, split: str, n: int, seed: int) -> list[dict[str, Any]]: ...


@dataclass(frozen=True)
class PromptDataset:
    """Validated prompt rows. ``locations[i]`` says where row ``i`` came from (e.g. ``data.jsonl:7``)."""

    rows: list[dict[str, Any]]
    source: str
    locations: list[str]

    @classmethod
    def from_rows(
        cls, rows: Sequence[dict[str, Any]], source: str, locations: Sequence[str] | None = None
    ) -> PromptDataset:
        """Validate ``rows`` (each needs a valid ``prompt``); DataError names the row's location."""
        locs = (
            list(locations) if locations is not None else [f"{source}:row {i + 1}" for i in range(len(rows))]
        )
        if len(locs) != len(rows):
            raise ValueError(f"{len(locs)} locations for {len(rows)} rows")
        if not rows:
            raise DataError("no rows (the dataset is empty)", where=source)
        for row, where in zip(rows, locs, strict=True):
            if not isinstance(row, dict):
                raise DataError(f"expected a row object, got {type(row).__name__}", where=where)
            if "prompt" not in row:
                found = ", ".join(sorted(map(str, row))) or "none"
                raise DataError(f"missing 'prompt' column (columns here: {found})", where=where)
            validate_prompt(row["prompt"], where)
        return cls(rows=list(rows), source=source, locations=locs)

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> dict[str, Any]:
        return self.rows[index]

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(self.rows)

    @property
    def columns(self) -> list[str]:
        """Column names in first-seen order (``prompt`` first); a row may lack an extra column."""
        seen: dict[str, None] = {"prompt": None}
        for row in self.rows:
            seen.update(dict.fromkeys(row))
        return list(seen)

    @property
    def extra_columns(self) -> list[str]:
        """:attr:`columns` without ``prompt``: what reward functions receive as keyword lists."""
        return self.columns[1:]

    @property
    def prompts(self) -> list[str | list[dict[str, str]]]:
        """The ``prompt`` of every row."""
        return [row["prompt"] for row in self.rows]

    def column(self, name: str) -> list[Any]:
        """Values of column ``name`` for every row (None where a row lacks it)."""
        return [row.get(name) for row in self.rows]


def validate_prompt(prompt: Any, where: str) -> None:
    """Raise DataError at ``where`` unless ``prompt`` is a non-blank string or a non-empty list of
    ``{"role": str, "content": str}`` messages."""
    if isinstance(prompt, str):
        if not prompt.strip():
            raise DataError("empty 'prompt'", where=where)
        return
    if not isinstance(prompt, list):
        raise DataError(
            f"'prompt' must be a string or a list of {{role, content}} messages, got {_type_name(prompt)}",
            where=where,
        )
    if not prompt:
        raise DataError("empty 'prompt' (no messages)", where=where)
    for i, message in enumerate(prompt):
        if not isinstance(message, dict) or not {"role", "content"} <= message.keys():
            raise DataError(f"'prompt'[{i}] must be an object with 'role' and 'content'", where=where)
        for key in ("role", "content"):
            if not isinstance(message[key], str):
                kind = _type_name(message[key])
                raise DataError(f"'prompt'[{i}].{key} must be a string, got {kind}", where=where)
        if not message["role"]:
            raise DataError(f"'prompt'[{i}].role is empty", where=where)


def _type_name(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def load_prompt_dataset(path: str | Path) -> PromptDataset:
    """Load a ``.jsonl``/``.json`` (one object per line; blank lines skipped) or ``.parquet`` file.

    DataError for a missing file, unknown extension, malformed line or row (``file:LINE: ...``) or an
    empty dataset; MissingDependencyError when Parquet is requested without pyarrow.
    """
    path = Path(path)
    if not path.exists():
        raise DataError("file not found", where=str(path))
    if not path.is_file():
        raise DataError("not a file", where=str(path))
    suffix = path.suffix.lower()
    if suffix in JSONL_SUFFIXES:
        rows, locations = [], []
        for lineno, obj in iter_json_objects(path):
            rows.append(obj)
            locations.append(f"{path}:{lineno}")
        if not rows:
            raise DataError("no rows (the file is empty or has only blank lines)", where=str(path))
        return PromptDataset.from_rows(rows, source=str(path), locations=locations)
    if suffix in PARQUET_SUFFIXES:
        columns, rows = read_parquet_rows(path)
        if "prompt" not in columns:
            raise DataError(f"no 'prompt' column (columns: {', '.join(columns) or 'none'})", where=str(path))
        if not rows:
            raise DataError("no rows (the file is empty)", where=str(path))
        return PromptDataset.from_rows(
            rows, source=str(path), locations=[f"{path}:row {i + 1}" for i in range(len(rows))]
        )
    supported = ", ".join(JSONL_SUFFIXES + PARQUET_SUFFIXES)
    raise DataError(f"unsupported file type '{path.suffix}'", where=str(path), hint=f"use one of {supported}")


def rows_from_task(task: RowSource, split: str, n: int, seed: int) -> PromptDataset:
    """``n`` rows of a built-in task's ``split`` as a PromptDataset (locations ``task:NAME/SPLIT:row I``)."""
    source = f"task:{task.name}/{split}"
    return PromptDataset.from_rows(task.make_rows(split, n, seed), source=source)


def check_prompt_lengths(dataset: PromptDataset, lengths: Sequence[int], limit: int, key: str) -> None:
    """Raise DataError at the first row whose prompt is longer than ``limit`` tokens.

    ``lengths[i]`` is row ``i``'s prompt length after tokenisation (the model layer computes it);
    ``key`` is the config key that sets the limit, named in the hint.
    """
    if len(lengths) != len(dataset):
        raise ValueError(f"{len(lengths)} lengths for {len(dataset)} rows")
    for where, length in zip(dataset.locations, lengths, strict=True):
        if length > limit:
            raise DataError(
                f"prompt is {length} tokens, longer than the limit of {limit}",
                where=where,
                hint=f"shorten it or raise {key}",
            )
