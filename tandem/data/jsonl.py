"""Read JSON Lines files with errors that point at ``file:LINE``."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tandem.errors import DataError

MAX_DEPTH = 64  # nesting levels a row may have; a conversational row needs 3
_SURROGATE = re.compile("[\ud800-\udfff]")


def iter_json_objects(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield ``(line_number, object)`` for every non-blank line of a JSON Lines file (1-based lines).

    Raises DataError ``"file:LINE: ..."`` for text that is not UTF-8, invalid JSON, a line whose value
    is not a JSON object, or one :func:`row_problem` refuses (too deep, a lone surrogate).
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
            except RecursionError:
                raise DataError(f"nested deeper than {MAX_DEPTH} levels", where=where) from None
            if not isinstance(obj, dict):
                raise DataError(f"expected a JSON object, got {_json_type(obj)}", where=where)
            problem = row_problem(obj)
            if problem:
                raise DataError(problem, where=where)
            yield lineno, obj


def row_problem(row: Any) -> str | None:
    """Why a decoded row cannot be processed at all, or None: nested deeper than :data:`MAX_DEPTH`
    levels (later JSON writes would overflow the stack), or a string holding a lone UTF-16 surrogate
    such as ``"\\ud800"`` (legal JSON, but not Unicode text: it cannot be written back as UTF-8)."""
    stack: list[tuple[Any, int, str]] = [(row, 0, "")]
    while stack:
        value, depth, column = stack.pop()
        if depth > MAX_DEPTH:
            return f"nested deeper than {MAX_DEPTH} levels"
        if isinstance(value, str) and _SURROGATE.search(value):
            return f"field '{column}' holds a lone surrogate (not valid Unicode text)"
        if isinstance(value, dict):
            for key, item in value.items():
                if isinstance(key, str) and _SURROGATE.search(key):
                    return "a key holds a lone surrogate (not valid Unicode text)"
                stack.append((item, depth + 1, column or str(key)))
        elif isinstance(value, list):
            stack.extend((item, depth + 1, column) for item in value)
    return None


def _json_type(value: Any) -> str:
    names = {list: "an array", str: "a string", bool: "a boolean", int: "a number", float: "a number"}
    return "null" if value is None else names.get(type(value), type(value).__name__)
