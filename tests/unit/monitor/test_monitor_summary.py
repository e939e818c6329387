"""format_table renders rows as a rich table without interpreting markup in cell text."""

from __future__ import annotations

import io

from rich.console import Console

from tandem.monitor.summary import format_cell, format_table


def _render(table: object) -> str:
    out = io.StringIO()
    Console(file=out, width=200, color_system=None).print(table)
    return out.getvalue()


def test_table_has_columns_in_order_and_literal_cell_text() -> None:
    rows = [
        {"prompt": "2+2=", "completion": "[bold]4[/bold]", "reward": 1.0},
        {"prompt": "3+3=", "completion": "6\nextra", "reward": None},
    ]
    table = format_table(rows, ["prompt", "completion", "reward"], title="samples")
    assert [column.header for column in table.columns] == ["prompt", "completion", "reward"]
    assert table.columns[2].justify == "right" and table.columns[0].justify == "left"
    text = _render(table)
    assert "[bold]4[/bold]" in text  # markup shown literally, not applied
    assert "6⏎extra" in text and "—" in text and "samples" in text


def test_format_cell_rounds_and_truncates() -> None:
    assert format_cell(0.123456).plain == "0.1235"
    assert format_cell("x" * 50, max_chars=10).plain == "x" * 9 + "…"
    assert format_cell(None).plain == "—"
