"""Load a config: YAML file + dotted command-line overrides -> validated :class:`TandemConfig`.

Errors are one line naming the key and, where the key came from the file, ``file:line``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

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
            if nxt is None:
                nxt = node[part] = {}
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
    data: dict[str, Any], *, source: str = "<config>", lines: dict[str, int] | None = None
) -> TandemConfig:
    """Validate a nested dict; turn the first pydantic error into a one-line :class:`ConfigError`."""
    lines = lines or {}
    try:
        return TandemConfig.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = [str(p) for p in err["loc"] if not isinstance(p, int)]
        key = ".".join(loc)
        cause = err.get("ctx", {}).get("error")
        if isinstance(cause, CrossFieldError):
            key, msg = cause.key, str(cause)
        else:
            msg = err["msg"].removeprefix("Value error, ")
            if err["type"] == "extra_forbidden":
                msg = "unknown key"
        where = key_location(source, lines, key)
        raise ConfigError(f"{key}: {msg}" if key else msg, where=where) from None


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
    return build_config(data, source=str(path), lines=lines)


def config_to_yaml(cfg: TandemConfig) -> str:
    """The resolved config as YAML (presets expanded), for run folders and `tandem config show`."""
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)
