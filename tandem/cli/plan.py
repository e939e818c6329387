"""``tandem plan``: predict colocated vs decoupled layouts for a cluster, or check the model on a run."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from tandem.cli.app import app, out, user_errors
from tandem.errors import ConfigError

_SUFFIX = {"": 1.0, "k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12}


def parse_amount(text: str, flag: str, *, binary: bool = False) -> float:
    """``7e9``, ``7B``, ``1.5b``, ``8k`` → a number; ``binary`` makes k = 1024 (token lengths)."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([kmbgt]?)\s*", text.lower())
    if m is None:
        raise ConfigError(f"expected a number like 7e9, 7B or 8k, got {text!r}", where=flag)
    scale = 1024.0 if binary and m.group(2) == "k" else _SUFFIX[m.group(2)]
    value = float(m.group(1)) * scale
    if value <= 0:
        raise ConfigError(f"must be positive, got {text!r}", where=flag)
    return value


def _etas(text: str) -> list[int]:
    try:
        etas = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise ConfigError(f"expected comma-separated integers, got {text!r}", where="--etas") from None
    if not etas or min(etas) < 0:
        raise ConfigError(f"expected integers >= 0, got {text!r}", where="--etas")
    return etas


def _check_groups(samples_per_step: int, group_size: int) -> None:
    """Refuse a step that is not whole groups: GRPO-style training samples ``group_size`` completions per
    prompt, so a step of fewer (or of a remainder) is not a batch any run could have and its plan is wrong.
    """
    if samples_per_step < group_size:
        raise ConfigError(
            f"{samples_per_step} is less than one group of --group-size {group_size}",
            where="--samples-per-step",
            hint="use a multiple of --group-size",
        )
    if samples_per_step % group_size != 0:
        raise ConfigError(
            f"{samples_per_step} is not a multiple of --group-size {group_size}",
            where="--samples-per-step",
            hint=f"e.g. {samples_per_step // group_size * group_size} or "
            f"{(samples_per_step // group_size + 1) * group_size}",
        )


INTERFERENCE_KINDS = ("generate", "update")


def parse_interference(text: str) -> dict[str, float]:
    """``generate=1.2,update=1.1`` → ``{"generate": 1.2, "update": 1.1}``: a co-run slowdown per phase kind."""
    factors: dict[str, float] = {}
    for item in (x.strip() for x in text.split(",")):
        kind, eq, value = item.partition("=")
        kind = kind.strip()
        if not eq or kind not in INTERFERENCE_KINDS:
            raise ConfigError(
                f"expected KIND=FACTOR with KIND one of {', '.join(INTERFERENCE_KINDS)}, got {item!r}",
                where="--interference",
            )
        try:
            factor = float(value)
        except ValueError:
            factor = math.nan
        if not (math.isfinite(factor) and factor > 0):
            raise ConfigError(f"{kind}: expected a factor > 0, got {value.strip()!r}", where="--interference")
        if kind in factors:
            raise ConfigError(f"{kind} given twice", where="--interference")
        factors[kind] = factor
    return factors


@app.command("plan")
@user_errors
def plan_cmd(
    calibrate: Annotated[
        Path | None,
        typer.Option(help="Run folder: fit its phase times, print predicted vs measured step time."),
    ] = None,
    model_params: Annotated[str | None, typer.Option(help="Policy size, e.g. 7e9 or 7B.")] = None,
    gpus: Annotated[int, typer.Option(help="Devices in the cluster.", min=1)] = 8,
    gpu: Annotated[str, typer.Option(help="Device kind: cpu-core, a100, h100, h200, b200.")] = "h100",
    completion_len: Annotated[str, typer.Option(help="Generation budget (max new tokens), e.g. 8k.")] = "2k",
    mean_len: Annotated[
        str | None, typer.Option(help="Mean completion length (default: half the budget).")
    ] = None,
    length_cv: Annotated[float, typer.Option(help="Spread of completion lengths (std / mean).", min=0)] = 0.6,
    prompt_len: Annotated[str, typer.Option(help="Prompt tokens.")] = "512",
    samples_per_step: Annotated[int, typer.Option(help="Completions per step (prompts × n).", min=1)] = 512,
    group_size: Annotated[int, typer.Option(help="Completions per prompt.", min=1)] = 8,
    epochs: Annotated[int, typer.Option(help="Optimiser passes over each batch.", min=1)] = 1,
    reference: Annotated[bool, typer.Option(help="A KL reference model scores each batch (β > 0).")] = False,
    etas: Annotated[str, typer.Option(help="Staleness bounds to try, comma-separated.")] = "0,1,2,4",
    streaming: Annotated[
        bool,
        typer.Option(help="Model partial rollouts (engines never drain between steps; AReaL-style)."),
    ] = False,
    top: Annotated[int, typer.Option(help="Rows of the table.", min=1)] = 15,
    plot: Annotated[Path | None, typer.Option(help="Write a chart (.svg, .png with matplotlib).")] = None,
    cores: Annotated[
        float | None,
        typer.Option(
            help="With --calibrate on a colocated run: the other layouts' processes share this many cores.",
            min=0.01,
        ),
    ] = None,
    background: Annotated[
        float | None,
        typer.Option(
            help="With --cores: runnable threads of other jobs (default: what explains the run's share of "
            "the cores, from its cpu/<phase> times; else its sampled background, else 0).",
            min=0,
        ),
    ] = None,
    interference: Annotated[
        str | None,
        typer.Option(
            help="With --cores: co-run slowdown per phase kind beyond fair sharing, e.g. generate=1.2,update=1.1 "
            "(measure it with bench/plan_interference.py; default 1.0).",
        ),
    ] = None,
) -> None:
    """Predict step time, samples/s, utilisation and policy lag of colocated and decoupled layouts.

    Examples: tandem plan --model-params 7e9 --gpus 64 --gpu h100 --completion-len 8k ·
    tandem plan --calibrate runs/quickstart
    """
    if calibrate is not None:
        if model_params is not None:
            raise ConfigError("give either --calibrate or --model-params, not both", where="--calibrate")
        factors = parse_interference(interference) if interference is not None else {}
        if (factors or background is not None) and cores is None:
            flag = "--interference" if factors else "--background"
            raise ConfigError(f"{flag} needs --cores (the processes share a pool of cores)", where=flag)
        _calibrate(calibrate, cores=cores, background=background, interference=factors)
        return
    for flag, value in (("--cores", cores), ("--background", background), ("--interference", interference)):
        if value is not None:
            raise ConfigError(f"{flag} applies to --calibrate only", where=flag)
    if model_params is None:
        raise ConfigError("nothing to plan", where="--model-params", hint="or --calibrate RUN_DIR")
    _check_groups(samples_per_step, group_size)
    if plot is not None:  # an unwritable chart path fails here in one line, not after the planning
        from tandem.data.outputs import check_output_file

        check_output_file(plot, where="--plot")
    from tandem.plan.cost import Efficiency, LengthDist, ModelShape, Workload
    from tandem.plan.devices import get_device
    from tandem.plan.layouts import candidates, recommend

    device = get_device(gpu)
    budget = int(parse_amount(completion_len, "--completion-len", binary=True))
    mean = parse_amount(mean_len, "--mean-len", binary=True) if mean_len else budget / 2
    if mean > budget:
        raise ConfigError(f"mean length {mean:g} exceeds the budget {budget}", where="--mean-len")
    w = Workload(
        model=ModelShape.from_params(parse_amount(model_params, "--model-params")),
        prompt_len=int(parse_amount(prompt_len, "--prompt-len", binary=True)),
        completion=LengthDist(mean=mean, max_len=budget, cv=length_cv),
        samples_per_step=samples_per_step,
        group_size=group_size,
        update_epochs=epochs,
        reference=reference,
    )
    cands = candidates(w, device, gpus, eff=Efficiency(), etas=_etas(etas), streaming=streaming)
    rec = recommend(cands)
    if rec is None:
        raise ConfigError(
            f"no layout fits: a {w.model.params:.3g}-parameter policy needs more than {gpus} {device.name}",
            where="--gpus",
        )
    table = Table(
        title=f"{w.model.params / 1e9:.3g}B params · {gpus} × {device.name} · {samples_per_step} samples/step · "
        f"completions mean {w.completion.capped_mean:.0f}, max {budget} tokens",
        header_style="bold",
    )
    for col in (
        "layout",
        "workers",
        "step s",
        "samples/s",
        "× colocated",
        "rollout busy",
        "train busy",
        "lag",
    ):
        table.add_column(col, justify="left" if col == "layout" else "right")
    base = rec.baseline.result.samples_per_s
    shown = cands[:top] + [c for c in cands[top:] if c is rec.baseline or c is rec.best]  # always both
    for c in shown:
        r = c.result
        mark = " *" if c is rec.best else ""
        table.add_row(
            escape(c.name) + mark,
            str(c.layout.workers) if c.layout.mode == "decoupled" else "-",
            f"{r.step_s:.1f}",
            f"{r.samples_per_s:.2f}",
            f"{r.samples_per_s / base:.2f}",
            f"{r.rollout_util:.0%}",
            f"{r.learner_util:.0%}",
            f"{r.mean_lag:.2f}",
        )
    out.print(table)
    p = rec.baseline.phases
    out.print(
        f"colocated step phases (s): generate {p.generate:.1f} · log-prob {p.logprob:.1f} · update "
        f"{p.update:.1f} · switch {p.weight_sync:.1f}"
    )
    out.print(f"[bold]recommended:[/] {escape(rec.best.name)} ({rec.speedup:.2f}× colocated samples/s)")
    for reason in rec.reasons:
        out.print(f"  - {escape(reason)}")
    out.print("  settings: " + escape(" ".join(rec.settings)))
    if plot is not None:
        from tandem.plan.plot import plot_candidates

        out.print(f"plot: {plot_candidates(shown, plot, best=rec.best)}")


def _calibrate(
    run_dir: Path, *, cores: float | None, background: float | None, interference: dict[str, float]
) -> None:
    from tandem.plan.calibrate import check, read_run
    from tandem.plan.sharing import CorePool
    from tandem.plan.simulate import Layout, simulate

    run = read_run(run_dir)
    pool, phases, basis = None, run.phases, "wall"
    if cores is not None:
        if run.layout.mode != "colocated":
            raise ConfigError(
                "--cores needs a colocated run (its phases computed alone, without contention)",
                where="--cores",
            )
        threads = run.layout.learner_threads
        if run.cpu is not None:  # CPU seconds: each phase's time on cores of its own, whatever the load
            if background is None:
                background = run.load_background(cores)
            phases, basis = run.cpu.phases, "cpu"
            pool = CorePool(
                cores,
                background=background,
                reference_threads=threads,
                reference_background=0.0,
                interference=interference,
            )
        else:
            if background is None:
                background = run.background or 0.0
            pool = CorePool(
                cores,
                background=background,
                reference_threads=threads,
                reference_background=run.background,
                interference=interference,
            )
    res = check(run)
    p = run.phases
    table = Table(title=f"phases fitted from {escape(str(run_dir))} ({run.steps_used} steady steps)")
    table.add_column("phase")
    table.add_column("mean s", justify="right")
    if run.cpu is not None:
        table.add_column("cpu s per thread", justify="right")
    for name in ("generate", "reward", "logprob", "update", "weight_sync", "weight_load", "overhead"):
        cells = [f"{getattr(p, name):.4f}"]
        if run.cpu is not None:
            cells.append(f"{getattr(run.cpu.phases, name):.4f}")
        table.add_row(name, *cells)
    out.print(table)
    if run.cpu is not None:
        out.print(
            f"share of a core per thread (cpu / wall): rollout {run.cpu.rollout_share:.0%}, learner "
            f"{run.cpu.learner_share:.0%}"
        )
    out.print(
        f"throughput: generate {run.gen_tokens_per_s:.0f} completion tokens/s · update "
        f"{run.train_tokens_per_s:.0f} tokens/s · variation rollout {p.rollout_cv:.0%}, learner {p.learn_cv:.0%}"
    )
    lag = ", ".join(f"{k}: {v:.2f}" for k, v in run.measured_lag.items())
    plag = ", ".join(f"{k}: {v:.2f}" for k, v in res.predicted.lag.items())
    out.print(
        f"[bold]{escape(run.layout.describe())}[/]: measured {run.measured_step_s:.3f} s/step, predicted "
        f"{res.predicted.step_s:.3f} s/step ({res.error:+.1%}); lag measured {lag} · predicted {plag}"
    )
    if pool is None:
        title = "the same phases in other layouts (each side on cores of its own)"
    else:
        title = (
            f"the same {'CPU seconds' if basis == 'cpu' else 'phases'} in other layouts, the processes sharing "
            f"{cores:g} cores (background {background:.2f} runnable threads"
            + "".join(f", {k} ×{v:g} side by side" for k, v in interference.items())
            + ")"
        )
    other = Table(title=title)
    for col in ("layout", "step s", "samples/s", "learner idle", "mean lag"):
        other.add_column(col, justify="left" if col == "layout" else "right")
    layouts = [Layout()] + [
        Layout(mode="decoupled", staleness=eta, workers=n) for n in (1, 2) for eta in (0, 1, 2)
    ]
    for layout in layouts:
        r = simulate(phases, layout, samples_per_step=run.samples_per_step, steps=400, pool=pool)
        other.add_row(
            layout.describe(),
            f"{r.step_s:.3f}",
            f"{r.samples_per_s:.1f}",
            f"{r.learner_idle:.0%}",
            f"{r.mean_lag:.2f}",
        )
    out.print(other)
