"""Fit per-phase times and throughputs from a run folder's timing metrics, and predict its step time.

A run logs one ``metrics.jsonl`` row per step with ``timing/<phase>`` seconds (``timing/generate`` and
``timing/reward`` are the rollout worker's in a decoupled run), ``timing/step`` (the learner's step,
including its wait for data), ``idle/learner_ratio`` and ``worker/sync_s`` (decoupled), and the wall
``time`` the row was written. :func:`read_run` turns the steady steps (the first ``skip`` left out: process
start-up, first compilation) into :class:`~tandem.plan.cost.PhaseTimes` — the learner's untimed work
(advantages, metrics, reading the channel) joins ``update``, the time between steps outside ``timing/step``
(logging) is ``overhead`` — and the measured wall time per step. The simulator then predicts the step time
of the run's own layout, or of another layout on the same machine.

:func:`cross_check` predicts one run from *another* run's phases — the decoupled layouts from a colocated
run, whose phases each computed alone — optionally with the processes sharing a pool of cores
(:mod:`tandem.plan.sharing`). A run folder may hold ``machine.jsonl``: samples of the machine's runnable
threads (``runnable``, less the sampler) and the run's own (``own``) while it trained, as
``bench/plan_validate.py`` writes them; their difference over the steady steps is the run's
``background`` (other jobs' runnable threads), which the shared-core prediction uses.

Runs also log each phase's process CPU seconds (``cpu/<phase>``; a decoupled worker's as
``worker/cpu/<phase>``). :func:`fit_cpu` turns them into the phases' CPU seconds per thread — how long each
would take with its threads on cores of their own, whatever else ran on the machine — and the share of a
core each side's threads got (:class:`CpuTimes`). :func:`cross_check_cpu` predicts a layout from those
CPU seconds under a stated load: ``cores`` shared with ``background`` runnable threads of other jobs (by
default the background that explains the source run's own share of a core, :func:`background_for_share`).
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from tandem.errors import ConfigError, DataError
from tandem.plan.cost import PhaseTimes
from tandem.plan.sharing import CorePool
from tandem.plan.simulate import Layout, SimResult, simulate


@dataclass(frozen=True)
class RunTimings:
    """What a run measured, reduced to the simulator's inputs and the figure to check against."""

    run_dir: str
    layout: Layout
    samples_per_step: int
    steps_used: int
    phases: PhaseTimes
    measured_step_s: float  # mean wall time per step (row-to-row)
    gen_tokens_per_s: float  # completion tokens per second of generate
    train_tokens_per_s: float  # tokens per second of update (as the learner logs it)
    measured_lag: dict[int, float]
    background: float | None = None  # other jobs' runnable threads over the steady steps (machine.jsonl)
    cpu: CpuTimes | None = None  # the phases in CPU seconds (runs that log cpu/<phase>)

    def load_background(self, cores: float) -> float | None:
        """Other jobs' runnable threads while this run trained: the background under which this run's CPU
        seconds, simulated in its own layout on ``cores`` shared cores, get the share of a core its threads
        measured (:func:`background_for_share`; the share is per phase, CPU over wall seconds: the run's
        step time is not used). None without CPU times."""
        if self.cpu is None:
            return None
        return background_for_share(
            self.cpu.phases, self.layout, self.cpu.share, cores, samples_per_step=self.samples_per_step
        )


@dataclass(frozen=True)
class CpuTimes:
    """A run's phases in CPU seconds per thread (each phase's time with its threads on cores of their own)
    and the share of a core each side's threads got while timed (CPU over wall seconds per thread)."""

    phases: PhaseTimes
    rollout_share: float
    learner_share: float
    share: float  # over every timed phase of both sides


@dataclass(frozen=True)
class Check:
    """Predicted against measured step time of one run."""

    run: RunTimings
    predicted: SimResult

    @property
    def error(self) -> float:
        """Relative error of the predicted step time."""
        return self.predicted.step_s / self.run.measured_step_s - 1.0


def _rows(path: Path) -> list[dict[str, Any]]:
    rows = []
    for lineno, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as exc:
            raise DataError(f"not JSON ({exc.msg})", where=f"{path}:{lineno}") from None
    return rows


def _get(cfg: dict[str, Any], dotted: str, default: Any) -> Any:
    node: Any = cfg
    for key in dotted.split("."):
        if not isinstance(node, dict) or key not in node:
            return default
        node = node[key]
    return node


def _mean(values: list[float]) -> float:
    return statistics.fmean(values) if values else 0.0


def _cv(values: list[float]) -> float:
    m = _mean(values)
    return statistics.pstdev(values) / m if len(values) > 1 and m > 0 else 0.0


def read_run(run_dir: str | Path, *, skip: int = 3) -> RunTimings:
    """Fit a run folder's steady steps (see the module docstring); one-line errors for a folder that is
    not a run or has too few timed steps."""
    root = Path(run_dir)
    cfg_path, metrics_path = root / "config.yaml", root / "metrics.jsonl"
    for p in (cfg_path, metrics_path):
        if not p.is_file():
            raise ConfigError(f"{p.name} not found: not a run folder", where=str(root))
    try:
        cfg = yaml.safe_load(cfg_path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"unreadable YAML ({first_problem(exc)})", where=str(cfg_path)) from None
    rows = [r for r in _rows(metrics_path) if "timing/step" in r and "time" in r]
    if len(rows) < skip + 3:
        raise DataError(
            f"{len(rows)} timed steps; calibration needs at least {skip + 3} (the first {skip} are start-up)",
            where=str(metrics_path),
        )
    prev, rows = rows[skip - 1] if skip > 0 else None, rows[skip:]
    mode = _get(cfg, "architecture.mode", "colocated")
    layout = Layout(
        mode=mode,
        workers=int(_get(cfg, "architecture.num_workers", 1)),
        staleness=int(_get(cfg, "architecture.staleness", 0)),
        in_flight=_get(cfg, "architecture.weight_sync", "between_generations") == "in_flight",
        learner_threads=int(_get(cfg, "architecture.learner.threads", 1)),
        worker_threads=int(_get(cfg, "architecture.worker.threads", 1)),
    )
    samples = int(_get(cfg, "data.prompts_per_step", 0)) * int(_get(cfg, "rollout.n", 1))

    times = [float(r["time"]) for r in rows]
    if prev is not None:
        times.insert(0, float(prev["time"]))
    steps_used = len(times) - 1
    measured = (times[-1] - times[0]) / max(1, steps_used)
    phases = fit_phases(rows, mode, wall_step_s=measured)

    def col(key: str) -> list[float]:
        return [float(r.get(key, 0.0)) for r in rows]

    lengths = col("response/length_mean")
    gen_tps = samples * _mean(lengths) / phases.generate if phases.generate > 0 else math.nan
    last = rows[-1]
    lag = {
        int(k.removeprefix("staleness/lag_")): float(v)
        for k, v in last.items()
        if k.startswith("staleness/lag_")
    } or {0: 1.0}
    machine_rows = _rows(root / "machine.jsonl") if (root / "machine.jsonl").is_file() else []
    background = mean_background(machine_rows, times[0], times[-1])
    cpu = fit_cpu(rows, layout, phases)
    return RunTimings(
        run_dir=str(root),
        layout=layout,
        samples_per_step=samples,
        steps_used=steps_used,
        phases=phases,
        measured_step_s=measured,
        gen_tokens_per_s=gen_tps,
        train_tokens_per_s=_mean(col("perf/train_tokens_per_s")),
        measured_lag=dict(sorted(lag.items())),
        background=background,
        cpu=cpu,
    )


def mean_background(samples: list[dict[str, Any]], start: float, end: float) -> float | None:
    """Mean runnable threads of other jobs (``runnable - own``, at least 0) over the samples taken in
    ``[start, end]``; None when none was."""
    inside = [
        max(0.0, float(r["runnable"]) - float(r["own"])) for r in samples if start <= float(r["time"]) <= end
    ]
    return statistics.fmean(inside) if inside else None


def fit_phases(rows: list[dict[str, Any]], mode: str, *, wall_step_s: float | None = None) -> PhaseTimes:
    """Phase means (and variation) of metric rows. The learner's untimed work joins ``update``: in a
    decoupled run that is the step less its wait for data (``idle/learner_ratio``) less the timed learner
    phases; colocated, the step less every timed phase. ``overhead`` is ``wall_step_s`` (wall time per
    step, row to row) less the mean ``timing/step``, 0 when not given."""

    def col(key: str) -> list[float]:
        return [float(r.get(key, 0.0)) for r in rows]

    gen, rew = col("timing/generate"), col("timing/reward")
    logprob, update, sync = col("timing/logprob"), col("timing/update"), col("timing/weight_sync")
    step = col("timing/step")
    if mode == "decoupled":
        busy = [s * (1.0 - float(r.get("idle/learner_ratio", 0.0))) for s, r in zip(step, rows, strict=True)]
        residual = [b - lp - u - sy for b, lp, u, sy in zip(busy, logprob, update, sync, strict=True)]
    else:
        residual = [
            s - g - rw - lp - u - sy
            for s, g, rw, lp, u, sy in zip(step, gen, rew, logprob, update, sync, strict=True)
        ]
    learn = [lp + u + max(0.0, r) for lp, u, r in zip(logprob, update, residual, strict=True)]
    return PhaseTimes(
        generate=_mean(gen),
        reward=_mean(rew),
        logprob=_mean(logprob),
        update=_mean(update) + max(0.0, _mean(residual)),
        weight_sync=_mean(sync),
        weight_load=_mean(col("worker/sync_s")) if mode == "decoupled" else 0.0,
        overhead=max(0.0, wall_step_s - _mean(step)) if wall_step_s is not None else 0.0,
        rollout_cv=_cv([g + r for g, r in zip(gen, rew, strict=True)]),
        learn_cv=_cv(learn),
    )


def fit_cpu(rows: list[dict[str, Any]], layout: Layout, wall: PhaseTimes) -> CpuTimes | None:
    """The phases of :func:`fit_phases` (``wall``) in CPU seconds per thread, from the rows' ``cpu/<phase>``
    (a decoupled worker's ``worker/cpu/<phase>``); None for a run that did not log them. The untimed
    learner work and ``overhead`` get the learner's measured share; the variation stays the wall time's."""
    if not rows or not all("cpu/update" in r for r in rows):
        return None

    def total(key: str) -> float:
        return sum(float(r.get(key, 0.0)) for r in rows)

    n, lt = len(rows), layout.learner_threads
    decoupled = layout.mode == "decoupled"
    wt = layout.worker_threads if decoupled else lt  # colocated: one process does both sides
    rollout = "worker/cpu/" if decoupled else "cpu/"
    if decoupled and not all("worker/cpu/generate" in r for r in rows):
        return None
    roll_cpu = total(rollout + "generate") + total(rollout + "reward")
    roll_wall = total("timing/generate") + total("timing/reward")
    learn_keys = ("logprob", "update", "weight_sync")
    learn_cpu = sum(total("cpu/" + k) for k in learn_keys)
    learn_wall = sum(total("timing/" + k) for k in learn_keys)
    if roll_wall <= 0 or learn_wall <= 0:
        return None
    rshare, lshare = roll_cpu / roll_wall / wt, learn_cpu / learn_wall / lt
    untimed = wall.update - total("timing/update") / n  # the learner's untimed work (wall seconds)
    load = total("worker/cpu/weight_sync") / n / wt if decoupled else 0.0
    phases = replace(
        wall,
        generate=total(rollout + "generate") / n / wt,
        reward=total(rollout + "reward") / n / wt,
        logprob=total("cpu/logprob") / n / lt,
        update=total("cpu/update") / n / lt + max(0.0, untimed) * lshare,
        weight_sync=total("cpu/weight_sync") / n / lt,
        weight_load=load,
        overhead=wall.overhead * lshare,
    )
    share = (roll_cpu + learn_cpu) / (roll_wall * wt + learn_wall * lt)
    return CpuTimes(phases, rollout_share=rshare, learner_share=lshare, share=share)


def first_problem(exc: yaml.YAMLError) -> str:
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or type(exc).__name__
    return f"{problem} at line {mark.line + 1}" if mark is not None else str(problem)


def check(run: RunTimings, *, layout: Layout | None = None, steps: int = 400, seed: int = 0) -> Check:
    """Simulate the run's fitted phases in its own layout (or ``layout``) and compare the step time."""
    predicted = simulate(
        run.phases, layout or run.layout, samples_per_step=run.samples_per_step, steps=steps, seed=seed
    )
    return Check(run, predicted)


def cross_check(
    source: RunTimings, target: RunTimings, *, pool: CorePool | None, steps: int = 400, seed: int = 0
) -> Check:
    """Predict ``target``'s step time from ``source``'s phases in ``target``'s layout. ``source`` must be
    colocated: its phases each computed alone, which is what the simulator's speeds are relative to. With
    ``pool`` the processes share its cores; each run's measured background (when sampled) replaces the
    pool's, ``source``'s at calibration and ``target``'s at prediction."""
    if source.layout.mode != "colocated":
        raise ValueError(f"cross-prediction needs a colocated source run, got {source.layout.describe()}")
    if pool is not None:
        pool = replace(
            pool,
            background=pool.background if target.background is None else target.background,
            reference_background=source.background,
            reference_threads=source.layout.learner_threads,
        )
    return _predict(source.phases, target, pool, steps=steps, seed=seed)


def cross_check_cpu(
    source: RunTimings,
    target: RunTimings,
    *,
    cores: float,
    background: float | None = None,
    interference: dict[str, float] | None = None,
    steps: int = 400,
    seed: int = 0,
) -> Check:
    """Predict ``target``'s step time from ``source``'s CPU seconds per phase (:func:`fit_cpu`), every
    phase slowed to its fair share of ``cores`` beside ``background`` runnable threads of other jobs (None:
    the background that explains ``source``'s own share of the cores) and by ``interference`` while the
    run's phases overlap. ``source`` must be a colocated run that logged ``cpu/<phase>``."""
    if source.layout.mode != "colocated":
        raise ValueError(f"cross-prediction needs a colocated source run, got {source.layout.describe()}")
    if source.cpu is None:
        raise ValueError(f"{source.run_dir} logged no cpu/<phase> times")
    threads = source.layout.learner_threads
    bg = source.load_background(cores) if background is None else background
    pool = CorePool(
        cores,
        background=bg,
        reference_threads=threads,
        reference_background=0.0,  # CPU seconds: the time with the threads on cores of their own
        interference=interference or {},
    )
    return _predict(source.cpu.phases, target, pool, steps=steps, seed=seed)


def _predict(
    phases: PhaseTimes, target: RunTimings, pool: CorePool | None, *, steps: int, seed: int
) -> Check:
    """``target``'s layout simulated from ``phases`` under ``pool``, beside its measured step time."""
    predicted = simulate(
        phases, target.layout, samples_per_step=target.samples_per_step, steps=steps, seed=seed, pool=pool
    )
    return Check(target, predicted)


def simulated_share(
    cpu: PhaseTimes, layout: Layout, pool: CorePool, *, samples_per_step: int, steps: int = 200
) -> float:
    """The share of a core per busy thread that phases of ``cpu`` CPU seconds per thread get in
    ``layout`` under ``pool``: their work over their busy thread-seconds, simulated."""
    wt = layout.worker_threads if layout.mode == "decoupled" else layout.learner_threads
    lt = layout.learner_threads
    work = cpu.rollout_s * wt + (cpu.learn_s + cpu.weight_sync + cpu.overhead) * lt
    r = simulate(cpu, layout, samples_per_step=samples_per_step, steps=steps, pool=pool)
    busy = (r.learner_util * lt + r.rollout_util * layout.workers * wt) * r.step_s
    return work / busy if busy > 0 else 1.0


def background_for_share(
    cpu: PhaseTimes,
    layout: Layout,
    share: float,
    cores: float,
    *,
    samples_per_step: int,
    tolerance: float = 0.005,
) -> float:
    """Other jobs' runnable threads under which a run of ``cpu`` CPU seconds per phase in ``layout`` on
    ``cores`` cores gets ``share`` of a core per busy thread (its measured CPU over wall seconds): the
    run's own overlapping phases count as the simulator has them, the rest of the slowdown is background.
    0 when the run got at least what it gets on an idle machine. Bisection; the share falls as the
    background grows."""

    def got(background: float) -> float:
        pool = CorePool(
            cores, background=background, reference_threads=layout.learner_threads, reference_background=0.0
        )
        return simulated_share(cpu, layout, pool, samples_per_step=samples_per_step)

    target = min(1.0, share)
    if got(0.0) <= target:
        return 0.0
    lo, hi = 0.0, cores / target
    while got(hi) > target:
        hi *= 2
    while hi - lo > tolerance * max(1.0, hi):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if got(mid) > target else (lo, mid)
    return (lo + hi) / 2
