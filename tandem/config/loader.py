"""Load a config: YAML file + dotted command-line overrides -> validated :class:`TandemConfig`.

Errors are one line naming the key and, where the key came from the file, ``file:line``.
"""

from __future__ import annotations

import difflib
import re
import typing
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from tandem.config.schema import CrossFieldError, TandemConfig
from tandem.config.yaml_guard import load_yaml
from tandem.errors import ConfigError

_EXPONENT_NUMBER = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)[eE][+-]?\d+$")


def parse_override(text: str) -> tuple[list[str], Any]:
    """``"trainer.lr=5e-6"`` -> (["trainer", "lr"], 5e-06). Values are parsed as YAML scalars/lists."""
    if "=" not in text:
        raise ConfigError(f"override '{text}' is not KEY=VALUE", hint="e.g. trainer.lr=5e-6")
    key, _, raw = text.partition("=")
    key = key.strip()
    if not key or any(not part for part in key.split(".")):
        raise ConfigError(f"override '{text}' has an empty key part")
    try:
        value = load_yaml(raw, f"override '{key}'")[0] if raw.strip() else None
    except yaml.YAMLError:
        value = raw
    if isinstance(value, str) and _EXPONENT_NUMBER.match(value):
        value = float(value)  # YAML 1.1 reads "5e-6" (no dot) as text; every user means the number.
    return key.split("."), value


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Set each dotted key in a nested dict (creating sections as needed). A numeric part indexes a list
    (``reward.functions.0.weight=2``, as in Hydra); an index past the list's end is an error, not a new
    item, so a typo cannot add a half-filled entry."""
    for text in overrides:
        path, value = parse_override(text)
        node: Any = data
        for i, part in enumerate(path):
            last = i == len(path) - 1
            if isinstance(node, list):
                index = _list_index(node, part, text, ".".join(path[:i]))
                if last:
                    node[index] = value
                else:
                    node = node[index]
                continue
            if last:
                node[part] = value
                continue
            nxt = node.get(part)
            if nxt is None:  # a missing section, or a missing list when the next part is an index
                nxt = node[part] = [] if path[i + 1].lstrip("-").isdigit() else {}
            if not isinstance(nxt, (dict, list)):
                raise ConfigError(f"override '{text}': '{part}' is not a section")
            node = nxt
    return data


def _list_index(items: list[Any], part: str, text: str, where: str) -> int:
    """``part`` as an index into the list at ``where`` (negative counts from the end, as in Python)."""
    try:
        index = int(part)
    except ValueError:
        raise ConfigError(
            f"override '{text}': '{where}' is a list; index it by number (e.g. {where}.0)"
        ) from None
    if not -len(items) <= index < len(items):
        raise ConfigError(f"override '{text}': '{where}' has {len(items)} items, no index {index}")
    return index


def read_yaml(path: str | Path) -> tuple[dict[str, Any], dict[str, int]]:
    """Read a YAML mapping; returns (data, key -> line). Alias bombs, recursive aliases, deep nesting
    and duplicate keys are refused (see :mod:`tandem.config.yaml_guard`)."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file not found: {p}")
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"not UTF-8 text (byte {exc.start})", where=str(p)) from None
    try:
        data, lines = load_yaml(text, str(p))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{p}:{mark.line + 1}" if mark else str(p)
        raise ConfigError(f"invalid YAML ({getattr(exc, 'problem', exc)})", where=where) from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError("top level must be a mapping of sections", where=str(p))
    return data, lines


def build_config(
    data: dict[str, Any],
    *,
    source: str = "<config>",
    lines: dict[str, int] | None = None,
    overrides: list[str] | None = None,
) -> TandemConfig:
    """Validate a nested dict; the first pydantic error becomes a one-line :class:`ConfigError`
    (:func:`config_error`)."""
    _import_plugins(data, source, lines or {}, overrides or [])
    try:
        return TandemConfig.model_validate(data)
    except ValidationError as exc:
        raise config_error(exc, TandemConfig, source=source, lines=lines, overrides=overrides) from None


def _import_plugins(data: dict[str, Any], source: str, lines: dict[str, int], overrides: list[str]) -> None:
    """``run.plugins``, imported before validation: what they register is then a name the config may use.
    A malformed value is left to the validation to report; a module that cannot be imported is one line
    at the override or ``file:line`` that named it (the module's own line when its import raised)."""
    run = data.get("run")
    plugins = run.get("plugins") if isinstance(run, dict) else None
    if not isinstance(plugins, list) or not all(isinstance(p, str) for p in plugins):
        return
    from tandem.utils.modules import import_plugins

    try:
        import_plugins(plugins)
    except ConfigError as exc:
        if not str(exc).startswith("run.plugins"):  # a line in the module itself: that is the place
            raise
        where = _override_of(overrides, "run.plugins", False) or key_location(source, lines, "run.plugins")
        raise ConfigError(str(exc), where=where) from None


def config_error(
    exc: ValidationError,
    root: type[BaseModel],
    *,
    source: str,
    lines: dict[str, int] | None = None,
    overrides: list[str] | None = None,
) -> ConfigError:
    """The first error of validating ``root`` as one line ``WHERE: key: message``: WHERE is the
    command-line override that set the key (from ``overrides``), else the key's ``file:line`` in
    ``source``; an unknown key says which key of its section it is close to."""
    err = exc.errors()[0]
    named = [p for p in err["loc"] if isinstance(p, int) or not _type_tag(str(p))]
    loc = [str(p) for p in named if not isinstance(p, int)]
    key = ".".join(loc)
    shown = ".".join(str(p) for p in named)  # with list indexes: reward.functions.0.weight
    cause = err.get("ctx", {}).get("error")
    if isinstance(cause, CrossFieldError):
        key, msg = cause.key, str(cause)
        shown = key
    else:
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = "unknown key" + _did_you_mean(root, loc)
    unknown = err["type"] == "extra_forbidden"  # an unknown section: the override under it set it
    where = _override_of(overrides or [], key, unknown) or key_location(source, lines or {}, key)
    return ConfigError(f"{shown}: {msg}" if shown else msg, where=where)


_TYPE_TAG = re.compile(r"[a-z][a-z0-9_-]*\[.*\]")  # list[str], literal['a'], function-after[...]


def _type_tag(part: str) -> bool:
    """A part pydantic adds to an error's location to say which member of a union failed (``list[str]``,
    ``str``), not a key of the config."""
    return bool(_TYPE_TAG.fullmatch(part)) or part in ("str", "int", "float", "bool", "none", "list", "dict")


def _did_you_mean(root: type[BaseModel], loc: list[str]) -> str:
    """`` (did you mean 'lr'?)`` when the unknown last part of ``loc`` is close to a key of its section."""
    model: type[BaseModel] | None = root
    for part in loc[:-1]:
        field = model.model_fields.get(part) if model is not None else None
        model = _section_type(field.annotation) if field is not None else None
    if model is None or not loc:
        return ""
    close = difflib.get_close_matches(loc[-1], list(model.model_fields), n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else ""


def _section_type(annotation: Any) -> type[BaseModel] | None:
    """The config section class inside ``annotation`` (``X``, ``X | None``, ``list[X]``), if any."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _section_type(arg)
        if found is not None:
            return found
    return None


def _override_of(overrides: list[str], key: str, unknown: bool) -> str | None:
    """``override 'TEXT'`` for the last command-line override that set ``key`` or a section above it, or,
    for an ``unknown`` key, a key below it (list indexes left out, as in the validation error's key)."""
    for text in reversed(overrides):
        path = [p for p in text.partition("=")[0].strip().split(".") if not p.lstrip("-").isdigit()]
        set_key = ".".join(path)
        if key == set_key or key.startswith(set_key + ".") or (unknown and set_key.startswith(key + ".")):
            return f"override '{text}'"
    return None


def key_location(source: str, lines: dict[str, int], key: str) -> str:
    """``file:line`` of the dotted ``key`` (or of its nearest section that has a line), else ``source``."""
    parts = key.split(".")
    while parts:
        line = lines.get(".".join(parts))
        if line:
            return f"{source}:{line}"
        parts.pop()
    return source


def load_config(path: str | Path, overrides: list[str] | None = None) -> TandemConfig:
    """Load ``path`` (YAML), apply dotted ``overrides`` and validate."""
    data, lines = read_yaml(path)
    apply_overrides(data, list(overrides or []))
    return build_config(data, source=str(path), lines=lines, overrides=list(overrides or []))


def config_changes(was: Any, now: Any) -> list[tuple[str, Any, Any]]:
    """``(dotted key, was, now)`` of every leaf that differs between two configs as JSON data (nested
    sections key by key, lists as leaves), sorted by key: what a resume compares."""
    old, new = _leaves(was), _leaves(now)
    return [(k, old.get(k), new.get(k)) for k in sorted(old.keys() | new.keys()) if old.get(k) != new.get(k)]


def _leaves(tree: Any, prefix: str = "") -> dict[str, Any]:
    """The leaves of a nested mapping by dotted key (lists are leaves)."""
    if not isinstance(tree, dict):
        return {prefix: tree} if prefix else {}
    flat: dict[str, Any] = {}
    for k, v in tree.items():
        flat.update(_leaves(v, f"{prefix}.{k}" if prefix else str(k)))
    return flat


def config_to_yaml(cfg: TandemConfig) -> str:
    """The resolved config as YAML (presets expanded), for run folders and `tandem config show`."""
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)
