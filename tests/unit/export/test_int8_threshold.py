"""``tandem export --format int8 --int8-min-weights N``: Linears below N weights stay float32, the
export reloads (and serves) with exactly that split, and a threshold that quantises nothing is refused
before anything is written."""

from __future__ import annotations

import pytest
import torch
from torch.ao.nn.quantized.dynamic import Linear as QLinear

from tandem.errors import ConfigError
from tandem.export.api import export_model
from tandem.models import load_causal_lm, load_model
from tandem.models.int8 import linears_at_least, quantize_int8


def test_threshold_keeps_small_linears_fp32_and_reloads_the_same_split(tiny_model_dir, tmp_path):
    fp32 = load_causal_lm(tiny_model_dir)  # hidden 32: attention 32x32 = 1024 weights, MLP 32x128 = 4096
    names = linears_at_least(fp32, 4096)
    assert names and all("mlp" in n for n in names)
    report = export_model(tiny_model_dir, tmp_path / "int8", "int8", int8_min_weights=4096)
    assert report.parity_max_abs_diff is not None
    served = load_model(tmp_path / "int8")
    modules = dict(served.named_modules())
    assert sorted(n for n, m in modules.items() if isinstance(m, QLinear)) == sorted(names)
    assert type(modules["model.layers.0.self_attn.q_proj"]) is torch.nn.Linear
    ids = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad():  # the reloaded export == quantising the same Linears in memory
        expected = quantize_int8(load_causal_lm(tiny_model_dir), names)(ids).logits
        assert torch.equal(served(ids).logits, expected)


@pytest.mark.parametrize(
    ("fmt", "count", "message"),
    [("int8", 10**9, "leaves no Linear to quantise"), ("int8", -1, ">= 0"), ("hf", 10, "--format int8")],
)
def test_bad_thresholds_are_refused_before_writing(tiny_model_dir, tmp_path, fmt, count, message):
    with pytest.raises(ConfigError, match=message) as err:
        export_model(tiny_model_dir, tmp_path / "out", fmt, int8_min_weights=count)
    assert str(err.value).startswith("--int8-min-weights: ")
    assert not (tmp_path / "out").exists()
