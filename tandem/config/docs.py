"""Render the config reference (``docs/configs.md``) from the schema's field descriptions."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Literal, get_args, get_origin

from pydantic import BaseModel

from tandem.config.algorithm import loss_options_model
from tandem.config.schema import TandemConfig

_MODULE_PREFIX = re.compile(r"\btandem\.config\.\w+\.")


def _type_name(annotation: object) -> str:
    if get_origin(annotation) is Literal:
        text = " / ".join(repr(a) for a in get_args(annotation))
    else:
        text = getattr(annotation, "__name__", None) if get_origin(annotation) is None else None
        text = text or str(annotation)
    text = _MODULE_PREFIX.sub("", text)  # `WarmStartConfig`, wherever the section module lives
    # Escape the pipe of unions: Markdown tables split cells on it even inside code spans.
    return text.replace("typing.", "").replace("NoneType", "None").replace("|", "\\|")


def _registry_names(registry: str, annotation: object) -> str:
    """A field that names an entry of a ``tandem.algos`` registry: its valid names, like a Literal."""
    import tandem.algos

    names = [repr(n) for n in getattr(tandem.algos, registry).names()]
    if type(None) in get_args(annotation):
        names.append("None")
    return " / ".join(names)


def _section_model(annotation: object) -> type[BaseModel]:
    """The section's model, also for an optional section (``Model | None``)."""
    for candidate in (annotation, *get_args(annotation)):
        if isinstance(candidate, type) and issubclass(candidate, BaseModel):
            return candidate
    raise TypeError(f"not a config section: {annotation!r}")


def _rows(model: type[BaseModel], prefix: str) -> list[str]:
    rows = []
    for name, field in model.model_fields.items():
        key = f"{prefix}{name}"
        ann = field.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            rows.extend(_rows(ann, key + "."))
            continue
        default = "required" if field.is_required() else repr(field.get_default(call_default_factory=True))
        extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
        kind = _registry_names(str(extra["registry"]), ann) if "registry" in extra else _type_name(ann)
        rows.append(f"| `{key}` | `{kind}` | `{default}` | {field.description or ''} |")
    return rows


def option_tables(key: str, models: Sequence[tuple[str, type[BaseModel] | None]]) -> list[str]:
    """A sub-section documenting a key whose options depend on a registered name (a policy loss's
    ``algorithm.loss_options``, a channel backend's options): one table row per option of each name."""
    out = [f"### `{key}`", "", "| name | key | type | default | description |", "|---|---|---|---|---|"]
    for name, model in models:
        rows = _rows(model, "") if model is not None else ["| — | — | — | takes no options |"]
        out += [f"| `{name}` {row}" for row in rows]
    return [*out, ""]


def _loss_option_models() -> list[tuple[str, type[BaseModel] | None]]:
    from tandem.algos import POLICY_LOSSES

    return [(name, loss_options_model(name)) for name in POLICY_LOSSES]


def config_reference(extra: Mapping[str, list[str]] | None = None) -> str:
    """Markdown tables, one per section, generated from :class:`TandemConfig`; the options of each policy
    loss follow ``algorithm``, and ``extra`` adds lines after the section of that name (the CLI passes the
    channel backends' options, which live above this layer)."""
    extra = {"algorithm": option_tables("algorithm.loss_options", _loss_option_models()), **(extra or {})}
    out = [
        "# Config reference",
        "",
        "Generated from the pydantic schema by `tandem config docs` — do not edit by hand.",
        "Every key can be set in YAML or overridden on the command line as `section.key=value`; a number",
        "indexes a list (`reward.functions.0.weight=0.5`; -1 is the last item, as in Python; an index past the end is an error).",
        "Floats must be finite (`.inf`/`.nan` are errors); a key given twice in one mapping, a recursive",
        "alias, aliases that expand to more than 100,000 nodes, or nesting deeper than 64 levels is an error",
        "naming the file (and line).",
        "",
    ]
    for name, field in TandemConfig.model_fields.items():
        section = _section_model(field.annotation)
        about = field.description or ""
        if not field.is_required() and field.get_default(call_default_factory=True) is None:
            about += " Optional section: absent unless set."
        out += [f"## `{name}`", "", about, "", "| key | type | default | description |"]
        out += ["|---|---|---|---|", *_rows(section, f"{name}."), ""]
        out += extra.get(name, [])
    return "\n".join(out)
