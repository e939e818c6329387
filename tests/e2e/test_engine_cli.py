"""``--engine`` / ``--engine-option`` through the CLI: every command that generates builds its engine by
name; an unknown name is one line on stderr and exit 2 before any model loads; ``tandem eval --engine hf``
runs end to end, and its options reach the engine."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml
from bigram_models import bigram_model
from console import TANDEM
from typer.testing import CliRunner

from tandem.cli.engines import DEFAULT_ENGINE_NAME, ENGINE_NAMES
from tandem.cli.main import app
from tandem.rollout.registry import DEFAULT_ENGINE, ENGINES

DIGITS = Path(__file__).parent / "digits_reward.py"
UNKNOWN = f"unknown rollout engine 'nope'; valid: {', '.join(sorted(ENGINES))}"


@pytest.fixture(scope="module")
def digits_dir(tmp_path_factory):
    """Answers every prompt ending in ':' with '12' (then EOS): digit_share 1.0 whenever it generates."""
    root = tmp_path_factory.mktemp("engine_cli")
    model = bigram_model(root / "m", {":": "1", "1": "2", "2": "</s>"})
    prompts = root / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"q{i}:"}) + "\n" for i in range(6)))
    return model, prompts


def _one_line_error(result, fragment: str) -> None:
    """Exit 2 and one error line (a progress bar, also on stderr, may precede it); no traceback."""
    assert result.exit_code == 2, result.output
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and fragment in lines[0], result.stderr
    assert "Traceback" not in result.stderr


def test_help_names_every_registered_engine():
    assert set(ENGINE_NAMES) == set(ENGINES) and DEFAULT_ENGINE_NAME == DEFAULT_ENGINE


def _label_config(tmp_path, model) -> Path:
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps({"prompt": "q:"}) + "\n")
    cfg = tmp_path / "label.yaml"
    spec = {"input_file": str(rows), "out_file": str(tmp_path / "out.jsonl"), "rule": "task:safety"}
    cfg.write_text(yaml.safe_dump({**spec, "policy": str(model)}))
    return cfg


def _dpo_config(tmp_path, model) -> Path:
    cfg = tmp_path / "dpo.yaml"
    data = {"train_file": str(tmp_path / "none.jsonl")}
    spec = {"model": str(model), "out_dir": str(tmp_path / "o"), "data": data, "online_rounds": 1}
    cfg.write_text(yaml.safe_dump({**spec, "online_judge": "task:safety"}))
    return cfg


@pytest.mark.parametrize("command", ["eval", "abtest", "serve", "label", "dpo"])
def test_unknown_engine_is_one_line_and_exit_2(digits_dir, tmp_path, command):
    model, _ = digits_dir
    args = {
        "eval": ["eval", str(model), "--engine", "nope"],
        "abtest": ["abtest", str(model), str(model), "--engine", "nope"],
        "serve": ["serve", str(model), "--engine", "nope"],
        "label": ["label", str(_label_config(tmp_path, model)), "--engine", "nope"],
        "dpo": ["dpo", str(_dpo_config(tmp_path, model)), "engine=nope"],
    }[command]
    where = "engine: " if command == "dpo" else "--engine: "
    _one_line_error(CliRunner().invoke(app, args), where + UNKNOWN)


def test_console_script_unknown_engine(digits_dir):
    model, _ = digits_dir
    proc = subprocess.run([*TANDEM, "eval", str(model), "--engine", "nope"], capture_output=True, text=True)
    assert proc.returncode == 2 and proc.stderr.strip() == f"error: --engine: {UNKNOWN}"


def _eval(model, prompts, tmp_path, *extra: str):
    out = tmp_path / f"eval{len(list(tmp_path.iterdir()))}.json"
    args = ["eval", str(model), "--eval-file", str(prompts), "--reward", f"{DIGITS}:digit_share"]
    args += ["--samples", "2", "--seed", "3", "--json", str(out), *extra]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    return json.loads(out.read_text())


def test_eval_with_engine_hf_and_its_options(digits_dir, tmp_path):
    model, prompts = digits_dir
    default = _eval(model, prompts, tmp_path)
    chosen = _eval(model, prompts, tmp_path, "--engine", "hf")
    generic = _eval(model, prompts, tmp_path, "--engine", "hf", "--engine-option", "fast_decode=false")
    assert chosen["engine"] == default["engine"] == "hf"
    assert chosen["metrics"]["eval/reward_mean"] == 1.0 and chosen["metrics"]["eval/num_prompts"] == 6
    assert chosen["metrics"] == default["metrics"]
    greedy = {k: v for k, v in chosen["metrics"].items() if k.startswith("eval/")}
    assert greedy == {k: generic["metrics"][k] for k in greedy}  # the generic decode path, same answers
    args = ["eval", str(model), "--eval-file", str(prompts), "--reward", f"{DIGITS}:digit_share"]
    bad = CliRunner().invoke(app, [*args, "--engine-option", "nope=1"])
    _one_line_error(bad, "rollout.engine_options.nope")
