"""Load a script of ``bench/`` as a module by path (``bench/`` is not a package), once per session."""

from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "bench"


def load(name: str) -> types.ModuleType:
    """``bench/<name>.py``, registered in ``sys.modules`` under ``name`` (its dataclasses look their module
    up there, and a bench script loads its siblings by that name too)."""
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
        assert spec is not None and spec.loader is not None
        sys.modules[name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules[name])
    return sys.modules[name]
