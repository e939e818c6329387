"""Hostile config files: alias bombs, recursive aliases, deep nesting, duplicate keys and non-finite
floats end in one ConfigError line naming the file (and line or key), quickly and in bounded memory."""

from __future__ import annotations

import time

import pytest
from typer.testing import CliRunner

from tandem.cli.main import app
from tandem.config import load_config
from tandem.config.rlhf import RMConfig, load_command_config
from tandem.errors import ConfigError

BASE = "model:\n  path: models/tiny\ndata:\n  task: arith\n"


def mapping_bomb(levels: int = 10) -> str:
    """The 10-line "billion laughs": each level maps 9 keys to the previous level (9^10 nodes)."""
    lines = ["l0: &l0 {" + ", ".join(f"k{i}: 1" for i in range(9)) + "}"]
    for n in range(1, levels):
        lines.append(f"l{n}: &l{n} {{" + ", ".join(f"k{i}: *l{n - 1}" for i in range(9)) + "}")
    return "\n".join(lines) + "\n"


def sequence_bomb(levels: int = 9) -> str:
    lines = ["    - &s0 [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]"]
    for n in range(1, levels):
        lines.append(f"    - &s{n} [" + ", ".join([f"*s{n - 1}"] * 10) + "]")
    return BASE + "  task_options:\n    bomb:\n" + "\n".join(lines) + "\n"


def _error(path, *overrides) -> str:
    started = time.perf_counter()
    with pytest.raises(ConfigError) as info:
        load_config(path, list(overrides))
    assert time.perf_counter() - started < 5, "the check must not expand the aliases"
    message = str(info.value)
    assert "\n" not in message
    return message


def test_yaml_alias_bomb_is_refused_by_config_show(tmp_path):
    path = tmp_path / "bomb.yaml"
    path.write_text(mapping_bomb())
    result = CliRunner().invoke(app, ["config", "show", str(path)])
    assert result.exit_code == 2
    assert f"error: {path}: YAML aliases expand to more than 100000 nodes" in result.output


def test_yaml_sequence_bomb_under_task_options_is_refused(tmp_path):
    path = tmp_path / "bomb.yaml"
    path.write_text(sequence_bomb())
    assert f"{path}: YAML aliases expand to more than 100000 nodes" in _error(path)


def test_yaml_alias_bomb_in_an_override_is_refused(tmp_path):
    path = tmp_path / "cfg.yaml"
    path.write_text(BASE)
    bomb = (
        "[&a [1,1,1,1,1,1,1,1,1,1]"
        + "".join(f", &{c} [{', '.join([f'*{p}'] * 10)}]" for p, c in zip("abcde", "bcdef", strict=True))
        + "]"
    )
    message = _error(path, f"data.task_options.x={bomb}")
    assert "override 'data.task_options.x': YAML aliases expand to more than" in message


def test_modest_aliases_still_load(tmp_path):
    path = tmp_path / "cfg.yaml"
    path.write_text(BASE + "  task_options: &opts {digits: 2}\nreward:\n  functions: []\n")
    assert load_config(path).data.task_options == {"digits": 2}


def test_yaml_recursive_alias_is_refused(tmp_path):
    path = tmp_path / "rec.yaml"
    path.write_text(BASE + "  task_options: &x {a: *x}\n")
    assert _error(path) == f"{path}:5: recursive YAML alias"


def test_yaml_nested_100k_deep_is_refused(tmp_path):
    path = tmp_path / "deep.yaml"
    path.write_text(BASE + "  task_options: {x: " + "[" * 100_000 + "]" * 100_000 + "}\n")
    assert _error(path) == f"{path}:5: YAML nested deeper than 64 levels"


def test_duplicate_top_level_key_is_an_error_naming_its_line(tmp_path):
    path = tmp_path / "dup.yaml"
    path.write_text(BASE + "trainer:\n  lr: 1.0e-5\ntrainer:\n  lr: 1.0\n")
    assert _error(path) == f"{path}:7: duplicate key 'trainer' (first set on line 5) (keep one of them)"


def test_duplicate_nested_key_is_an_error_naming_its_line(tmp_path):
    path = tmp_path / "dup.yaml"
    path.write_text(BASE + "  task: countdown\n")
    assert _error(path).startswith(f"{path}:5: duplicate key 'task' (first set on line 4)")


def test_merge_keys_may_be_overridden(tmp_path):
    path = tmp_path / "merge.yaml"
    path.write_text(BASE + "  task_options: &o {digits: 2}\nx_opts: &p {<<: *o, digits: 3}\n")
    with pytest.raises(ConfigError, match="x_opts: unknown key"):  # loads; only the schema objects
        load_config(path)


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("trainer.lr=.inf", "trainer.lr"),
        ("trainer.lr=.nan", "trainer.lr"),
        ("reward.format_weight=-.inf", "reward.format_weight"),
        ("trainer.betas=[0.9, .nan]", "trainer.betas.1"),
        ("algorithm.entropy_coef=.inf", "algorithm.entropy_coef"),
    ],
)
def test_non_finite_float_in_config_is_refused(tmp_path, override, key):
    path = tmp_path / "cfg.yaml"
    path.write_text(BASE)
    assert f"{key}: Input should be a finite number" in _error(path, override)


def test_non_finite_float_in_a_file_names_its_line(tmp_path):
    path = tmp_path / "cfg.yaml"
    path.write_text(BASE + "trainer:\n  lr: .inf\n")
    assert _error(path) == f"{path}:6: trainer.lr: Input should be a finite number"


def test_non_finite_float_in_a_preference_command_config_is_refused(tmp_path):
    path = tmp_path / "rm.yaml"
    path.write_text("model: m\nout_dir: o\ndata: {train_file: t.jsonl}\nlr: .inf\n")
    with pytest.raises(ConfigError, match="lr: Input should be a finite number"):
        load_command_config(RMConfig, path)
