"""Resolve user reward plugins from a string: ``package.module:function`` or ``path/to/file.py:function``.

Every failure (bad format, missing module or file, import error, missing attribute, not callable) is a
one-line :class:`~tandem.errors.ConfigError` naming the spec and, when given, the config key.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from tandem.errors import ConfigError
from tandem.utils.modules import load_module

_FORMAT_HINT = "write 'package.module:function' or 'path/to/file.py:function'"


def load_callable(
    spec: str, *, key: str | None = None, base_dir: str | Path | None = None
) -> Callable[..., Any]:
    """The callable named by ``spec``.

    ``key`` (e.g. ``"reward.functions.0.path"``, as an override names it) is named in errors. A relative file
    path is resolved against ``base_dir`` (e.g. the config file's folder), else the working directory. The
    attribute may be dotted (``module:Class.method``).
    """
    if not isinstance(spec, str) or spec.count(":") < 1:
        raise ConfigError(f"reward function spec {spec!r} has no ':'", where=key, hint=_FORMAT_HINT)
    target, _, attr = spec.rpartition(":")
    if not target or not attr or not all(part.isidentifier() for part in attr.split(".")):
        raise ConfigError(f"reward function spec {spec!r} is malformed", where=key, hint=_FORMAT_HINT)
    module = load_module(target, key=key, base_dir=base_dir, spec=spec)
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ConfigError(
                f"{spec!r}: '{target}' has no attribute '{attr}'", where=key, hint=_public_callables(module)
            )
        obj = getattr(obj, part)
    if not callable(obj):
        raise ConfigError(f"{spec!r} is not callable (it is {type(obj).__name__})", where=key)
    return obj


def callable_origin(fn: Callable[..., Any]) -> str:
    """``module:qualname`` of a function, bound method or callable object, for error messages."""
    module = getattr(fn, "__module__", None) or type(fn).__module__
    name = getattr(fn, "__qualname__", None) or type(fn).__qualname__
    return f"{module}:{name}"


def _public_callables(module: ModuleType) -> str:
    names = sorted(
        n
        for n, v in vars(module).items()
        if callable(v) and not n.startswith("_") and getattr(v, "__module__", None) == module.__name__
    )
    shown = ", ".join(names[:10]) + (", ..." if len(names) > 10 else "")
    return f"callables there: {shown}" if names else "it defines no public callables"
