"""``tandem export``: turn a run, checkpoint or model folder into an HF, ONNX, TorchScript or INT8 folder.

Every export reports what changed: weight size (bytes on disk) before and after, logits parity for graph
exports (max abs difference, exported vs eager), forward latency exported vs eager, and for INT8 the
held-out accuracy of the eager and the quantised model on the same prompts (greedy).
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from tandem.data.outputs import check_output_dir
from tandem.errors import ConfigError
from tandem.evaluate.heldout import evaluate_prompts
from tandem.evaluate.targets import EvalData, eval_data, resolve_target
from tandem.export import FORMATS, MANIFEST
from tandem.models import load_causal_lm, load_tokenizer
from tandem.rollout import IN_PROCESS_ENGINE, EngineSpec, SamplingParams, build_engine
from tandem.utils.io import atomic_dir


@dataclass
class ExportReport:
    """What ``tandem export`` prints (and writes as JSON with ``--json``)."""

    format: str
    source: str
    out_dir: str
    size_before: int
    size_after: int
    parity_max_abs_diff: float | None = None
    latency_eager_ms: float | None = None
    latency_export_ms: float | None = None
    accuracy_before: float | None = None
    accuracy_after: float | None = None
    eval_prompts: int = 0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def folder_bytes(folder: Path, suffixes: tuple[str, ...] = (".safetensors", ".onnx", ".torchscript")) -> int:
    """Bytes of the weight files in ``folder``."""
    return sum(p.stat().st_size for p in Path(folder).iterdir() if p.suffix in suffixes and p.is_file())


def _latency_ms(fn, batch: tuple[torch.Tensor, ...], repeats: int = 10) -> float:
    """Median wall time of ``fn(*batch)`` in ms (after one warm-up call)."""
    with torch.no_grad():
        fn(*batch)
        times = []
        for _ in range(repeats):
            started = time.perf_counter()
            fn(*batch)
            times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def _accuracy(model, tokenizer, data) -> float:
    engine = build_engine(IN_PROCESS_ENGINE, EngineSpec(model=model, tokenizer=tokenizer))
    params = SamplingParams(max_new_tokens=data.max_new_tokens, temperature=0.0, stop=data.stop)
    return evaluate_prompts(engine, data.rows, data.rewards, params)["eval/accuracy"]


def export_model(
    path: str | Path,
    out_dir: str | Path,
    fmt: str,
    *,
    task: str | None = None,
    task_options: dict[str, Any] | None = None,
    eval_size: int = 64,
    int8_min_weights: int = 0,
) -> ExportReport:
    """Export ``path`` (run, checkpoint or model folder) as ``fmt`` into ``out_dir`` (atomic). For
    ``int8``, Linears with fewer than ``int8_min_weights`` weights (in x out) stay float32."""
    if fmt not in FORMATS:
        raise ConfigError(
            f"unknown format '{fmt}'", where="--format", hint=f"use one of {', '.join(FORMATS)}"
        )
    if int8_min_weights < 0 or (int8_min_weights and fmt != "int8"):
        raise ConfigError(
            f"{int8_min_weights} needs --format int8 and a count >= 0",
            where="--int8-min-weights",
        )
    target = resolve_target(path)
    data = _int8_eval_data(target, fmt, task, task_options, eval_size)  # a bad --task before writing
    # An unrelated folder, a file or the source model (or a folder holding it) is refused; an earlier
    # export folder (tandem_export.json) is replaced atomically by atomic_dir.
    check_output_dir(out_dir, "export", sources=(Path(path), target.model_dir), where="--out")
    model, tokenizer = load_causal_lm(target.model_dir).eval(), load_tokenizer(target.model_dir)
    report = ExportReport(fmt, str(target.model_dir), str(out_dir), folder_bytes(target.model_dir), 0)
    from tandem.export.graph import LogitsForward, sample_batch

    batch = sample_batch(tokenizer, ["12+34=" * 4] * 4)
    eager = LogitsForward(model)
    report.latency_eager_ms = _latency_ms(eager, batch)
    if fmt == "hf":
        _save_hf(model, tokenizer, out_dir, str(target.model_dir))
    elif fmt == "onnx":
        from tandem.export.graph import ONNX_FILE, export_onnx

        report.parity_max_abs_diff = export_onnx(model, tokenizer, out_dir, str(target.model_dir))
        report.latency_export_ms = _onnx_latency(Path(out_dir) / ONNX_FILE, batch)
    elif fmt == "torchscript":
        from tandem.export.graph import TS_FILE, export_torchscript

        report.parity_max_abs_diff = export_torchscript(model, tokenizer, out_dir, str(target.model_dir))
        report.latency_export_ms = _latency_ms(torch.jit.load(str(Path(out_dir) / TS_FILE)), batch)
    else:
        names = _int8_names(model, int8_min_weights)
        _export_int8(model, tokenizer, target, out_dir, report, batch, data, names)
    report.size_after = folder_bytes(Path(out_dir))
    return report


def _save_hf(model, tokenizer, out_dir: str | Path, source: str) -> None:
    """An HF export folder (safetensors + tokenizer) with its manifest, written atomically."""
    with atomic_dir(out_dir) as tmp:
        model.save_pretrained(str(tmp), safe_serialization=True)
        tokenizer.save_pretrained(str(tmp))
        (tmp / MANIFEST).write_text(json.dumps({"format": "hf", "source": source}, indent=2) + "\n")


def _int8_names(model, min_weights: int) -> list[str] | None:
    """The Linears to quantise: all (None) without a threshold, else those with ``min_weights`` or more
    weights; ConfigError (before anything is written) when the threshold leaves none."""
    if not min_weights:
        return None
    from tandem.models.int8 import linears_at_least

    names = linears_at_least(model, min_weights)
    if not names:
        largest = max(
            m.in_features * m.out_features for m in model.modules() if isinstance(m, torch.nn.Linear)
        )
        raise ConfigError(
            f"{min_weights} leaves no Linear to quantise (the largest has {largest} weights)",
            where="--int8-min-weights",
            hint="lower it, or export --format hf",
        )
    return names


def _int8_eval_data(
    target, fmt: str, task: str | None, task_options: dict[str, Any] | None, eval_size: int
) -> EvalData | None:
    """The held-out prompts of the INT8 accuracy check (``--task``, else the run's task; None: no
    check), built before anything is written so that a bad ``--task``, ``--task-option`` or
    ``--eval-size`` leaves no export behind. The options belong to that check alone."""
    if fmt != "int8":
        if task is not None or task_options:
            raise ConfigError(
                "--task and --task-option choose the INT8 accuracy check",
                where="--task",
                hint="use --format int8",
            )
        return None
    if task is None and (target.config is None or target.config.data.task is None):
        return None
    if eval_size < 1:
        raise ConfigError(f"{eval_size} prompts: the accuracy check needs at least 1", where="--eval-size")
    return eval_data(target.config, task=task, task_options=task_options, size=eval_size)


def _export_int8(
    model, tokenizer, target, out_dir, report: ExportReport, batch, data: EvalData | None, names
) -> None:
    from tandem.export.int8 import load_int8, quantize_int8, save_int8

    quantized = quantize_int8(model, names)
    save_int8(quantized, tokenizer, out_dir, str(target.model_dir))
    reloaded = load_int8(out_dir)  # measure what will be served, not the in-memory copy
    from tandem.export.graph import LogitsForward

    report.latency_export_ms = _latency_ms(LogitsForward(reloaded), batch)
    with torch.no_grad():
        ids, mask, pos = batch
        report.parity_max_abs_diff = float(
            (LogitsForward(reloaded)(ids, mask, pos) - LogitsForward(model)(ids, mask, pos)).abs().max()
        )
    if data is None:
        return
    report.eval_prompts = len(data.rows)
    report.accuracy_before = _accuracy(model, tokenizer, data)
    report.accuracy_after = _accuracy(reloaded, tokenizer, data)


def _onnx_latency(path: Path, batch: tuple[torch.Tensor, ...]) -> float:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = max(1, torch.get_num_threads())
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    feeds = dict(
        zip(("input_ids", "attention_mask", "position_ids"), (t.numpy() for t in batch), strict=True)
    )
    return _latency_ms(lambda *_: session.run(None, feeds), batch)
