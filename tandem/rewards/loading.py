"""Resolve user reward plugins from a string: ``package.module:function`` or ``path/to/file.py:function``.

Every failure (bad format, missing module or file, import error, missing attribute, not callable) is a
one-line :class:`~tandem.errors.ConfigError` naming the spec and, when given, the config key.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from tandem.errors import ConfigError

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
    if target.endswith(".py") or "/" in target or "\\" in target:
        module = _load_file(target, spec, key, base_dir)
    else:
        module = _import_module(target, spec, key)
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


def _import_module(name: str, spec: str, key: str | None) -> ModuleType:
    if not all(part.isidentifier() for part in name.split(".")):
        raise ConfigError(f"reward function spec {spec!r}: '{name}' is not a module name", where=key)
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as err:
        if err.name and (name == err.name or name.startswith(err.name + ".")):
            if _in_working_dir(name.partition(".")[0]):  # as `python` finds a module beside the script
                return _import_module(name, spec, key)
            raise ConfigError(
                f"{spec!r}: module '{name}' not found", where=key, hint="is it installed or on PYTHONPATH?"
            ) from None
        raise ConfigError(f"{spec!r}: importing '{name}' failed: {err}", where=key) from None
    except Exception as err:
        raise ConfigError(
            f"{spec!r}: importing '{name}' raised {type(err).__name__}: {err}", where=key
        ) from None


def _in_working_dir(top: str) -> bool:
    """Put the working directory on ``sys.path`` when it holds module or package ``top`` and is not on it
    yet (a console script's path starts at its own folder, not the working directory, unlike ``python
    -m`` or ``python script.py`` run there); whether it did."""
    cwd = Path.cwd()
    found = (cwd / f"{top}.py").is_file() or (cwd / top / "__init__.py").is_file()
    if not found or any(Path(p or ".").resolve() == cwd for p in sys.path):
        return False
    sys.path.insert(0, str(cwd))
    importlib.invalidate_caches()
    return True


def _load_file(target: str, spec: str, key: str | None, base_dir: str | Path | None) -> ModuleType:
    path = Path(target).expanduser()
    if not path.is_absolute():
        path = Path(base_dir or Path.cwd()) / path
    path = path.resolve()
    if not path.is_file():
        raise ConfigError(f"{spec!r}: file '{path}' not found", where=key)
    # One module per file path, cached in sys.modules so repeated loads share state and pickling works.
    digest = hashlib.blake2b(str(path).encode(), digest_size=6).hexdigest()
    mod_name = f"tandem_plugin_{path.stem if path.stem.isidentifier() else 'file'}_{digest}"
    if mod_name in sys.modules:
        return sys.modules[mod_name]
    module_spec = importlib.util.spec_from_file_location(mod_name, path)
    if module_spec is None or module_spec.loader is None:
        raise ConfigError(f"{spec!r}: cannot load '{path}' as Python", where=key)
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[mod_name] = module
    try:
        module_spec.loader.exec_module(module)
    except Exception as err:
        del sys.modules[mod_name]
        where = _error_line(err, path) or key
        raise ConfigError(
            f"{spec!r}: importing '{path.name}' raised {type(err).__name__}: {err}", where=where
        ) from None
    return module


def _error_line(err: BaseException, path: Path) -> str | None:
    """``file:line`` of the deepest traceback frame inside ``path`` (or of a syntax error there)."""
    if isinstance(err, SyntaxError) and err.lineno:
        return f"{path}:{err.lineno}"
    tb, line = err.__traceback__, None
    while tb is not None:
        if Path(tb.tb_frame.f_code.co_filename) == path:
            line = tb.tb_lineno
        tb = tb.tb_next
    return f"{path}:{line}" if line else None


def _public_callables(module: ModuleType) -> str:
    names = sorted(
        n
        for n, v in vars(module).items()
        if callable(v) and not n.startswith("_") and getattr(v, "__module__", None) == module.__name__
    )
    shown = ", ".join(names[:10]) + (", ..." if len(names) > 10 else "")
    return f"callables there: {shown}" if names else "it defines no public callables"
