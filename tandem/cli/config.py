"""``tandem config show`` and ``tandem config docs``: the resolved config and the generated reference."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from tandem.cli.app import Overrides, config_app, out, user_errors

COMMANDS = ("train", "rm", "dpo", "label")  # whose config `config show` resolves
_COMMAND_KEYS = {
    "out_dir",
    "input_file",
    "out_file",
    "policy",
}  # top-level keys only rm/dpo/label configs have


@config_app.command("show")
@user_errors
def config_show(
    config: Annotated[Path, typer.Argument(help="YAML config.")],
    overrides: Overrides = None,
    command: Annotated[
        str, typer.Option(help="The command the config is for: train (default), rm, dpo or label.")
    ] = "train",
) -> None:
    """Print the resolved config (presets expanded, defaults filled, overrides applied).

    Example: tandem config show configs/dpo.yaml beta=0.2 --command dpo
    """
    import yaml

    from tandem.config import config_to_yaml, load_config
    from tandem.config.loader import read_yaml
    from tandem.config.rlhf import DPOConfig, LabelConfig, RMConfig, load_command_config
    from tandem.errors import ConfigError

    if command not in COMMANDS:
        raise ConfigError(f"unknown command '{command}'; valid: {', '.join(COMMANDS)}", where="--command")
    if command != "train":
        cls = {"rm": RMConfig, "dpo": DPOConfig, "label": LabelConfig}[command]
        resolved = load_command_config(cls, config, overrides).model_dump(mode="json")
        out.print(yaml.safe_dump(resolved, sort_keys=False), highlight=False, markup=False, end="")
        return
    try:
        text = config_to_yaml(load_config(config, overrides or []))
    except ConfigError:
        keys = sorted(_COMMAND_KEYS & set(read_yaml(config)[0]))
        if not keys:
            raise
        raise ConfigError(
            f"a tandem rm, dpo or label config (top-level {', '.join(keys)}), not a train config",
            where=str(config),
            hint=f"tandem config show {config} --command rm|dpo|label",
        ) from None
    out.print(text, highlight=False, markup=False, end="")


@config_app.command("docs")
@user_errors
def config_docs() -> None:
    """Print the config reference (Markdown) generated from the schema: docs/configs.md."""
    from tandem.channels import option_models
    from tandem.config.docs import config_reference, option_tables

    channels = option_tables("architecture.channel.options", option_models())  # backends sit above config
    out.print(config_reference({"architecture": channels}), highlight=False, markup=False, soft_wrap=True)
