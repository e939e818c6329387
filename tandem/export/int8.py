"""Writing an INT8 export folder: dynamic INT8 weights (``torch.ao``) stored as safetensors.

The model side (quantising, and rebuilding a model from the folder) is :mod:`tandem.models.int8`, which
every command that reads a model folder loads through. Here: the plain tensors of a quantised model
(:func:`int8_state`: int8 values plus per-channel scales and zero points, no pickle anywhere) and the
atomic folder write (:func:`save_int8`).
"""

from __future__ import annotations

import json
from pathlib import Path

import safetensors.torch
import torch
from torch import nn
from transformers import PreTrainedTokenizerBase

from tandem.export import MANIFEST
from tandem.models.int8 import WEIGHTS, load_int8, quantize_int8, quantized_linears
from tandem.utils.io import atomic_dir

__all__ = ["WEIGHTS", "int8_state", "load_int8", "quantize_int8", "save_int8"]


def int8_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """Plain tensors of a quantised model: float params/buffers as they are, and for each quantised
    Linear ``<name>.qweight`` (int8 ``[out, in]``), ``.scales``/``.zero_points`` (``[out]``), ``.bias``."""
    qlinears = quantized_linears(model)
    tensors: dict[str, torch.Tensor] = {}
    for name, module in qlinears.items():
        weight, bias = module._weight_bias()
        tensors[f"{name}.qweight"] = weight.int_repr().contiguous()  # [out, in] int8
        tensors[f"{name}.scales"] = weight.q_per_channel_scales().float().contiguous()  # [out]
        tensors[f"{name}.zero_points"] = weight.q_per_channel_zero_points().long().contiguous()  # [out]
        if bias is not None:
            tensors[f"{name}.bias"] = bias.detach().contiguous()
    for key, value in model.state_dict().items():
        if (
            isinstance(value, torch.Tensor)
            and not value.is_quantized
            and not key.split(".")[-1].startswith("_")
        ):
            owner = key.rsplit(".", 1)[0]
            if owner not in qlinears and "_packed_params" not in key:
                tensors[key] = value.detach().contiguous()
    return tensors


def save_int8(model: nn.Module, tokenizer: PreTrainedTokenizerBase, out_dir: str | Path, source: str) -> Path:
    """Write an INT8 export folder atomically: config, tokenizer, int8 safetensors, manifest."""
    with atomic_dir(out_dir) as tmp:
        model.config.save_pretrained(str(tmp))
        tokenizer.save_pretrained(str(tmp))
        safetensors.torch.save_file(int8_state(model), str(tmp / WEIGHTS))
        (tmp / MANIFEST).write_text(
            json.dumps({"format": "int8", "source": source, "weights": WEIGHTS}, indent=2)
        )
    return Path(out_dir)
