"""Print a finished run: before/after held-out metrics as a table, what the metrics say about its learning
(:mod:`tandem.monitor.diagnose`), the run folder, how to look inside."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table


def print_run_result(console: Console, result, eval_size: int | None = None) -> None:
    if result.eval_before or result.eval_after:  # data.eval_size 0 or no held-out data: no table
        _print_eval_table(console, result)
    print_diagnosis(console, result.run_dir, eval_size)
    steps = f"{result.steps} step" + ("" if result.steps == 1 else "s")
    console.print(f"run folder: [bold]{escape(str(result.run_dir))}[/]  ({steps})")
    if result.best:  # checkpoint.best_metric
        b = result.best
        value = f"{100 * b['value']:.1f}%" if b["metric"].endswith("accuracy") else f"{b['value']:.4g}"
        console.print(
            f"best model: [bold]{escape(b['path'])}[/]  ({b['metric']} {value} at step {b['step']})"
        )
    console.print(f"TensorBoard: [bold]tensorboard --logdir {escape(str(result.run_dir))}/tensorboard[/]")


def _print_eval_table(console: Console, result) -> None:
    table = Table(title="held-out evaluation", show_header=True, header_style="bold")
    table.add_column("metric")
    table.add_column("before", justify="right")
    table.add_column("after", justify="right")
    for key in sorted(set(result.eval_before) | set(result.eval_after)):
        b, a = result.eval_before.get(key), result.eval_after.get(key)
        fmt = (lambda v: f"{100 * v:.1f}%") if key.endswith("accuracy") else (lambda v: f"{v:.3f}")
        table.add_row(key, "-" if b is None else fmt(b), "-" if a is None else fmt(a))
    console.print(table)


def print_diagnosis(console: Console, run_dir, eval_size: int | None) -> None:
    """The findings of :func:`tandem.monitor.diagnose.diagnose` on the run's ``metrics.jsonl`` as a table."""
    from tandem.monitor import read_metrics

    print_findings(console, read_metrics(run_dir), eval_size)


def print_findings(console: Console, rows: list, eval_size: int | None) -> None:
    """:func:`tandem.monitor.diagnose.diagnose` of metric ``rows`` as the "what the metrics say" table."""
    from tandem.monitor.diagnose import diagnose

    findings = diagnose(rows, eval_size)
    if not findings:
        return
    table = Table(title="what the metrics say", show_header=True, header_style="bold")
    table.add_column("finding")
    table.add_column("seen")
    table.add_column("try")
    for f in findings:
        table.add_row(f.code, escape(f.message), escape(f.hint) or "-")
    console.print(table)
