"""`tandem sft` refuses bad options and data in one line naming the option or file:line, exit 2, before
anything is written: no --out folder appears, and the data file and a folder holding it are never --out."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tandem.cli.main import app
from tandem.errors import ConfigError

ROWS = [{"prompt": f"{i}+1=", "completion": str(i + 1)} for i in range(4)]


def invoke(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


def refused(result, line: str) -> bool:
    """Exit 2 and the output is the one error line (no traceback, no progress bar, no 'SFT done')."""
    return result.exit_code == 2 and result.output.strip().splitlines() == [f"error: {line}"]


def _data(tmp_path: Path) -> Path:
    path = tmp_path / "sft.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    return path


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("--steps", "0", "must be an integer >= 1, got 0"),
        ("--steps", "-3", "must be an integer >= 1, got -3"),
        ("--batch-size", "0", "must be an integer >= 1, got 0"),
        ("--lr", "nan", "must be a finite number > 0, got nan"),
        ("--lr", "-1", "must be a finite number > 0, got -1.0"),
        ("--lr", "inf", "must be a finite number > 0, got inf"),
        ("--weight-decay", "-0.1", "must be a finite number >= 0, got -0.1"),
        ("--weight-decay", "nan", "must be a finite number >= 0, got nan"),
    ],
)
def test_bad_numeric_option_is_refused_before_anything_is_written(
    tmp_path, tiny_model_dir, option, value, message
):
    out = tmp_path / "out"
    result = invoke("sft", tiny_model_dir, "--data", _data(tmp_path), option, value, "--out", out)
    assert refused(result, f"{option}: {message}"), result.output
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["sft.jsonl"]


def test_train_size_below_one_is_refused(tmp_path, tiny_model_dir):
    out = tmp_path / "out"
    result = invoke("sft", tiny_model_dir, "--task", "arith", "--train-size", "0", "--out", out)
    assert refused(result, "--train-size: must be an integer >= 1, got 0"), result.output
    assert not out.exists()


def test_data_that_is_not_utf8_names_file_and_line(tmp_path, tiny_model_dir):
    data = tmp_path / "latin1.jsonl"
    data.write_bytes(json.dumps(ROWS[0]).encode() + b'\n{"prompt": "caf\xe9", "completion": "x"}\n')
    out = tmp_path / "out"
    result = invoke("sft", tiny_model_dir, "--data", data, "--steps", "1", "--out", out)
    assert refused(result, f"{data}:2: not UTF-8 text (byte 15 of the line)"), result.output
    assert not out.exists()


def test_out_never_replaces_the_data_file_or_a_model_folder_holding_it(tmp_path, tiny_model_dir):
    data = _data(tmp_path)
    result = invoke("sft", tiny_model_dir, "--data", data, "--steps", "1", "--out", data)
    assert refused(result, f"--out: {data} is (or holds) the source file {data}; writing there would replace "
                   "it (choose another --out)"), result.output  # fmt: skip
    model = tmp_path / "earlier"  # an earlier Tandem model folder, which --out may replace, holding the data
    shutil.copytree(tiny_model_dir, model)
    inside = shutil.copy(data, model / "sft.jsonl")
    result = invoke("sft", tiny_model_dir, "--data", inside, "--steps", "1", "--out", model)
    assert refused(result, f"--out: {model} is (or holds) the source file {inside}; writing there would "
                   "replace it (choose another --out)"), result.output  # fmt: skip
    assert Path(inside).read_text() == data.read_text()


def test_supervised_loop_checks_its_settings_itself(tiny_model_dir):
    """Library callers (distillation, scripts) get the same one-line error, before any step."""
    from tandem.models import load_causal_lm, load_tokenizer
    from tandem.train.sft import SFTSettings, run_sft

    model, tok = load_causal_lm(tiny_model_dir), load_tokenizer(tiny_model_dir)
    bad = {
        "--steps": {"steps": 0},
        "--max-grad-norm": {"max_grad_norm": 0.0},
        "--warmup-steps": {"warmup_steps": -1},
    }
    for where, fields in bad.items():
        with pytest.raises(ConfigError, match=f"^{where}: must be"):
            run_sft(model, tok, [("1+1=", "2")], SFTSettings(**fields))
