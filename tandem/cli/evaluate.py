"""``tandem eval``, ``tandem abtest`` and ``tandem report``: evaluate, compare and report on checkpoints."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from tandem.cli.app import app, check_json_out, err, out, parse_options, user_errors
from tandem.cli.engines import EngineName, EngineOptions, check_engine, engine_options
from tandem.cli.progress import count_progress
from tandem.errors import ConfigError


def metrics_table(title: str, columns: dict[str, dict[str, float]]) -> Table:
    """One row per metric, one column per model; accuracies and pass@k shown as percentages."""
    table = Table(title=title, header_style="bold")
    table.add_column("metric")
    for name in columns:
        table.add_column(name, justify="right")
    keys = sorted({k for m in columns.values() for k in m})
    for key in keys:
        cells = []
        for m in columns.values():
            v = m.get(key)
            pct = "accuracy" in key or "pass@" in key or key.endswith("clip_ratio") or "/refusal_" in key
            cells.append("-" if v is None else (f"{100 * v:.1f}%" if pct else f"{v:.4g}"))
        table.add_row(key, *cells)
    return table


def write_json(path: Path | None, obj: Any) -> None:
    if path is not None:
        from tandem.utils.io import atomic_write_json

        atomic_write_json(path, obj)


@app.command("eval")
@user_errors
def eval_cmd(
    target: Annotated[
        Path, typer.Argument(help="Run folder, checkpoint folder, HF model folder or INT8 export.")
    ],
    task: Annotated[str | None, typer.Option(help="Built-in task (default: the run's data.task).")] = None,
    task_option: Annotated[list[str] | None, typer.Option(help="Task option KEY=VALUE (repeatable).")] = None,
    eval_file: Annotated[str | None, typer.Option(help="JSONL/Parquet prompts instead of a task.")] = None,
    reward: Annotated[
        str | None,
        typer.Option(help="Reward `module:function` for --eval-file (imported and run: trusted code only)."),
    ] = None,
    ref: Annotated[Path | None, typer.Option(help="Reference model/run/checkpoint for the KL.")] = None,
    size: Annotated[
        int | None, typer.Option(help="Prompts (default: the run's data.eval_size or 200).")
    ] = None,
    samples: Annotated[int, typer.Option(help="Sampled answers per prompt (0 skips sampling).")] = 8,
    temperature: Annotated[float, typer.Option(help="Sampling temperature.")] = 1.0,
    max_new_tokens: Annotated[
        int | None, typer.Option(help="Default: the run's rollout.max_new_tokens.")
    ] = None,
    seed: Annotated[int | None, typer.Option(help="Data and sampling seed (default: the run's).")] = None,
    json_out: Annotated[
        Path | None, typer.Option("--json", help="Write the metrics to this JSON file.")
    ] = None,
    engine: EngineName = None,
    engine_option: EngineOptions = None,
) -> None:
    """Held-out accuracy (greedy and sampled), pass@k, mean reward, lengths, KL to a reference and, for
    tasks with refusals (safety), refusal precision/recall/F1.

    Example: tandem eval runs/quickstart --ref runs/cache/arith-sft --json eval.json
    """
    from tandem.evaluate.runner import run_eval

    check_json_out(json_out)
    check_generation(samples=samples, max_new_tokens=max_new_tokens, size=size, temperature=temperature)
    if engine is not None:
        check_engine(engine)
    with count_progress("eval", err) as on_progress:
        result = run_eval(
            target,
            task=task,
            task_options=parse_options(task_option, "--task-option") if task_option else None,
            eval_file=eval_file,
            reward=reward,
            ref=ref,
            size=size,
            samples=samples,
            temperature=temperature,
            max_new_tokens=max_new_tokens,
            seed=seed,
            engine=engine,
            engine_options=engine_options(engine_option),
            on_progress=on_progress,
        )
    out.print(
        f"evaluated [bold]{escape(result['model'])}[/] on {escape(result['data'])} "
        f"(engine {escape(result['engine'])})"
    )
    out.print(metrics_table("evaluation", {"value": result["metrics"]}))
    write_json(json_out, result)
    if json_out is not None:
        out.print(f"metrics written to [bold]{escape(str(json_out))}[/]")


@app.command("abtest")
@user_errors
def abtest_cmd(
    a: Annotated[Path, typer.Argument(help="Incumbent: run, checkpoint, HF model folder or INT8 export.")],
    b: Annotated[Path, typer.Argument(help="Candidate: run, checkpoint, HF model folder or INT8 export.")],
    judge: Annotated[str, typer.Option(help="verifier | reward-model:PATH | llm:PATH.")] = "verifier",
    task: Annotated[str | None, typer.Option(help="Built-in task (default: A's run data.task).")] = None,
    task_option: Annotated[list[str] | None, typer.Option(help="Task option KEY=VALUE (repeatable).")] = None,
    eval_file: Annotated[str | None, typer.Option(help="JSONL/Parquet prompts instead of a task.")] = None,
    reward: Annotated[
        str | None,
        typer.Option(help="Reward `module:function` for --eval-file (imported and run: trusted code only)."),
    ] = None,
    size: Annotated[
        int | None, typer.Option(help="Prompts (default: the run's data.eval_size or 200).")
    ] = None,
    temperature: Annotated[float, typer.Option(help="Sampling temperature (0 = greedy).")] = 1.0,
    max_new_tokens: Annotated[
        int | None, typer.Option(help="Default: the run's rollout.max_new_tokens.")
    ] = None,
    seed: Annotated[int, typer.Option(help="Prompt, sampling and bootstrap seed.")] = 0,
    alpha: Annotated[float, typer.Option(help="Significance level of the sign test.")] = 0.05,
    min_win_rate: Annotated[float, typer.Option(help="Promote only at or above this win rate.")] = 0.5,
    json_out: Annotated[
        Path | None, typer.Option("--json", help="Write the decision to this JSON file.")
    ] = None,
    engine: EngineName = None,
    engine_option: EngineOptions = None,
) -> None:
    """Paired A/B test of two models on the same prompts; exit 0 = promote B, 1 = keep A.

    Example: tandem abtest runs/base runs/candidate --judge verifier --json decision.json
    """
    from tandem.evaluate.abtest import ABSettings, run_abtest

    if not 0 < alpha < 1 or not 0 <= min_win_rate <= 1:
        raise ConfigError(
            "--alpha must be in (0, 1) and --min-win-rate in [0, 1]", where="--alpha/--min-win-rate"
        )
    check_json_out(json_out)
    check_generation(samples=0, max_new_tokens=max_new_tokens, size=size, temperature=temperature)
    if engine is not None:
        check_engine(engine)
    settings = ABSettings(
        temperature=temperature,
        max_new_tokens=max_new_tokens,
        seed=seed,
        alpha=alpha,
        min_win_rate=min_win_rate,
    )
    with count_progress("abtest", err) as on_progress:
        result = run_abtest(
            a,
            b,
            judge,
            settings,
            task=task,
            task_options=parse_options(task_option, "--task-option") if task_option else None,
            eval_file=eval_file,
            reward=reward,
            size=size,
            engine=engine,
            engine_options=engine_options(engine_option),
            on_progress=on_progress,
        )
    print_decision(result)
    write_json(json_out, result)
    raise typer.Exit(0 if result["decision"]["promote"] else 1)


def check_generation(
    *, samples: int, max_new_tokens: int | None, size: int | None, temperature: float
) -> None:
    """The generation options of ``eval`` / ``abtest``, before any model is loaded."""
    checks = (
        ("--samples", samples >= 0, f"{samples}: must be >= 0 (0 skips sampling)"),
        (
            "--max-new-tokens",
            max_new_tokens is None or max_new_tokens >= 1,
            f"{max_new_tokens}: must be >= 1",
        ),
        ("--size", size is None or size >= 1, f"{size}: must be >= 1 prompt"),
        ("--temperature", math.isfinite(temperature) and temperature >= 0, f"{temperature}: must be >= 0"),
    )
    for flag, ok, why in checks:
        if not ok:
            raise ConfigError(why, where=flag)


def print_decision(result: dict[str, Any]) -> None:
    """Win/tie/loss, win rate with its interval, p-value and the decision."""
    d = result["decision"]
    table = Table(
        title=f"A/B test ({result['judge']} judge, {result['num_prompts']} prompts)", header_style="bold"
    )
    for col in ("B wins", "ties", "A wins", "win rate B", "95% CI", "sign-test p"):
        table.add_column(col, justify="right")
    table.add_row(
        str(d["wins"]),
        str(d["ties"]),
        str(d["losses"]),
        f"{d['win_rate']:.3f}",
        f"[{d['ci_low']:.3f}, {d['ci_high']:.3f}]",
        f"{d['p_value']:.3g}",
    )
    out.print(table)
    verdict = "[bold green]PROMOTE B[/]" if d["promote"] else "[bold yellow]KEEP A[/]"
    out.print(f"{verdict}: {escape(d['reason'])}")


@app.command("report")
@user_errors
def report_cmd(
    run: Annotated[Path, typer.Argument(help="Run folder.")],
    run_b: Annotated[Path | None, typer.Argument(help="Second run folder, shown side by side.")] = None,
    out_dir: Annotated[
        Path | None, typer.Option("--out", help="Report folder (default: RUN/report).")
    ] = None,
) -> None:
    """HTML report (with PNG plots) of a run, or of two runs side by side.

    Example: tandem report runs/grpo runs/dapo
    """
    from tandem.cli.report import print_findings
    from tandem.report import build_report
    from tandem.report.data import load_run

    runs = [run] if run_b is None else [run, run_b]
    path = build_report(runs, out_dir)
    for folder in runs:  # the report's "what the metrics say", also here
        if run_b is not None:
            out.print(f"[bold]{escape(str(folder))}[/]")
        run_data = load_run(folder)  # the rows the report's own table is computed from
        print_findings(out, run_data.rows, run_data.eval_size)
    out.print(f"report written to [bold]{escape(str(path))}[/]")
