"""The ``tandem`` command for tests that run it as a subprocess (imported by test modules; ``tests/`` is
on ``sys.path`` through its ``conftest.py``): the installed console script beside the interpreter, or
``python -m tandem.cli.main`` where the package is only on ``PYTHONPATH`` (the same entry point)."""

from __future__ import annotations

import sys
from pathlib import Path

_SCRIPT = Path(sys.executable).parent / "tandem"
TANDEM: list[str] = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-m", "tandem.cli.main"]
