"""Import a user's Python module by name (``package.module``) or file (``path/to/file.py``): reward
functions, environments and plug-ins (``run.plugins``). Every failure is one :class:`~tandem.errors.
ConfigError` line naming the spec, the config key and, for an import that raises, the ``file:line`` in the
user's code.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from types import CodeType, ModuleType

from tandem.errors import ConfigError


def is_file_spec(target: str) -> bool:
    """Whether ``target`` names a file (``x.py``, or a path) rather than an importable module."""
    return target.endswith(".py") or "/" in target or "\\" in target


def load_module(
    target: str, *, key: str | None = None, base_dir: str | Path | None = None, spec: str | None = None
) -> ModuleType:
    """The module ``target``: a file path (relative: to ``base_dir``, else the working directory; loaded
    once per path) or a module name (the working directory is searched too, as ``python`` does). ``key``
    and ``spec`` (the text the user wrote, default ``target``) are named in errors."""
    spec = spec or target
    if is_file_spec(target):
        return _load_file(target, spec, key, base_dir)
    return _import_module(target, spec, key)


def import_plugins(plugins: list[str] | tuple[str, ...], *, key: str = "run.plugins") -> None:
    """Import every ``run.plugins`` entry, in order, so what they register (estimators, losses, engines,
    trackers, curricula, ...) can be named by the config. A process that receives a config it did not load
    (a rollout worker, a learner rank) calls this first. Importing twice is a no-op."""
    for i, target in enumerate(plugins):
        load_module(target, key=f"{key}.{i}")


def _import_module(name: str, spec: str, key: str | None) -> ModuleType:
    if not all(part.isidentifier() for part in name.split(".")):
        raise ConfigError(f"{spec!r}: '{name}' is not a module name", where=key)
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
            f"{spec!r}: importing '{name}' raised {type(err).__name__}: {err}",
            where=_raised_at(err, _module_body) or key,
        ) from None


def _raised_at(err: BaseException, frame_ok: Callable[[CodeType], bool]) -> str | None:
    """``file:line`` of the deepest traceback frame whose code ``frame_ok`` accepts, or of a syntax error's
    own line: where in the user's module its import raised."""
    if isinstance(err, SyntaxError) and err.filename and err.lineno:
        return f"{err.filename}:{err.lineno}"
    tb, where = err.__traceback__, None
    while tb is not None:
        code = tb.tb_frame.f_code
        if frame_ok(code):
            where = f"{code.co_filename}:{tb.tb_lineno}"
        tb = tb.tb_next
    return where


def _module_body(code: CodeType) -> bool:
    """A module's top-level code (an import by module name: whichever file it was found in)."""
    return code.co_name == "<module>" and not code.co_filename.startswith("<")


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
        where = _raised_at(err, lambda code: Path(code.co_filename) == path) or key
        raise ConfigError(
            f"{spec!r}: importing '{path.name}' raised {type(err).__name__}: {err}", where=where
        ) from None
    return module
