"""Dynamic INT8 models (``torch.ao``): quantising a model, and rebuilding one from an INT8 export folder.

:func:`quantize_int8` replaces every ``nn.Linear`` with ``torch.ao.nn.quantized.dynamic.Linear``
(weights int8 per output channel, activations quantised on the fly), the standard recipe for CPU
inference of transformer LMs. A quantised module pickles as a packed op, so an INT8 export
(``tandem export --format int8``, written by :mod:`tandem.export.int8`) stores each quantised weight as its
int8 values plus per-channel scales and zero points in a safetensors file (no pickle anywhere), and
:func:`load_int8` rebuilds the modules from those tensors. Loading lives here, below every command that
reads a model folder, so serving, evaluation, A/B tests and teachers all load an export the same way.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable
from pathlib import Path

import safetensors.torch
import torch
from torch import nn
from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedModel

from tandem.errors import ModelError

WEIGHTS = "model.int8.safetensors"


def linears_at_least(model: nn.Module, min_weights: int) -> list[str]:
    """Names of the ``nn.Linear`` modules of ``model`` with at least ``min_weights`` weights (in x out).

    Dynamic INT8 quantises each call's input and dequantises its output, which costs more than the
    int8 matmul saves on small matrices. Measured on one CPU thread, 32 rows: 64 -> 256 (16K weights)
    is 1.3x slower in INT8, 128 -> 512 (65K) 1.0-1.2x, 256 -> 1024 (262K) 1.5x faster (docs/distillation.md)."""
    return [
        name
        for name, module in model.named_modules()
        if isinstance(module, nn.Linear) and module.in_features * module.out_features >= min_weights
    ]


def quantize_int8(model: PreTrainedModel, names: Iterable[str] | None = None) -> PreTrainedModel:
    """A dynamically quantised copy of ``model``: every ``nn.Linear`` (``names`` None), or the Linears
    named in ``names``, -> int8 dynamic Linear; the others stay float32."""
    from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

    model = model.float().eval()
    if getattr(model.config, "tie_word_embeddings", False):
        model.lm_head.weight = nn.Parameter(model.lm_head.weight.detach().clone())  # untie before quantising
    spec = (
        {nn.Linear: per_channel_dynamic_qconfig}
        if names is None
        else dict.fromkeys(names, per_channel_dynamic_qconfig)
    )
    with warnings.catch_warnings():  # torch 2.13 flags quantized tensors as deprecated; they still work
        warnings.filterwarnings("ignore", message=".*quantize_per.*deprecated", category=UserWarning)
        warnings.filterwarnings("ignore", message=".*migrate to use torchao.*", category=UserWarning)
        return quantize_dynamic(model, spec, dtype=torch.qint8, inplace=False)


def quantized_linears(model: nn.Module) -> dict[str, nn.Module]:
    """Every dynamic INT8 Linear of ``model``, by module name."""
    from torch.ao.nn.quantized.dynamic import Linear as QLinear

    return {name: m for name, m in model.named_modules() if isinstance(m, QLinear)}


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
    tensors = safetensors.torch.load_file(str(path))
    # The Linears stored as int8 (``.qweight``) are quantised again; any other stays float32 (an export
    # with a --int8-min-weights threshold). An export without any int8 weight is refused.
    names = [key.removesuffix(".qweight") for key in tensors if key.endswith(".qweight")]
    if not names:
        raise ModelError("no int8 weights (*.qweight) in INT8 export folder", where=str(path))
    model = quantize_int8(base, names)
    for name, module in quantized_linears(model).items():
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
