"""``tandem export``: HF, ONNX, TorchScript or dynamic-INT8 folders with parity, size and accuracy deltas."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from tandem.cli.app import app, check_json_out, out, parse_options, user_errors


def _fmt(value, unit: str = "", digits: int = 3) -> str:
    return (
        "-"
        if value is None
        else f"{value:.{digits}f}{unit}"
        if isinstance(value, float)
        else f"{value}{unit}"
    )


@app.command("export")
@user_errors
def export_cmd(
    model: Annotated[
        str, typer.Argument(help="Run folder, checkpoint folder or HF model folder (path or fsspec URL).")
    ],
    format: Annotated[str, typer.Option("--format", "-f", help="hf | onnx | torchscript | int8.")] = "hf",
    out_dir: Annotated[
        str | None,
        typer.Option(
            "--out", help="Output folder or fsspec URL, e.g. s3://b/m (default: exports/<name>-<fmt>)."
        ),
    ] = None,
    task: Annotated[
        str | None, typer.Option(help="Task for INT8 held-out accuracy (default: the run's).")
    ] = None,
    task_option: Annotated[
        list[str] | None, typer.Option(help="Task option KEY=VALUE (repeatable), e.g. digits=2.")
    ] = None,
    eval_size: Annotated[int, typer.Option(help="Held-out prompts for the INT8 accuracy check.")] = 64,
    int8_min_weights: Annotated[
        int,
        typer.Option(
            help="INT8: keep Linears with fewer weights (in x out) than this in float32, where dynamic "
            "INT8 is slower than fp32 (below ~65536 on one CPU thread; 0: quantise every Linear)."
        ),
    ] = 0,
    json_out: Annotated[
        Path | None, typer.Option("--json", help="Also write the report as JSON here.")
    ] = None,
) -> None:
    """Export a model; prints size before/after, logits parity (max abs diff), latency and INT8 accuracy.

    Example: tandem export runs/grpo --format int8 --task arith
    """
    from tandem.data.outputs import check_output_dir, output_folder
    from tandem.data.storage import is_remote, local_input
    from tandem.export.api import export_model
    from tandem.utils.io import atomic_write_json

    check_json_out(json_out)
    task_opts = parse_options(task_option, "--task-option") if task_option else None
    name = model.rstrip("/").rsplit("/", 1)[-1] if is_remote(model) else Path(model).resolve().name
    target = out_dir or str(Path("exports") / f"{name}-{format}")
    check_output_dir(target, "export", sources=(model,), where="--out")  # a URL too, before downloading
    status = out.status(f"exporting {escape(model)} as {format} ...")
    with local_input(model) as src, output_folder(target, "export") as local_target, status:  # URLs
        report = export_model(
            src,
            local_target,
            format,
            task=task,
            task_options=task_opts,
            eval_size=eval_size,
            int8_min_weights=int8_min_weights,
        )
    table = Table(title=f"tandem export --format {format}")
    table.add_column("metric")
    table.add_column("source")
    table.add_column("export")
    table.add_column("delta")
    mb = 1 / 2**20
    table.add_row(
        "weights MB",
        _fmt(report.size_before * mb),
        _fmt(report.size_after * mb),
        _fmt((report.size_after - report.size_before) * mb),
    )
    table.add_row(
        "forward latency ms [4x24]",
        _fmt(report.latency_eager_ms, digits=2),
        _fmt(report.latency_export_ms, digits=2),
        "",
    )
    if report.parity_max_abs_diff is not None:
        table.add_row("logits max abs diff", "", f"{report.parity_max_abs_diff:.3g}", "")
    if report.accuracy_before is not None:
        table.add_row(
            f"held-out accuracy (n={report.eval_prompts})",
            _fmt(report.accuracy_before),
            _fmt(report.accuracy_after),
            _fmt(report.accuracy_after - report.accuracy_before),
        )
    elif format == "int8":
        table.add_row("held-out accuracy", "skipped (pass --task NAME)", "", "")
    out.print(table)
    out.print(f"export folder: {escape(str(target))}")
    if json_out is not None:
        atomic_write_json(json_out, report.as_dict())
        out.print(f"report: {escape(str(json_out))}")
