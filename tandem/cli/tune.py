"""``tandem tune``: successive halving over a small grid of overrides, scored on the held-out metric."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Annotated

import typer

from tandem.cli.app import Overrides, app, out, user_errors
from tandem.errors import ConfigError

# The default search space: the learning rate at a third of, at, and at three times the config's own
# (`trainer.lr`; a fixed grid would be far off for a model that trains at 1e-6), and adaptive group size
# (the mechanism that won every paired seed on partly trained outside models; docs/learning.md). A default
# dimension the config cannot take (e.g. adaptive group size with a critic) is left out.
LR_FACTORS = (1 / 3, 1.0, 3.0)
DEFAULT_SPACE = {"algorithm.adaptive_group.enabled": ["false", "true"]}


def default_space(lr: float) -> dict[str, list[str]]:
    """The default grid for a config whose ``trainer.lr`` is ``lr``."""
    return {"trainer.lr": [f"{lr * f:.2e}" for f in LR_FACTORS], **DEFAULT_SPACE}


def parse_space(items: list[str]) -> dict[str, list[str]]:
    """``["trainer.lr=1e-4,3e-4"]`` -> ``{"trainer.lr": ["1e-4", "3e-4"]}``; one line naming a bad item."""
    space: dict[str, list[str]] = {}
    for item in items:
        key, sep, values = item.partition("=")
        vals = [v.strip() for v in values.split(",") if v.strip()]
        if not sep or not key.strip() or not vals:
            raise ConfigError(
                f"--space '{item}' is not KEY=V1,V2,...", hint="e.g. --space trainer.lr=1e-4,3e-4"
            )
        if key.strip() in SWEEP_KEYS or key.strip().startswith("checkpoint."):
            raise ConfigError(
                f"'{key.strip()}' is set by the sweep itself (run lengths, folders, evaluation, checkpoints)",
                where="--space",
                hint="sweep another key; the run length comes from trainer.total_steps and --budget",
            )
        space[key.strip()] = vals
    return space


# keys every trial's run gets from the sweep, which a --space value would be overridden by
SWEEP_KEYS = frozenset(
    {
        "trainer.total_steps",
        "run.output_dir",
        "run.overwrite",
        "run.seed",
        "monitor.eval_every",
        "monitor.progress",
    }
)


def _unusable(config: Path, base: list[str], key: str, values: list[str]) -> str | None:
    """Why the config cannot take one of a default dimension's values (the first error), else None."""
    from tandem.config import load_config

    for value in values:
        try:
            load_config(config, [*base, f"{key}={value}"])
        except ConfigError as exc:
            msg = str(exc).splitlines()[0]
            return msg[msg.find(key) :] if key in msg else msg
    return None


@app.command()
@user_errors
def tune(
    config: Annotated[
        Path, typer.Argument(help="YAML config of the run to tune (its total_steps is the longest run).")
    ],
    overrides: Overrides = None,
    budget: Annotated[int, typer.Option(help="Training steps over all runs together.")] = 300,
    space: Annotated[
        list[str] | None,
        typer.Option(
            help="KEY=V1,V2,... (repeatable); default: trainer.lr at 1/3, 1 and 3 times the config's x "
            "algorithm.adaptive_group.enabled."
        ),
    ] = None,
    eta: Annotated[int, typer.Option(help="Keep 1/eta of the candidates per rung; steps grow eta-fold.")] = 2,
    min_steps: Annotated[int, typer.Option(help="Fewest steps of a first-rung run.")] = 10,
    metric: Annotated[str, typer.Option(help="Held-out metric to maximise.")] = "eval/accuracy",
    confirm: Annotated[
        bool,
        typer.Option(
            "--confirm/--no-confirm",
            help="Train the config as given for the final length too and keep it unless the winner beats "
            "it in a paired sign test (budget is held back for that run). Judged on new test prompts of "
            "the task, none of them held out; a prompt-file config on the half of its held-out file the "
            "sweep did not rank on (on the whole file below 200 distinct prompts), or --confirm-file's.",
        ),
    ] = True,
    alpha: Annotated[float, typer.Option(help="Significance level of the confirmation's sign test.")] = 0.05,
    confirm_seeds: Annotated[
        int,
        typer.Option(
            "--confirm-seeds",
            help="Training seeds per config the confirmation compares: 1 judges the winner's run against "
            "the config's; N also retrains both on run.seed+1..N-1 (2 final-length runs per extra seed) and "
            "pools the pairs' sign test (on fixed prompts: one outcome per prompt, summed over the seeds), "
            "judging the configs rather than one training run each.",
        ),
    ] = 1,
    confirm_file: Annotated[
        Path | None,
        typer.Option(
            "--confirm-file",
            help="JSONL prompts (with the columns the config's reward functions read) the confirmation "
            "judges on instead of the held-out prompts the sweep ranked on: no lean towards the winner.",
        ),
    ] = None,
    out_dir: Annotated[
        Path, typer.Option("--out", help="Folder for the trial runs, tune.jsonl and best.yaml.")
    ] = Path("runs/tune"),
    resume: Annotated[
        bool,
        typer.Option(
            "--resume",
            help="Reuse the finished runs in OUT whose resolved config is the one this sweep would train "
            "(an interrupted sweep goes on where it stopped); the others train as usual.",
        ),
    ] = False,
) -> None:
    """Successive halving on the held-out metric; writes the best config to OUT/best.yaml.

    Every candidate trains a short run; the best 1/eta go on to eta-times longer runs, up to the config's
    trainer.total_steps. With --confirm (the default) a winner that differs from the config as given must
    beat it in a paired sign test on prompts the sweep did not rank on (a task's new test prompts,
    --confirm-file's; a prompt-file config without it: the half of its held-out file the sweep did not
    rank on, where the file has 200 distinct prompts or more), else the config is kept.
    Example: tandem tune configs/quickstart.yaml --budget 600 --space trainer.lr=3e-4,1e-3
    """
    from tandem.cli.progress import step_progress
    from tandem.config import load_config
    from tandem.config.loader import config_to_yaml
    from tandem.data.outputs import check_output_dir
    from tandem.evaluate import confirm as confirmation
    from tandem.monitor.diagnose import noise
    from tandem.monitor.trackers import check_trackers
    from tandem.orchestration.runfolder import run_inputs
    from tandem.orchestration.runner import train as run_train
    from tandem.orchestration.tune import (
        Trial,
        earlier_trials,
        finished_run,
        grid,
        plan_rungs,
        successive_halving,
    )

    if not 0 < alpha < 1:
        raise ConfigError(
            f"--alpha {alpha} is not a significance level", hint="pass 0 < --alpha < 1, e.g. 0.05"
        )
    if confirm_seeds < 1:
        raise ConfigError(f"--confirm-seeds {confirm_seeds} must be at least 1", where="--confirm-seeds")
    base = list(overrides or [])
    cfg = load_config(config, base)
    check_trackers(cfg.monitor.report_to)  # before the sweep writes anything
    check_output_dir(out_dir, "tune", sources=run_inputs(cfg), where="--out")  # an earlier sweep, or new
    if cfg.data.eval_size == 0 or (cfg.data.eval_file is None and cfg.data.task is None):
        where = "data.eval_size" if cfg.data.eval_size == 0 else "data.eval_file"
        raise ConfigError(
            "tuning needs a held-out set",
            where=where,
            hint=f"set {where} (it ranks runs on held-out prompts)",
        )
    grid_space = parse_space(space) if space else default_space(cfg.trainer.lr)
    if not space:
        for key, values in list(grid_space.items()):
            why = _unusable(config, base, key, values)
            if why:
                grid_space.pop(key)
                out.print(f"default space: leaving out {key} ({why})")
    candidates = grid(grid_space)
    for cand in candidates:  # every candidate must be a valid config before anything trains
        load_config(config, [*base, *cand])
    why_not = confirmation.confirm_unsupported(cfg, metric) if confirm else None
    if why_not:
        out.print(f"no confirmation: {why_not}")
    confirming = confirm and why_not is None
    if confirm_file is not None:
        confirmation.check_confirm_file(
            cfg, confirm_file, None if confirming else why_not or "--no-confirm is given"
        )
    reserve = 2 * confirm_seeds - 1 if confirming else 0  # the config's run, then both per extra seed
    rungs = plan_rungs(len(candidates), cfg.trainer.total_steps, budget, eta, min_steps, reserve)
    ranking: list[str] = []  # the held-out half the sweep ranks on, where the file is split
    confirm_on = None
    if confirming and confirm_file is None and cfg.data.task is None:
        split = confirmation.split_held_out(cfg, out_dir, cfg.run.seed)
        if isinstance(split, str):
            out.print(f"confirmation on the prompts the sweep ranks on: {split} (--confirm-file sets others)")
        else:
            ranking, confirm_file = [f"data.eval_file={split.rank}"], split.confirm
            confirm_on = f"held-out prompts of {cfg.data.eval_file} the sweep did not rank on"
            out.print(
                f"{cfg.data.eval_file} split: {split.ranked} rows rank the sweep, "
                f"{split.confirming} confirm its winner"
            )
    stale = [] if resume else earlier_trials(out_dir)
    if stale:  # a new sweep replaces the earlier one's runs; none of them would be read back
        out.print(f"replacing the earlier sweep in {out_dir}: {len(stale)} trial runs (--resume reuses them)")
        for folder in stale:
            shutil.rmtree(folder)
    out_dir.mkdir(parents=True, exist_ok=True)
    log_path = out_dir / "tune.jsonl"
    log_path.write_text("")
    out.print(f"{len(candidates)} candidates; rungs (candidates x steps): {rungs}")
    top = rungs[-1][1]

    def run_dir(cand: list[str], steps: int, extra_seed: int = 0) -> Path:
        name = f"{steps:05d}-{'_'.join(c.split('=', 1)[1] for c in cand) or 'config'}"
        return out_dir / (f"{name}-s{extra_seed}" if extra_seed else name)

    def run(cand: list[str], steps: int, extra_seed: int = 0) -> float | None:
        keep = confirming and steps == top  # the final models are compared when confirming
        folder = run_dir(cand, steps, extra_seed)
        seeded = [f"run.seed={cfg.run.seed + extra_seed}"] if extra_seed else []
        # a tracker (monitor.report_to) shows the sweep's runs as one group, each named by its folder
        tracked = [f"run.name={folder.name}"] if cfg.monitor.report_to else []
        if cfg.monitor.report_to and cfg.monitor.group is None:
            tracked.append(f"monitor.group={out_dir.name}")
        run_cfg = load_config(
            config,
            [
                *base,
                *cand,
                *seeded,
                *tracked,
                *ranking,
                f"trainer.total_steps={steps}",
                f"run.output_dir={folder}",
                "run.overwrite=true",
                "monitor.progress=false",
                "monitor.tensorboard=false",
                f"monitor.eval_every={steps}",
                "checkpoint.every=0",
                f"checkpoint.save_final={str(keep).lower()}",
            ],
        )
        reused = finished_run(folder, config_to_yaml(run_cfg)) if resume else None
        if reused is not None:
            out.print(f"  reused {folder}")
        evaluated = reused if reused is not None else run_train(run_cfg).eval_after
        if evaluated.get("eval/num_prompts"):
            done["prompts"] = int(evaluated["eval/num_prompts"])
        value = evaluated.get(metric)
        return None if value is None else float(value)

    planned = sum(k * s for k, s in rungs)
    done = {"steps": 0, "best": -math.inf, "prompts": 0}  # prompts: what each run's evaluation counted

    def record(trial: Trial, steps: int, seed: int | None = None) -> None:
        value = trial.scores[steps]
        done["steps"] += steps
        if value is not None and not math.isnan(value):
            done["best"] = max(done["best"], value)
        on_step(done["steps"], {metric: done["best"]} if done["best"] > -math.inf else {})
        shown = "n/a" if value is None else f"{value:.4f}"
        n = done["prompts"]
        if value is not None and n and metric.endswith("accuracy"):  # what one evaluation can tell apart
            shown += f" (±{noise(value, n):.3f} noise on {n} prompts)"
        out.print(f"  steps {steps:>5}  {metric} {shown}  {' '.join(trial.overrides)}")
        with log_path.open("a") as fh:
            fh.write(
                json.dumps(
                    {"trial": trial.index, "overrides": trial.overrides, "steps": steps, metric: value}
                    | ({"num_prompts": n} if n else {})
                    | ({} if seed is None else {"seed": seed})
                )
                + "\n"
            )

    # one bar over the whole sweep: training steps of the plan, ETA, the best metric so far
    with step_progress(f"tune ({len(candidates)} candidates)", planned, key=metric) as on_step:
        winner, _ = successive_halving(candidates, rungs, run, record)
        if winner.last() == -math.inf:
            raise ConfigError(
                f"no run reported {metric}", where="--metric", hint="check the config's held-out data"
            )
        chosen, score = winner.overrides, winner.last()
        best = load_config(config, [*base, *chosen])
        if confirming and config_to_yaml(best) != config_to_yaml(cfg):
            # the config as given at the final length, then both configs on each extra seed
            on_step(done["steps"], {}, total=planned + reserve * top)
            incumbent = Trial(-1, [])
            incumbent.scores[top] = run([], top)
            record(incumbent, top)
            pairs = [(run_dir([], top), run_dir(chosen, top))]
            for k in range(1, confirm_seeds):
                for index, cand in ((-1, []), (winner.index, chosen)):
                    again = Trial(index, cand)
                    again.scores[top] = run(cand, top, k)
                    record(again, top, seed=cfg.run.seed + k)
                pairs.append((run_dir([], top, k), run_dir(chosen, top, k)))
            verdict = confirmation.confirm_winner(pairs, alpha, cfg.run.seed, confirm_file, confirm_on)
            with log_path.open("a") as fh:
                fh.write(json.dumps({"confirm": verdict, "overrides": chosen}) + "\n")
            out.print(f"confirmation: {' '.join(chosen)} {confirmation.verdict_line(verdict)}")
            if not verdict["promote"]:
                chosen, score, best = [], incumbent.last(), cfg
    (out_dir / "best.yaml").write_text(config_to_yaml(best))
    shown = " ".join(chosen) or "the config as given"
    out.print(f"best: {shown} ({metric} {score:.4f}) -> {out_dir / 'best.yaml'}")
