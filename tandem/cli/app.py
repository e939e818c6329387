"""The root of the ``tandem`` command tree: the Typer app, its command groups and the helpers every command
module shares (consoles, the one-line error wrapper, option parsing).

Command modules (``tandem.cli.train``, ``tandem.cli.data``, ...) import only this module (and
``tandem.cli.progress``/``report``) and attach their commands to ``app`` or a group here when they are
imported; ``tandem.cli.main`` imports every command module, in the order ``--help`` lists them. Nothing
here imports a command module, so the tree has no cycles. Use ``tandem.cli.main.app`` to run the CLI: this
module's ``app`` alone has no commands yet.
"""

from __future__ import annotations

import functools
import json
import logging
import os
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape

from tandem.errors import ConfigError, TandemError

app = typer.Typer(
    name="tandem",
    help="Align language models with RL and preference optimisation.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
config_app = typer.Typer(help="Inspect configs.", no_args_is_help=True)
app.add_typer(config_app, name="config")
data_app = typer.Typer(
    help="Preference data: validate, split, stats, dedup, aggregate, make-safety.", no_args_is_help=True
)
app.add_typer(data_app, name="data")

out = Console()
err = Console(stderr=True)

Overrides = Annotated[list[str] | None, typer.Argument(help="Dotted overrides, e.g. trainer.lr=5e-6.")]


def user_errors(fn):
    """Turn a TandemError into one line on stderr and a non-zero exit, without a traceback."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        # inherited by the processes a command spawns (decoupled rollout workers, data-parallel ranks),
        # whose transformers would otherwise draw its own "Loading weights" bars through ours
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
        _quiet_transformers()
        logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
        try:
            return fn(*args, **kwargs)
        except TandemError as exc:
            # Escaped: the message quotes user text (overrides, paths) that may look like rich markup.
            err.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False, soft_wrap=True)
            raise typer.Exit(exc.exit_code) from None
        except KeyboardInterrupt:
            err.print("[yellow]interrupted[/]")
            raise typer.Exit(130) from None

    return wrapper


def _quiet_transformers() -> None:
    """Transformers' own bars ("Loading weights", "Writing model shards") would break up ours."""
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        hf_logging.set_verbosity_error()
    except ImportError:  # pragma: no cover - transformers is a core dependency
        pass


def check_json_out(path: Path | None, flag: str = "--json") -> None:
    """A ``--json`` report path that can be written once the work is done: not a folder, not inside a
    file. Checked first, so a long evaluation or export never ends in a traceback over its report."""
    if path is not None:
        from tandem.data.outputs import check_output_file

        check_output_file(path, where=flag)


def parse_options(items: list[str] | None, flag: str) -> dict[str, Any]:
    """``["digits=2", "ops=+-"]`` -> ``{"digits": 2, "ops": "+-"}`` (values parsed as JSON when they can be)."""
    opts: dict[str, Any] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"expected KEY=VALUE, got {item!r}", where=flag)
        try:
            opts[key] = json.loads(value)
        except json.JSONDecodeError:
            opts[key] = value
    return opts
