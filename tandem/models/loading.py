"""Load and save Hugging Face causal-LM folders: offline, safetensors only, atomically.

Two loaders: :func:`load_causal_lm` returns a trainable model (an HF folder or an HF export), and
:func:`load_model` returns a model for inference: the same, or an INT8 export (``tandem export --format
int8``) rebuilt by :func:`tandem.models.int8.load_int8`. Every command that only reads a model (serve,
eval, abtest, a teacher, a reference) uses :func:`load_model`; a folder that is neither says so in one
line, and a training command given an INT8 export is told to use the export's source folder.

Loading never touches the network (``local_files_only=True``) and refuses folders whose weights exist
only as pickle files (``pytorch_model.bin``, ``*.pt``, ``*.pth``, ``*.ckpt``): unpickling runs arbitrary
code. Saving writes to a temporary sibling folder, fsyncs every file, then renames it into place, so a
crash never leaves a half-written folder that looks complete; it replaces only an empty folder or an
earlier Tandem model folder (``tandem_model.json``, see :mod:`tandem.data.outputs`).
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from tandem.data.outputs import EXPORT_MARKER, check_output_dir, write_model_marker
from tandem.errors import ModelError, first_line
from tandem.models.lora import is_adapter_folder, load_adapter_merged
from tandem.utils.io import atomic_dir

logger = logging.getLogger(__name__)

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


LOADABLE_FORMATS = ("hf", "int8")  # what load_model returns a module for; onnx/torchscript only serve


def model_format(path: str | os.PathLike) -> str:
    """``hf`` for a model folder, else the format an export folder's manifest names (``int8``,
    ``onnx``, ``torchscript``, ``hf``); ModelError for an unreadable manifest."""
    manifest = Path(path) / EXPORT_MARKER
    if not manifest.is_file():
        return "hf"
    try:
        return str(json.loads(manifest.read_text())["format"])
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ModelError(f"unreadable export manifest: {first_line(err)}", where=str(manifest)) from None


def export_source(path: str | os.PathLike) -> str | None:
    """The model folder an export was made from (its manifest's ``source``), if recorded."""
    try:
        return json.loads((Path(path) / EXPORT_MARKER).read_text()).get("source")
    except (OSError, ValueError, AttributeError):
        return None


def _trainable(path: Path) -> None:
    """ModelError unless ``path`` holds HF weights (an INT8 / ONNX / TorchScript export does not)."""
    fmt = model_format(path)
    if fmt == "hf":
        return
    source = export_source(path)
    what = "inference only" if fmt == "int8" else "a compiled graph, not model weights"
    raise ModelError(
        f"'{fmt}' export folder ({what}): it cannot be trained or exported again",
        where=str(path),
        hint=f"use the folder it was exported from: {source}"
        if source
        else "use the folder it was exported from",
    )


def check_model_folder(path: Path) -> None:
    """Raise ModelError unless ``path`` is a folder with ``config.json`` and safetensors weights."""
    if not path.exists():
        raise ModelError("model folder does not exist", where=str(path), hint="check model.path")
    if not path.is_dir():
        raise ModelError("model path is not a folder", where=str(path), hint="point model.path at a folder")
    if not (path / "config.json").is_file():
        raise ModelError(
            "no config.json in model folder",
            where=str(path),
            hint="save the model with save_pretrained() or run `tandem init-model`",
        )
    if any(path.glob("*.safetensors")):
        return
    pickles = sorted(p.name for p in path.iterdir() if p.suffix in PICKLE_SUFFIXES)
    if pickles:
        raise ModelError(
            f"refusing pickle weights {', '.join(pickles)} (unsafe to load)",
            where=str(path),
            hint="convert to safetensors: model.save_pretrained(path, safe_serialization=True)",
        )
    raise ModelError("no *.safetensors weights in model folder", where=str(path))


def check_model_key(value: str | None, key: str) -> None:
    """:func:`check_model_folder` for the folder a config names under ``key`` (a local path; None and URLs,
    fetched later, pass), with the error naming that key: the loaders' hint names model.path."""
    if not value or "://" in value:
        return
    try:
        check_model_folder(Path(value))
    except ModelError as err:
        raise ModelError(f"{value}: {err.message}", where=key, hint=f"check {key} in the config") from None


def _check_tokenizer_folder(path: Path) -> None:
    if not path.is_dir():
        raise ModelError("tokenizer folder does not exist", where=str(path), hint="check model.path")
    if not any((path / name).is_file() for name in ("tokenizer.json", "tokenizer_config.json")):
        raise ModelError(
            "no tokenizer.json or tokenizer_config.json in folder",
            where=str(path),
            hint="save the tokenizer with tokenizer.save_pretrained(path)",
        )


def load_tokenizer(path: str | os.PathLike) -> PreTrainedTokenizerBase:
    """Load the tokenizer of a local model folder, ready for batched generation.

    Guarantees a pad token (falls back to EOS, which is how most decoder-only checkpoints are padded) and
    left padding (prompts must end at the same column so the next token is sampled at the last one).
    """
    folder = Path(path)
    _check_tokenizer_folder(folder)
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True, padding_side="left")
    except (OSError, ValueError) as err:
        raise ModelError(f"cannot load tokenizer: {first_line(err)}", where=str(folder)) from err
    if tokenizer.pad_token_id is None:
        if tokenizer.eos_token_id is None:
            raise ModelError(
                "tokenizer has neither a pad nor an eos token",
                where=str(folder),
                hint="set pad_token in tokenizer_config.json",
            )
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    return tokenizer


def load_causal_lm(
    path: str | os.PathLike, *, dtype: str = "float32", device: str | torch.device = "cpu"
) -> PreTrainedModel:
    """Load a causal LM from a local Hugging Face folder, offline and from safetensors only.

    ``dtype`` is ``"float32"``, ``"bfloat16"`` or ``"float16"``. The model comes back in eval mode, as
    ``from_pretrained`` leaves it; the trainer switches it to train mode itself. A LoRA adapter folder (a
    LoRA run's checkpoint) loads as its base with the adapter merged in: a plain model.
    """
    folder = Path(path)
    if dtype not in DTYPES:
        raise ModelError(f"unknown dtype '{dtype}'", where="model.dtype", hint=f"use one of {sorted(DTYPES)}")
    if is_adapter_folder(folder):
        return load_adapter_merged(folder, lambda base: load_causal_lm(base, dtype=dtype, device=device))
    _trainable(folder)
    check_model_folder(folder)
    try:
        model = AutoModelForCausalLM.from_pretrained(
            str(folder), local_files_only=True, dtype=DTYPES[dtype], use_safetensors=True
        )
    except (OSError, ValueError, KeyError) as err:
        raise ModelError(f"cannot load model: {first_line(err)}", where=str(folder)) from err
    return model.to(device)


def load_model(
    path: str | os.PathLike, *, dtype: str = "float32", device: str | torch.device = "cpu"
) -> PreTrainedModel:
    """A model to run, not train: an HF folder as :func:`load_causal_lm` loads it, or an INT8 export
    rebuilt with its dynamic INT8 linears (float32 activations, on the CPU: ``dtype`` and ``device`` do
    not apply). Eval mode. ModelError in one line for an ONNX / TorchScript export or a folder that is
    not a model."""
    folder = Path(path)
    if is_adapter_folder(folder):
        return load_causal_lm(folder, dtype=dtype, device=device)
    fmt = model_format(folder)
    if fmt not in LOADABLE_FORMATS:
        raise ModelError(
            f"the '{fmt}' export holds a compiled graph that only `tandem serve` runs",
            where=str(folder),
            hint=f"use its source folder ({export_source(folder)}) or an hf / int8 export",
        )
    if fmt == "int8":
        from tandem.models.int8 import load_int8

        if not (folder / "config.json").is_file():
            raise ModelError("no config.json in INT8 export folder", where=str(folder))
        return load_int8(folder)
    return load_causal_lm(folder, dtype=dtype, device=device).eval()


def save_pretrained_atomic(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase | None,
    out_dir: str | os.PathLike,
    *,
    created_by: str = "tandem",
    source: str | os.PathLike | None = None,
    recipe: dict[str, Any] | None = None,
) -> Path:
    """Save ``model`` (safetensors) and ``tokenizer`` as an HF folder at ``out_dir``, atomically, marked
    as a Tandem model folder (``tandem_model.json``: ``created_by``, ``source``, a warm start's ``recipe``).

    Refuses (:class:`ConfigError`, nothing written) an ``out_dir`` that is, or holds, ``source`` (the
    model it was trained from), and an existing non-empty folder that is not a Tandem model folder
    (:func:`tandem.data.outputs.check_output_dir`). Uses :func:`tandem.utils.io.atomic_dir`: written into
    a temporary sibling, fsynced, then renamed into place; an existing model folder is replaced only once
    the new folder is complete, and a failure leaves it untouched. Returns ``out_dir``.
    """
    check_output_dir(out_dir, "model", sources=(source,))
    with atomic_dir(out_dir) as tmp:
        model.save_pretrained(str(tmp), safe_serialization=True)
        if tokenizer is not None:
            tokenizer.save_pretrained(str(tmp))
        write_model_marker(tmp, created_by=created_by, source=source, recipe=recipe)
    logger.debug("saved model folder %s", out_dir)
    return Path(out_dir)
