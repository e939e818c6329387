"""Read Parquet files into rows; pyarrow is an optional dependency imported only here, on use."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tandem.errors import DataError, MissingDependencyError


def read_parquet_rows(path: Path) -> tuple[list[str], list[dict[str, Any]]]:
    """``(column names, rows as dicts)`` of a Parquet file.

    Raises MissingDependencyError naming the ``data`` extra when pyarrow is absent, DataError when the
    file is not readable Parquet.
    """
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise MissingDependencyError("pyarrow", "data") from None
    try:
        table = pq.read_table(path)
    except Exception as err:  # pyarrow raises ArrowInvalid, OSError, ... depending on the damage
        message = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise DataError(f"cannot read Parquet ({message})", where=str(path)) from None
    return list(table.column_names), table.to_pylist()
