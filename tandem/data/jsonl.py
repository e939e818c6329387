"""Read JSON Lines files with errors that point at ``file:LINE``."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tandem.errors import DataError


def iter_json_objects(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield ``(line_number, object)`` for every non-blank line of a JSON Lines file (1-based lines).

    Raises DataError ``"file:LINE: ..."`` for text that is not UTF-8, invalid JSON, or a line whose value
    is not a JSON object.
    """
    with path.open("rb") as fh:
        for lineno, raw in enumerate(fh, start=1):
            where = f"{path}:{lineno}"
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as err:
                raise DataError(f"not UTF-8 text (byte {err.start} of the line)", where=where) from None
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as err:
                hint = "write one JSON object per line" if line.lstrip().startswith("[") else None
                raise DataError(
                    f"invalid JSON ({err.msg} at column {err.colno})", where=where, hint=hint
                ) from None
            if not isinstance(obj, dict):
                raise DataError(f"expected a JSON object, got {_json_type(obj)}", where=where)
            yield lineno, obj


def _json_type(value: Any) -> str:
    names = {list: "an array", str: "a string", bool: "a boolean", int: "a number", float: "a number"}
    return "null" if value is None else names.get(type(value), type(value).__name__)
