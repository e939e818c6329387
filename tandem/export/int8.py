"""Dynamic INT8 quantisation (``torch.ao``) stored as safetensors, and loading it back.

:func:`quantize_int8` replaces every ``nn.Linear`` with ``torch.ao.nn.quantized.dynamic.Linear``
(weights int8 per output channel, activations quantised on the fly), the standard recipe for CPU
inference of transformer LMs. A quantised module pickles as a packed op, so instead of ``torch.save`` the
export stores each quantised weight as its int8 values plus per-channel scales and zero points in a
safetensors file (no pickle anywhere), and :func:`load_int8` rebuilds the modules from those tensors.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import safetensors.torch
import torch
from torch import nn
from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedModel, PreTrainedTokenizerBase

from tandem.errors import ModelError
from tandem.export import MANIFEST
from tandem.utils.io import atomic_dir

WEIGHTS = "model.int8.safetensors"


def quantize_int8(model: PreTrainedModel) -> PreTrainedModel:
    """A dynamically quantised copy of ``model``: every ``nn.Linear`` -> int8 dynamic Linear."""
    from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

    model = model.float().eval()
    if getattr(model.config, "tie_word_embeddings", False):
        model.lm_head.weight = nn.Parameter(model.lm_head.weight.detach().clone())  # untie before quantising
    with warnings.catch_warnings():  # torch 2.13 flags quantized tensors as deprecated; they still work
        warnings.filterwarnings("ignore", message=".*quantize_per.*deprecated", category=UserWarning)
        return quantize_dynamic(
            model, {nn.Linear: per_channel_dynamic_qconfig}, dtype=torch.qint8, inplace=False
        )


def _quantized_linears(model: nn.Module) -> dict[str, nn.Module]:
    from torch.ao.nn.quantized.dynamic import Linear as QLinear

    return {name: m for name, m in model.named_modules() if isinstance(m, QLinear)}


def int8_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """Plain tensors of a quantised model: float params/buffers as they are, and for each quantised
    Linear ``<name>.qweight`` (int8 ``[out, in]``), ``.scales``/``.zero_points`` (``[out]``), ``.bias``."""
    qlinears = _quantized_linears(model)
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


def load_int8(folder: str | Path) -> PreTrainedModel:
    """Rebuild a quantised model from an INT8 export folder (safetensors only)."""
    from torch.ao.nn.quantized.dynamic import Linear as QLinear  # noqa: F401  (registers quantized ops)

    folder = Path(folder)
    path = folder / WEIGHTS
    if not path.is_file():
        raise ModelError(f"no {WEIGHTS} in INT8 export folder", where=str(folder))
    config = AutoConfig.from_pretrained(str(folder), local_files_only=True)
    config.tie_word_embeddings = False
    base = AutoModelForCausalLM.from_config(config)
    model = quantize_int8(base)
    tensors = safetensors.torch.load_file(str(path))
    for name, module in _quantized_linears(model).items():
        try:  # [out, in] int8 values + per-output-channel scale / zero point -> a qint8 tensor
            q = torch._make_per_channel_quantized_tensor(
                tensors.pop(f"{name}.qweight"),
                tensors.pop(f"{name}.scales").double(),
                tensors.pop(f"{name}.zero_points"),
                0,
            )
        except KeyError as err:
            raise ModelError(f"INT8 weights lack {err.args[0]}", where=str(path)) from err
        module.set_weight_bias(q, tensors.pop(f"{name}.bias", None))
    own = dict(model.named_parameters()) | dict(model.named_buffers())
    unexpected = sorted(set(tensors) - set(own))
    missing = sorted(k for k in own if k not in tensors and not k.endswith("inv_freq"))
    if missing or unexpected:
        raise ModelError(
            f"INT8 weights do not match the config: missing {missing[:3]}, unexpected {unexpected[:3]}",
            where=str(path),
        )
    with torch.no_grad():
        for key, value in tensors.items():
            if own[key].shape != value.shape:
                raise ModelError(
                    f"'{key}' has shape {tuple(value.shape)}, config needs {tuple(own[key].shape)}",
                    where=str(path),
                )
            own[key].copy_(value)
    return model.eval()
