"""Plugins run user code by design (reward.functions, --augment, eval --reward): the field descriptions
(hence docs/configs.md) and the --help next to each option say so."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tandem.cli.main import app
from tandem.config.schema import RewardConfig, RewardFunctionConfig

DOCS = Path(__file__).resolve().parents[3] / "docs" / "configs.md"


def _flat(text: str) -> str:
    """Help text without rich's box drawing and line wrapping."""
    return re.sub(r"\s+", " ", re.sub(r"[│╭╮╰╯─]", " ", text))


def test_reward_functions_field_says_it_runs_user_code():
    for description in (
        RewardConfig.model_fields["functions"].description,
        RewardFunctionConfig.model_fields["path"].description,
    ):
        assert "runs that Python code" in description and "trust" in description
    row = next(x for x in DOCS.read_text().splitlines() if x.startswith("| `reward.functions`"))
    assert "runs that Python code with your permissions" in row


@pytest.mark.parametrize(
    ("command", "fragment"),
    [
        (["train", "--help"], "reward.functions in a config are imported and run as Python code"),
        (["data", "split", "--help"], "It imports and runs that Python code with your permissions"),
        (["eval", "--help"], "(imported and run: trusted code only)"),
    ],
)
def test_plugin_options_help_says_they_run_user_code(command, fragment):
    result = CliRunner().invoke(app, command, env={"COLUMNS": "200"})
    assert result.exit_code == 0 and fragment in _flat(result.output)
