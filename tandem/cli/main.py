"""``tandem`` — command-line entry point. Commands print; library code only logs.

Expected bad input (config, data, model, reward) ends in one red line on stderr and exit code 2.

The app and its groups live in ``tandem.cli.app``; each command module attaches its commands when it is
imported. This module imports them all, in the order ``tandem --help`` lists them, and is the only module
that does: command modules never import it, so the CLI has no import cycle.
"""

from __future__ import annotations

from tandem.cli.app import app

# The import order is the order of the commands in --help, so it is not sorted.
# isort: off
from tandem.cli import train as _train  # noqa: F401  (registers train, init-model, sft, demo)
from tandem.cli import tune as _tune  # noqa: F401  (registers tune)
from tandem.cli import config as _config  # noqa: F401  (registers config show|docs)
from tandem.cli import data as _data  # noqa: F401  (registers data validate|stats|dedup|split|...)
from tandem.cli import evaluate as _evaluate  # noqa: F401  (registers eval, abtest, report)
from tandem.cli import export as _export  # noqa: F401  (registers export)
from tandem.cli import rlhf as _rlhf  # noqa: F401  (registers rm, dpo, label)
from tandem.cli import distill as _distill  # noqa: F401  (registers distill)
from tandem.cli import serve as _serve  # noqa: F401  (registers serve, loadtest, data export-feedback)
from tandem.cli import plan as _plan  # noqa: F401  (registers plan)
# isort: on

__all__ = ["app", "main"]


def main() -> None:  # pragma: no cover - console entry point; `python -m tandem` works too
    app()


if __name__ == "__main__":  # pragma: no cover - `python -m tandem.cli.main`, same as `python -m tandem`
    app()
