"""``--engine NAME`` and ``--engine-option KEY=VALUE``: the rollout engine of every command that generates
(``tandem eval``, ``abtest``, ``label``, ``serve``), built by name through
:func:`tandem.rollout.registry.build_engine`.

The option help lists the engine table's names without importing it (that would load torch for
``tandem --help``); ``tests/unit/cli/test_engine_option.py`` keeps :data:`ENGINE_NAMES` equal to the
table. The name is checked when the command runs, before any model loads: an unknown one is one line
listing the valid ones, an engine whose package is missing one line naming the package.
"""

from __future__ import annotations

from typing import Annotated, Any

import typer

from tandem.cli.app import parse_options
from tandem.errors import ConfigError

ENGINE_NAMES = ("hf", "vllm")  # the keys of tandem.rollout.registry.ENGINES, for help texts
DEFAULT_ENGINE_NAME = "hf"  # tandem.rollout.registry.DEFAULT_ENGINE
_NAMES = ", ".join(ENGINE_NAMES)

EngineName = Annotated[
    str | None,
    typer.Option(
        "--engine",
        help=f"Rollout engine ({_NAMES}). Default: the run's rollout.backend (label: the config's "
        "engine), else hf.",
        show_default=False,
    ),
]
ServeEngineName = Annotated[
    str, typer.Option("--engine", help=f"Rollout engine of every replica ({_NAMES}; hf runs in process).")
]
EngineOptions = Annotated[
    list[str] | None,
    typer.Option(
        "--engine-option",
        help="Engine setting KEY=VALUE (repeatable; values parsed as JSON), e.g. fast_decode=false.",
    ),
]


def check_engine(name: str, where: str = "--engine") -> str:
    """``name`` if the engine table has it and its module imports; else a one-line ConfigError (unknown
    name: the valid ones; missing package: the package to install)."""
    from tandem.rollout.registry import ENGINES, engine_class

    if name not in ENGINES:
        raise ConfigError(
            f"unknown rollout engine '{name}'; valid: {', '.join(sorted(ENGINES))}", where=where
        )
    engine_class(name)
    return name


def engine_options(items: list[str] | None) -> dict[str, Any]:
    """``--engine-option`` values as ``EngineSpec.options`` (validated later by the engine itself)."""
    return parse_options(items, "--engine-option") if items else {}
