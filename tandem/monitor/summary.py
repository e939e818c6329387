"""Rich tables for the CLI: samples, metric summaries, benchmark results."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rich.table import Table
from rich.text import Text

_MISSING = "—"


def format_cell(value: Any, *, max_chars: int = 200) -> Text:
    """One cell as plain text (never parsed as rich markup, since completions can contain ``[...]``).

    Floats get 4 significant digits, ``None`` and missing values a dash, newlines show as ``⏎`` and
    text longer than ``max_chars`` is cut with an ellipsis.
    """
    if value is None:
        text = _MISSING
    elif isinstance(value, float):
        text = f"{value:.4g}"
    else:
        text = str(value).replace("\n", "⏎")
    if len(text) > max_chars:
        text = text[: max_chars - 1] + "…"
    return Text(text)


def format_table(
    rows: Sequence[Mapping[str, Any]],
    columns: Sequence[str],
    *,
    title: str | None = None,
    max_chars: int = 200,
) -> Table:
    """A rich :class:`~rich.table.Table` with one row per mapping and the given ``columns`` in order.

    Missing keys show as a dash; numbers are right-aligned (judged from the first non-missing value).
    """
    table = Table(title=title, show_lines=False)
    for column in columns:
        first = next((row[column] for row in rows if row.get(column) is not None), None)
        numeric = isinstance(first, (int, float)) and not isinstance(first, bool)
        table.add_column(column, justify="right" if numeric else "left", overflow="fold")
    for row in rows:
        table.add_row(*(format_cell(row.get(column), max_chars=max_chars) for column in columns))
    return table
