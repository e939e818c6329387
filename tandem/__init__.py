"""Tandem: align language models with RL and preference optimisation.

The top-level namespace is small and lazy (importing ``tandem`` loads no torch): ``load_config`` and
``run_training`` for scripts; everything else lives in its layer (``tandem.algos``, ``tandem.rollout``, ...).
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

__all__ = ["TandemError", "__version__", "load_config", "run_training"]

_LAZY = {
    "load_config": ("tandem.config", "load_config"),
    "run_training": ("tandem.orchestration.runner", "train"),
    "TandemError": ("tandem.errors", "TandemError"),
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module 'tandem' has no attribute '{name}'")
