"""One config source: pydantic sections, YAML files, dotted overrides."""

from tandem.config.loader import (
    apply_overrides,
    build_config,
    config_changes,
    config_to_yaml,
    load_config,
    parse_override,
)
from tandem.config.presets import ALGORITHM_PRESETS
from tandem.config.schema import TandemConfig

__all__ = [
    "ALGORITHM_PRESETS",
    "TandemConfig",
    "apply_overrides",
    "build_config",
    "config_changes",
    "config_to_yaml",
    "load_config",
    "parse_override",
]
