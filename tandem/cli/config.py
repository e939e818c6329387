"""``tandem config show`` and ``tandem config docs``: the resolved config and the generated reference."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from tandem.cli.app import Overrides, config_app, out, user_errors


@config_app.command("show")
@user_errors
def config_show(
    config: Annotated[Path, typer.Argument(help="YAML config.")],
    overrides: Overrides = None,
) -> None:
    """Print the resolved config (presets expanded, overrides applied)."""
    from tandem.config import config_to_yaml, load_config

    out.print(config_to_yaml(load_config(config, overrides or [])), highlight=False, markup=False, end="")


@config_app.command("docs")
@user_errors
def config_docs() -> None:
    """Print the config reference (Markdown) generated from the schema: docs/configs.md."""
    from tandem.channels import option_models
    from tandem.config.docs import config_reference, option_tables

    channels = option_tables("architecture.channel.options", option_models())  # backends sit above config
    out.print(config_reference({"architecture": channels}), highlight=False, markup=False, soft_wrap=True)
