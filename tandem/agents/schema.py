"""A small JSON-schema validator for tool arguments (the subset OpenAI function declarations use).

Supported keywords: ``type`` (a name or a list of names: object, array, string, integer, number, boolean,
null), ``properties``, ``required``, ``additionalProperties`` (``false`` or a schema), ``items``, ``enum``,
``const``, ``minimum``/``maximum``, ``minLength``/``maxLength``, ``minItems``/``maxItems``. Unknown
keywords (``description``, ``title``, ``default``...) are ignored, as a full validator would for
annotations. Booleans are not integers or numbers (JSON's view, not Python's).

Errors are one line naming the JSON path of the offending value (``arguments.x[2]``), so a model's bad
call becomes an observation it can read. No dependency: ``jsonschema`` is not a requirement of Tandem.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

_TYPES: dict[str, tuple[type, ...]] = {
    "object": (dict,),
    "array": (list, tuple),
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "null": (type(None),),
}
_KNOWN_TYPES = ", ".join(_TYPES)


def json_type(value: Any) -> str:
    """The JSON type name of a Python value (``bool`` is boolean, an integral float is a number)."""
    if isinstance(value, bool):
        return "boolean"
    for name in ("null", "integer", "number", "string", "array", "object"):
        if isinstance(value, _TYPES[name]):
            return name
    return type(value).__name__


def _is_type(value: Any, name: str) -> bool:
    if isinstance(value, bool):
        return name == "boolean"
    if name == "integer" and isinstance(value, float):
        return value.is_integer()
    return isinstance(value, _TYPES[name])


def check_schema(schema: Any, where: str = "parameters") -> str | None:
    """An error line when ``schema`` is not a usable argument schema (an object schema whose ``type``
    names are known and whose ``required`` names declared properties), else None."""
    if not isinstance(schema, Mapping):
        return f"{where}: must be a JSON-schema object, got {json_type(schema)}"
    if schema.get("type", "object") != "object":
        return f"{where}: a tool's parameters must have type 'object', got {schema.get('type')!r}"
    props = schema.get("properties", {})
    if not isinstance(props, Mapping):
        return f"{where}.properties: must be an object"
    required = schema.get("required", [])
    if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
        return f"{where}.required: must be a list of property names"
    missing = [r for r in required if r not in props]
    if missing:
        return f"{where}.required: names undeclared properties {', '.join(missing)}"
    return _check_types(schema, where)


def _check_types(schema: Mapping[str, Any], where: str) -> str | None:
    declared = schema.get("type")
    names = declared if isinstance(declared, list) else [declared] if declared is not None else []
    bad = [n for n in names if n not in _TYPES]
    if bad:
        return f"{where}.type: unknown type {bad[0]!r} (known: {_KNOWN_TYPES})"
    for key, sub in (schema.get("properties") or {}).items():
        if not isinstance(sub, Mapping):
            return f"{where}.properties.{key}: must be a schema object"
        err = _check_types(sub, f"{where}.properties.{key}")
        if err:
            return err
    items = schema.get("items")
    if isinstance(items, Mapping):
        return _check_types(items, f"{where}.items")
    return None


def validate(value: Any, schema: Mapping[str, Any], path: str = "arguments") -> str | None:
    """The first violation of ``schema`` by ``value`` as one line naming its path, or None if valid."""
    declared = schema.get("type")
    if declared is not None:
        names = declared if isinstance(declared, list) else [declared]
        if not any(_is_type(value, n) for n in names):
            want = " or ".join(names)
            return f"{path}: expected {want}, got {json_type(value)}"
    if "enum" in schema and value not in schema["enum"]:
        choices = ", ".join(repr(c) for c in schema["enum"])
        return f"{path}: {value!r} is not one of {choices}"
    if "const" in schema and value != schema["const"]:
        return f"{path}: must be {schema['const']!r}"
    err = _bounds(value, schema, path)
    if err:
        return err
    if isinstance(value, dict):
        return _validate_object(value, schema, path)
    if isinstance(value, list | tuple) and isinstance(schema.get("items"), Mapping):
        for i, item in enumerate(value):
            err = validate(item, schema["items"], f"{path}[{i}]")
            if err:
                return err
    return None


def _bounds(value: Any, schema: Mapping[str, Any], path: str) -> str | None:
    if isinstance(value, int | float) and not isinstance(value, bool):
        if "minimum" in schema and value < schema["minimum"]:
            return f"{path}: {value} is below the minimum {schema['minimum']}"
        if "maximum" in schema and value > schema["maximum"]:
            return f"{path}: {value} is above the maximum {schema['maximum']}"
    if isinstance(value, str):
        if "minLength" in schema and len(value) < schema["minLength"]:
            return f"{path}: shorter than {schema['minLength']} characters"
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            return f"{path}: longer than {schema['maxLength']} characters"
    if isinstance(value, list | tuple):
        if "minItems" in schema and len(value) < schema["minItems"]:
            return f"{path}: fewer than {schema['minItems']} items"
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            return f"{path}: more than {schema['maxItems']} items"
    return None


def _validate_object(value: dict[str, Any], schema: Mapping[str, Any], path: str) -> str | None:
    props: Mapping[str, Any] = schema.get("properties") or {}
    for name in schema.get("required", []):
        if name not in value:
            return f"{path}: missing required argument '{name}'"
    extra = schema.get("additionalProperties", True)
    for key, item in value.items():
        if key in props:
            err = validate(item, props[key], f"{path}.{key}")
        elif extra is False:
            known = ", ".join(props) or "none"
            err = f"{path}: unexpected argument '{key}' (arguments: {known})"
        elif isinstance(extra, Mapping):
            err = validate(item, extra, f"{path}.{key}")
        else:
            err = None
        if err:
            return err
    return None
