"""Validate the planner's calibrated step-time prediction against fresh CPU runs.

Runs the quickstart workload (``configs/quickstart.yaml``: arith, 16 prompts × 8 samples, ≤ 6 new tokens)
for ``--steps`` steps in each layout — colocated, and decoupled at η = 0, 1, 2 with 1 and 2 rollout workers
(loss ``decoupled_ppo``, one torch thread per process) — one ``tandem train`` subprocess at a time. For
each run folder it fits the phase times (``tandem.plan.calibrate.read_run``), simulates the run's own
layout and prints predicted vs measured wall time per step (steady steps, start-up left out).

It also predicts every decoupled layout from the *colocated* run's phases alone (no decoupled measurement
used), three ways: each side on cores of its own (the planner's GPU assumption); the processes sharing
``--cores`` cores (``tandem.plan.sharing``: processor sharing) beside the colocated run's background; and
beside each run's own background. While each run trains, a sampler reads the machine's runnable threads
(``/proc/loadavg``) and those of the run's own processes every 0.1 s; the difference, other jobs'
runnable threads, is saved as the run's ``machine.jsonl`` (the background). On the shared 2-core VM
that count did not track how fast the machine ran (docs/planning.md, cross-prediction).

    OMP_NUM_THREADS=1 .venv/bin/python bench/plan_validate.py [--steps 16] [--paired] [--keep DIR] [--fixtures DIR]
    .venv/bin/python bench/plan_validate.py --analyse DIR [--paired] [--fixtures DIR]  # runs kept by --keep

``--fixtures DIR`` writes each run's config.yaml, metrics.jsonl (timing keys only) and machine.jsonl under
DIR/<name>/, which is how ``tests/unit/plan/recorded*`` were made. The load average is printed too.

The runs also log each phase's process CPU seconds (``cpu/<phase>``), and the sampler records the
machine's busy CPU seconds and the run's own: the last two columns of the cross table predict from the
colocated run's CPU seconds per phase (what each phase costs on a core of its own) instead of its wall
times, under a load read from a run's share of a core (``RunTimings.load_background``): the colocated
run's (assumed to stay), or the predicted run's own (the load stated; the layout's contention between its
own processes is still the model's).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tandem.plan.calibrate import check, cross_check, cross_check_cpu, read_run  # noqa: E402
from tandem.plan.sharing import CorePool  # noqa: E402

LAYOUTS: dict[str, list[str]] = {
    "colocated": [],
    "dec_eta0_w1": ["architecture.staleness=0", "architecture.num_workers=1"],
    "dec_eta1_w1": ["architecture.staleness=1", "architecture.num_workers=1"],
    "dec_eta2_w1": ["architecture.staleness=2", "architecture.num_workers=1"],
    "dec_eta0_w2": ["architecture.staleness=0", "architecture.num_workers=2"],
    "dec_eta1_w2": ["architecture.staleness=1", "architecture.num_workers=2"],
    "dec_eta2_w2": ["architecture.staleness=2", "architecture.num_workers=2"],
}
KEEP_KEYS = ("step", "time", "response/length_mean", "perf/train_tokens_per_s", "idle/learner_ratio")
KEEP_PREFIXES = ("timing/", "cpu/", "worker/cpu/", "worker/sync_s", "staleness/lag_")


def run_layout(name: str, extra: list[str], out: Path, steps: int) -> None:
    overrides = [
        f"run.output_dir={out}",
        f"trainer.total_steps={steps}",
        "monitor.eval_every=100000",
        "data.eval_size=16",
        "checkpoint.every=100000",
        "algorithm.name=decoupled_ppo",
    ]
    if not name.startswith("colocated"):
        overrides += ["architecture.mode=decoupled", *extra]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "tandem", "train", str(ROOT / "configs/quickstart.yaml"), *overrides]
    proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.DEVNULL)
    samples: list[dict[str, float]] = []
    stop = threading.Event()
    sampler = threading.Thread(target=_sample, args=(proc.pid, samples, stop), daemon=True)
    sampler.start()
    rc = proc.wait()
    stop.set()
    sampler.join()
    if rc != 0:
        raise SystemExit(f"{name}: tandem train exited with {rc}")
    (out / "machine.jsonl").write_text("".join(json.dumps(r) + "\n" for r in samples))


TICK = os.sysconf("SC_CLK_TCK")


def _stat(path: str) -> tuple[str, int, float] | None:
    """(state, parent pid, CPU seconds used) from a /proc stat file; None if the task is gone."""
    try:
        text = Path(path).read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()  # after the command name, which may hold spaces
    return fields[0], int(fields[1]), (int(fields[11]) + int(fields[12])) / TICK  # utime + stime


def _machine_busy() -> float:
    """CPU seconds all cores have spent busy since boot (/proc/stat: everything but idle and iowait)."""
    ticks = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    return (sum(ticks) - ticks[3] - ticks[4]) / TICK


def _sample(root: int, samples: list[dict[str, float]], stop: threading.Event, every: float = 0.1) -> None:
    """Every ``every`` s: runnable threads of the machine (less this sampler) and of ``root``'s process
    tree; their difference is the runnable threads of other jobs."""
    while not stop.wait(every):
        running = int(Path("/proc/loadavg").read_text().split()[3].split("/")[0]) - 1
        parents = {}
        for d in os.listdir("/proc"):
            if d.isdigit() and (st := _stat(f"/proc/{d}/stat")) is not None:
                parents[int(d)] = st[1]
        tree, grew = {root}, True
        while grew:
            new = {pid for pid, ppid in parents.items() if ppid in tree} - tree
            tree |= new
            grew = bool(new)
        own, own_cpu = 0, 0.0
        for pid in tree:
            st = _stat(f"/proc/{pid}/stat")
            own_cpu += st[2] if st is not None else 0.0
            try:
                tasks = os.listdir(f"/proc/{pid}/task")
            except OSError:
                continue
            for tid in tasks:
                st = _stat(f"/proc/{pid}/task/{tid}/stat")
                own += st is not None and st[0] == "R"
        samples.append(
            {
                "time": round(time.time(), 2),
                "runnable": running,
                "own": own,
                "busy_s": round(_machine_busy(), 2),  # cumulative: busy cores = its rate
                "own_cpu_s": round(own_cpu, 2),  # cumulative CPU seconds of the run's live processes
            }
        )


def save_fixture(run: Path, dest: Path, *, every: int = 4) -> None:
    """The run's config, its metrics rows reduced to what calibration reads, and every ``every``-th
    machine sample (0.4 s apart: its means barely move, the fixture is a quarter of the size)."""
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copy(run / "config.yaml", dest / "config.yaml")
    rows = []
    for line in (run / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        if "timing/step" not in row:
            continue
        rows.append(
            {
                k: round(v, 6) if isinstance(v, float) else v  # µs: what timing needs, half the bytes
                for k, v in row.items()
                if k in KEEP_KEYS or k.startswith(KEEP_PREFIXES)
            }
        )
    (dest / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    start = rows[0]["time"] - 1.0 if rows else 0.0  # start-up samples are never used
    samples = [
        line for line in (run / "machine.jsonl").read_text().splitlines() if json.loads(line)["time"] >= start
    ][::every]
    (dest / "machine.jsonl").write_text("".join(line + "\n" for line in samples))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--only", nargs="*", default=None, help="layout names to run (default: all)")
    ap.add_argument("--keep", type=Path, default=None, help="keep run folders here")
    ap.add_argument("--fixtures", type=Path, default=None, help="write calibration fixtures here")
    ap.add_argument("--cores", type=float, default=float(os.cpu_count() or 1), help="cores the runs share")
    ap.add_argument(
        "--paired",
        action="store_true",
        help="run a colocated run right before each decoupled one and predict each from its own pair",
    )
    ap.add_argument(
        "--analyse",
        type=Path,
        default=None,
        help="run nothing: read the run folders a --keep left in this folder and print the tables",
    )
    args = ap.parse_args()
    base = args.analyse or args.keep or Path(tempfile.mkdtemp(prefix="tandem-plan-"))
    names = args.only or list(LAYOUTS)
    if args.paired:
        names = [m for n in names if n != "colocated" for m in (f"colocated_before_{n}", n)]
    print(
        "| run | load avg | other jobs' runnable threads | measured s/step | predicted s/step | error | lag measured "
        "| lag predicted |"
    )
    print("|---|---:|---:|---:|---:|---:|---|---|")
    colocated = None
    results = []
    pairs = []
    for name in names:
        out = base / name
        if args.analyse is not None:
            if not (out / "machine.jsonl").is_file():  # written when the run ended
                continue
            load = float("nan")
        else:
            if out.exists():
                shutil.rmtree(out)
            load = os.getloadavg()[0]
            run_layout(name, LAYOUTS.get(name, []), out, args.steps)
        timings = read_run(out)
        res = check(timings)
        results.append((name, timings, res))
        if name.startswith("colocated"):
            colocated = timings
        elif colocated is not None:
            pairs.append((colocated, timings))
        if args.fixtures is not None:
            save_fixture(out, args.fixtures / name)
        print(
            f"| {name} | {load:.1f} | {_bg(timings.background)} | {timings.measured_step_s:.3f} | "
            f"{res.predicted.step_s:.3f} | "
            f"{res.error:+.1%} | {_lag(timings.measured_lag)} | {_lag(res.predicted.lag)} |",
            flush=True,
        )
    bad = [n for n, _, r in results if abs(r.error) > 0.15]
    print(f"\nwithin 15 %: {len(results) - len(bad)}/{len(results)}" + (f" (outside: {bad})" if bad else ""))
    if pairs:
        print(cross_table(pairs, cores=args.cores))
    if args.keep is None and args.analyse is None:
        shutil.rmtree(base, ignore_errors=True)


def cross_table(pairs, *, cores: float) -> str:
    """Markdown: each decoupled run predicted from a colocated run (``pairs``: (colocated, decoupled)
    timings) — from its wall-time phases: on cores of its own; on ``cores`` shared cores beside the colocated
    run's sampled background (assumed to stay); beside the run's own sampled background — and from its CPU
    seconds per phase (``cpu/<phase>``), on ``cores`` shared cores beside the load that explains the
    colocated run's share of a core (assumed to stay), and beside the load that explains the decoupled
    run's own share (a stated load: the layout's contention is still the model's)."""
    lines = [
        f"\nFrom a colocated run alone ({cores:g} cores; B = other jobs' runnable threads, sampled or from the "
        "share of a core):",
        "| run | from (sampled B) | measured s/step | wall, own cores | wall, shared, colocated's B "
        "| wall, shared, run's sampled B | cpu, colocated's load (B) | cpu, run's load (B) |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    errors: dict[str, list[float]] = {"own": [], "stay": [], "run": [], "cpu_stay": [], "cpu_run": []}
    for colocated, t in pairs:
        bg = colocated.background or 0.0
        res = {
            "own": cross_check(colocated, t, pool=None),
            "stay": cross_check(colocated, replace(t, background=None), pool=CorePool(cores, background=bg)),
            "run": cross_check(colocated, t, pool=CorePool(cores, background=bg)),
        }
        loads = {}
        if colocated.cpu is not None and t.cpu is not None:
            loads = {"cpu_stay": colocated.load_background(cores), "cpu_run": t.load_background(cores)}
            for key, load in loads.items():
                res[key] = cross_check_cpu(colocated, t, cores=cores, background=load)
        for key, r in res.items():
            errors[key].append(r.error)

        cells = " | ".join(_cell(res, loads, key) for key in errors)
        lines.append(
            f"| {Path(t.run_dir).name} | {Path(colocated.run_dir).name} ({_bg(colocated.background)}) "
            f"| {t.measured_step_s:.3f} | {cells} |"
        )
    summary = " · ".join(
        f"{key} {sum(abs(e) <= 0.15 for e in v)}/{len(v)} (worst {max(abs(e) for e in v):.1%})"
        for key, v in errors.items()
        if v
    )
    lines.append(f"\nwithin 15 %: {summary}")
    return "\n".join(lines)


def _cell(res: dict, loads: dict[str, float], key: str) -> str:
    """``predicted s/step (error)``, with the load it assumed for the CPU-time models."""
    if key not in res:
        return "—"
    r = res[key]
    extra = f" (B {loads[key]:.2f})" if key in loads else ""
    return f"{r.predicted.step_s:.3f} ({r.error:+.1%}){extra}"


def _bg(background: float | None) -> str:
    return "—" if background is None else f"{background:.2f}"


def _lag(lag: dict[int, float]) -> str:
    return ", ".join(f"{k}: {v:.2f}" for k, v in lag.items())


if __name__ == "__main__":
    main()
