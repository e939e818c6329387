"""Exports: INT8 round trip and size, ONNX / TorchScript logits parity, and serving the exports."""

from __future__ import annotations

import json

import pytest
import torch

from tandem.errors import ConfigError
from tandem.export.api import export_model
from tandem.models import load_causal_lm, load_tokenizer
from tandem.rollout import SamplingParams
from tandem.serve.decode import RowRequest, decode_rows
from tandem.serve.model import ServedModel


def _greedy(served: ServedModel, prompts: list[str]) -> list[list[int]]:
    rows = [RowRequest(served.encode(p), SamplingParams(max_new_tokens=6, temperature=0)) for p in prompts]
    return [r.token_ids for r in decode_rows(served.model, served.tokenizer, rows)]


def test_int8_export_is_smaller_reloads_exactly_and_serves(tiny_model_dir, tmp_path):
    report = export_model(tiny_model_dir, tmp_path / "int8", "int8", task="arith", eval_size=8)
    assert report.size_after < 0.6 * report.size_before
    assert 0 < report.parity_max_abs_diff < 0.5  # quantisation changes logits, but only a little
    assert report.accuracy_before is not None and report.eval_prompts == 8
    served = ServedModel.load(tmp_path / "int8")
    assert served.format == "int8"
    from tandem.export.int8 import quantize_int8

    fp32 = load_causal_lm(tiny_model_dir)
    ids = torch.tensor([served.encode("12+3=")])
    with torch.no_grad():  # the reloaded INT8 model == quantising the fp32 model in memory
        assert torch.equal(served.model(ids).logits, quantize_int8(fp32)(ids).logits)
    assert all(_greedy(served, ["1+1=", "abc"]))


def test_onnx_export_parity_and_served_greedy_matches_eager(tiny_model_dir, tmp_path):
    pytest.importorskip("onnxruntime")
    report = export_model(tiny_model_dir, tmp_path / "onnx", "onnx")
    assert report.parity_max_abs_diff < 1e-4
    manifest = json.loads((tmp_path / "onnx" / "tandem_export.json").read_text())
    assert manifest["format"] == "onnx"
    onnx_served = ServedModel.load(tmp_path / "onnx")
    eager = ServedModel.load(tiny_model_dir)
    prompts = ["12+34=", "a longer prompt here", "7"]  # left padding exercises position ids
    assert _greedy(onnx_served, prompts) == _greedy(eager, prompts)
    row = RowRequest(eager.encode("12+34="), SamplingParams(max_new_tokens=1), prompt_logprobs=True)
    scored = [decode_rows(m.model, m.tokenizer, [row])[0].prompt_logprobs for m in (onnx_served, eager)]
    assert [e.logprob for e in scored[0][1:]] == pytest.approx([e.logprob for e in scored[1][1:]], abs=1e-4)


def test_torchscript_export_parity(tiny_model_dir, tmp_path):
    report = export_model(tiny_model_dir, tmp_path / "ts", "torchscript")
    assert report.parity_max_abs_diff < 1e-5
    module = torch.jit.load(str(tmp_path / "ts" / "model.torchscript"))
    tok = load_tokenizer(tmp_path / "ts")
    ids = torch.tensor([tok("1+2=")["input_ids"]])
    logits = module(ids, torch.ones_like(ids), torch.arange(ids.shape[1])[None])
    assert logits.shape == (1, ids.shape[1], len(tok))


def test_hf_export_and_unknown_format(tiny_model_dir, tmp_path):
    export_model(tiny_model_dir, tmp_path / "hf", "hf")
    assert (tmp_path / "hf" / "model.safetensors").is_file()
    with pytest.raises(ConfigError, match="--format"):
        export_model(tiny_model_dir, tmp_path / "x", "gguf")
