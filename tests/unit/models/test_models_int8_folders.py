"""Every command that reads a model folder takes an INT8 export, loaded as `tandem serve` loads it
(:func:`tandem.models.load_model`); training refuses one and names its source; a folder that is no
model is one line."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from tandem.cli.main import app
from tandem.errors import ModelError
from tandem.evaluate.runner import target_engine
from tandem.evaluate.targets import resolve_target
from tandem.export.api import export_model
from tandem.models import load_causal_lm, load_model, load_tokenizer, model_format
from tandem.models.int8 import quantize_int8

TASK = ["--task", "arith", "--task-option", "digits=1", "--task-option", "ops=+"]


@pytest.fixture(scope="module")
def int8_dir(tiny_model_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("exports") / "int8"
    export_model(tiny_model_dir, out, "int8")
    return out


def _lines(output: str) -> list[str]:
    """The output's lines less the progress bar's (drawn before the error is known)."""
    return [line for line in output.splitlines() if line.strip() and "━" not in line]


def test_load_model_reads_an_int8_export_as_serving_does(tiny_model_dir, int8_dir):
    from tandem.serve.model import ServedModel

    assert model_format(int8_dir) == "int8" and model_format(tiny_model_dir) == "hf"
    model = load_model(int8_dir)
    served = ServedModel.load(int8_dir)
    ids = torch.tensor([load_tokenizer(int8_dir)("12+3=")["input_ids"]])
    with torch.no_grad():
        expected = quantize_int8(load_causal_lm(tiny_model_dir))(ids).logits
        assert torch.equal(model(ids).logits, expected)
        assert torch.equal(served.model(ids).logits, expected)
    assert torch.equal(  # an HF folder loads as load_causal_lm loads it
        load_model(tiny_model_dir)(ids).logits, load_causal_lm(tiny_model_dir)(ids).logits
    )


def test_eval_and_abtest_take_an_int8_export(tiny_model_dir, int8_dir, tmp_path):
    runner = CliRunner()
    report = tmp_path / "eval.json"
    argv = ["eval", str(int8_dir), *TASK, "--size", "4", "--samples", "0", "--max-new-tokens", "3"]
    result = runner.invoke(app, [*argv, "--json", str(report)])
    assert result.exit_code == 0, result.output
    assert json.loads(report.read_text())["model"] == str(int8_dir)
    decision = tmp_path / "decision.json"
    ab = runner.invoke(app, ["abtest", str(tiny_model_dir), str(int8_dir), *TASK, "--size", "4",
                             "--max-new-tokens", "3", "--temperature", "0", "--json", str(decision)])  # fmt: skip
    assert ab.exit_code in (0, 1), ab.output  # 0 promotes B, 1 keeps A: both are decisions
    assert json.loads(decision.read_text())["decision"]


@pytest.mark.parametrize("command", ["eval", "abtest"])
def test_a_folder_that_is_no_model_is_one_line(tiny_model_dir, tmp_path, command):
    junk = tmp_path / "junk"
    junk.mkdir()
    (junk / "notes.txt").write_text("not a model")
    folders = [str(junk)] if command == "eval" else [str(tiny_model_dir), str(junk)]
    result = CliRunner().invoke(app, [command, *folders, *TASK, "--size", "2"])
    assert result.exit_code == 2, result.output
    lines = _lines(result.output)
    assert len(lines) == 1 and str(junk) in lines[0] and "export folder" in lines[0], result.output


def test_training_an_int8_export_is_refused_with_its_source(tiny_model_dir, int8_dir):
    with pytest.raises(ModelError, match="'int8' export folder") as err:
        load_causal_lm(int8_dir)
    assert str(tiny_model_dir) in str(err.value)


def test_an_engine_that_loads_its_own_copy_is_refused_for_int8(int8_dir):
    with pytest.raises(ModelError, match="runs only on the in-process engine, not 'vllm'"):
        target_engine(resolve_target(int8_dir), None, engine="vllm")


def test_a_graph_export_is_one_line(tiny_model_dir, tmp_path):
    graph = tmp_path / "graph"
    graph.mkdir()
    (graph / "config.json").write_text((tiny_model_dir / "config.json").read_text())
    (graph / "tandem_export.json").write_text(json.dumps({"format": "onnx", "source": str(tiny_model_dir)}))
    with pytest.raises(ModelError, match="'onnx' export holds a compiled graph") as err:
        load_model(graph)
    assert str(tiny_model_dir) in str(err.value) and "\n" not in str(err.value)
