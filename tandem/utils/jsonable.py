"""Convert values into something ``json.dumps(..., allow_nan=False)`` accepts.

Metrics and checkpoint state mix Python numbers with numpy and torch scalars, and a diverging run
produces NaN or infinity. Standard JSON has no NaN, so non-finite floats become ``null``: every JSON
reader (jq, pandas, JavaScript) parses the file, and pandas reads ``null`` back as NaN.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import PurePath
from typing import Any


def to_jsonable(value: Any) -> Any:
    """Return ``value`` with every nested element made JSON-safe.

    - ``float`` NaN/±inf → ``None``; finite floats unchanged.
    - numpy and torch scalars (anything with ``.item()`` and one element) → Python scalars.
    - numpy arrays / torch tensors with more than one element → nested lists.
    - mappings → ``dict`` with ``str`` keys; lists, tuples and sets → lists; paths → ``str``.
    - anything else unknown → ``str(value)`` (never raises).
    """
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [to_jsonable(v) for v in value]
    if isinstance(value, PurePath):
        return str(value)
    if hasattr(value, "tolist") and callable(value.tolist):  # numpy arrays/scalars, torch tensors
        return to_jsonable(value.tolist())
    if hasattr(value, "item") and callable(value.item):
        try:
            return to_jsonable(value.item())
        except (TypeError, ValueError, RuntimeError):
            pass
    return str(value)
