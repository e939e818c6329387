"""ONNX and TorchScript exports of a causal LM's logits forward, with parity checks, and an ONNX stepper.

Both graphs take ``(input_ids [B, S] long, attention_mask [B, S] long, position_ids [B, S] long)`` and
return ``logits [B, S, V]`` (no KV cache: the graph stays a plain feed-forward function that every
runtime accepts). Position ids are an input because left-padded batches need mask-aware positions.
The parity check runs the exported graph (onnxruntime / ``torch.jit.load``) and the eager model on the
same left-padded batch and reports the max absolute logits difference.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import torch
from torch import nn
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from tandem.errors import MissingDependencyError, ModelError
from tandem.export import MANIFEST
from tandem.models.forward import positions_from_mask
from tandem.utils.io import atomic_dir

ONNX_FILE, TS_FILE = "model.onnx", "model.torchscript"


class LogitsForward(nn.Module):
    """``(ids, mask, positions) -> logits``: the model's forward without a cache."""

    def __init__(self, model: PreTrainedModel) -> None:
        super().__init__()
        self.model = model

    def forward(self, ids: torch.Tensor, mask: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False).logits


def sample_batch(tokenizer: PreTrainedTokenizerBase, texts: list[str]) -> tuple[torch.Tensor, ...]:
    """A left-padded batch (ids, mask, positions), each ``[B, S]`` long."""
    enc = tokenizer(texts, padding=True, return_tensors="pt")
    mask = enc["attention_mask"].long()
    return enc["input_ids"].long(), mask, positions_from_mask(mask.bool()).long()


PARITY_TEXTS = ["12+34=", "hello world, this is a longer prompt", "7"]


def _onnx_modules():
    try:
        import onnx
        import onnxruntime
    except ImportError as err:
        raise MissingDependencyError(err.name or "onnx", "export") from err
    return onnx, onnxruntime


def export_onnx(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, out_dir: str | Path, source: str
) -> float:
    """Write an ONNX export folder atomically; returns the max abs logits diff (onnxruntime vs eager)."""
    onnx, _ = _onnx_modules()
    wrapper = LogitsForward(model.float().eval())
    batch = sample_batch(tokenizer, PARITY_TEXTS)
    dynamic = {n: {0: "batch", 1: "seq"} for n in ("input_ids", "attention_mask", "position_ids", "logits")}
    with atomic_dir(out_dir) as tmp:
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")
            torch.onnx.export(
                wrapper,
                batch,
                str(tmp / ONNX_FILE),
                input_names=list(dynamic)[:3],
                output_names=["logits"],
                dynamic_axes=dynamic,
                opset_version=17,
                dynamo=False,
            )
        onnx.checker.check_model(str(tmp / ONNX_FILE))
        model.config.save_pretrained(str(tmp))
        tokenizer.save_pretrained(str(tmp))
        diff = onnx_parity(tmp / ONNX_FILE, wrapper, tokenizer)
        (tmp / MANIFEST).write_text(
            json.dumps(
                {"format": "onnx", "source": source, "weights": ONNX_FILE, "parity_max_abs_diff": diff},
                indent=2,
            )
        )
    return diff


def onnx_parity(path: Path, wrapper: nn.Module, tokenizer: PreTrainedTokenizerBase) -> float:
    """Max abs logits difference between onnxruntime and eager on a left-padded batch of other lengths
    than the export sample (so the dynamic axes are exercised)."""
    _, ort = _onnx_modules()
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    ids, mask, pos = sample_batch(
        tokenizer, ["1+1=", "a rather different prompt of another size", "xyz", "42"]
    )
    got = session.run(
        None, {"input_ids": ids.numpy(), "attention_mask": mask.numpy(), "position_ids": pos.numpy()}
    )[0]  # [B, S, V]
    with torch.no_grad():
        want = wrapper(ids, mask, pos)  # [B, S, V]
    real = mask.bool()
    return float((torch.from_numpy(got) - want).abs()[real].max())


def export_torchscript(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, out_dir: str | Path, source: str
) -> float:
    """Write a TorchScript (traced) export folder atomically; returns the max abs logits diff."""
    wrapper = LogitsForward(model.float().eval())
    batch = sample_batch(tokenizer, PARITY_TEXTS)
    with atomic_dir(out_dir) as tmp:
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")
            model.config.return_dict = True
            traced = torch.jit.trace(wrapper, batch, check_trace=False, strict=False)
        traced.save(str(tmp / TS_FILE))
        model.config.save_pretrained(str(tmp))
        tokenizer.save_pretrained(str(tmp))
        loaded = torch.jit.load(str(tmp / TS_FILE))
        ids, mask, pos = sample_batch(tokenizer, ["1+1=", "a rather different prompt of another size", "xyz"])
        with torch.no_grad():
            diff = float((loaded(ids, mask, pos) - wrapper(ids, mask, pos)).abs()[mask.bool()].max())
        (tmp / MANIFEST).write_text(
            json.dumps(
                {"format": "torchscript", "source": source, "weights": TS_FILE, "parity_max_abs_diff": diff},
                indent=2,
            )
        )
    return diff


class OnnxStepper:
    """A :class:`~tandem.rollout.stepper.DecodeStepper` over an ONNX logits graph (onnxruntime).

    The graph has no KV cache, so each step re-runs the whole sequence so far (cost grows with length);
    fine for short completions and for checking an ONNX export end to end behind the server.
    """

    def __init__(self, session) -> None:
        self.session = session
        self._ids: torch.Tensor | None = None  # [B, L]
        self._pos: torch.Tensor | None = None  # [B, L]

    def _run(self, mask: torch.Tensor) -> torch.Tensor:
        feeds = {
            "input_ids": self._ids.numpy(),
            "attention_mask": mask.long().numpy(),
            "position_ids": self._pos.numpy(),
        }
        return torch.from_numpy(self.session.run(None, feeds)[0][:, -1])  # [B, V]

    def prefill(
        self, ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor
    ) -> torch.Tensor:
        self._ids, self._pos = ids.cpu().long(), position_ids.cpu().long()
        return self._run(attention_mask.cpu())

    def step(
        self, ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor
    ) -> torch.Tensor:
        self._ids = torch.cat([self._ids, ids.cpu().long()], dim=1)
        self._pos = torch.cat([self._pos, position_ids.cpu().long()], dim=1)
        return self._run(attention_mask.cpu())


class OnnxModel:
    """What the server needs of an ONNX export: its config, a device, and a stepper factory."""

    def __init__(self, folder: str | Path) -> None:
        from transformers import AutoConfig

        _, ort = _onnx_modules()
        path = Path(folder) / ONNX_FILE
        if not path.is_file():
            raise ModelError(f"no {ONNX_FILE} in ONNX export folder", where=str(folder))
        options = ort.SessionOptions()
        options.intra_op_num_threads = max(1, torch.get_num_threads())
        self.session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        self.config = AutoConfig.from_pretrained(str(folder), local_files_only=True)
        self.device = torch.device("cpu")

    def make_stepper(self, batch_size: int, max_len: int) -> OnnxStepper:
        return OnnxStepper(self.session)

    def sequence_logits(self, ids: torch.Tensor) -> torch.Tensor:
        """Logits at every position of unpadded ``ids`` ``[B, L]`` -> ``[B, L, V]`` (the server scores
        prompts with it: ``echo`` with ``logprobs``)."""
        ids = ids.cpu().long()
        positions = torch.arange(ids.shape[1]).expand_as(ids)
        feeds = {
            "input_ids": ids.numpy(),
            "attention_mask": torch.ones_like(ids).numpy(),
            "position_ids": positions.contiguous().numpy(),
        }
        return torch.from_numpy(self.session.run(None, feeds)[0])

    def eval(self) -> OnnxModel:
        return self
