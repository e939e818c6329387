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

    OMP_NUM_THREADS=1 .venv/bin/python bench/plan_validate.py [--steps 16] [--keep DIR] [--fixtures DIR]

``--fixtures DIR`` writes each run's config.yaml, metrics.jsonl (timing keys only) and machine.jsonl under
DIR/<name>/, which is how ``tests/unit/plan/recorded*`` were made. The load average is printed too.
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

from tandem.plan.calibrate import check, cross_check, read_run  # noqa: E402
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
KEEP_PREFIXES = ("timing/", "worker/sync_s", "staleness/lag_")


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


def _stat(path: str) -> tuple[str, int] | None:
    """(state, parent pid) from a /proc stat file; None if the task is gone."""
    try:
        text = Path(path).read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()  # after the command name, which may hold spaces
    return fields[0], int(fields[1])


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
        own = 0
        for pid in tree:
            try:
                tasks = os.listdir(f"/proc/{pid}/task")
            except OSError:
                continue
            for tid in tasks:
                st = _stat(f"/proc/{pid}/task/{tid}/stat")
                own += st is not None and st[0] == "R"
        samples.append({"time": round(time.time(), 2), "runnable": running, "own": own})


def save_fixture(run: Path, dest: Path) -> None:
    """The run's config and its metrics rows reduced to what calibration reads."""
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copy(run / "config.yaml", dest / "config.yaml")
    rows = []
    for line in (run / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        if "timing/step" not in row:
            continue
        rows.append({k: v for k, v in row.items() if k in KEEP_KEYS or k.startswith(KEEP_PREFIXES)})
    (dest / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    start = rows[0]["time"] - 1.0 if rows else 0.0  # start-up samples are never used
    samples = [
        line for line in (run / "machine.jsonl").read_text().splitlines() if json.loads(line)["time"] >= start
    ]
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
    args = ap.parse_args()
    base = args.keep or Path(tempfile.mkdtemp(prefix="tandem-plan-"))
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
    if args.keep is None:
        shutil.rmtree(base, ignore_errors=True)


def cross_table(pairs, *, cores: float) -> str:
    """Markdown: each decoupled run predicted from a colocated run's phases (``pairs``: (colocated,
    decoupled) timings) — on cores of its own; on ``cores`` shared cores beside the colocated run's
    background (assumed to stay); and beside the run's own measured background (when it was sampled)."""
    lines = [
        f"\nFrom a colocated run's phases alone ({cores:g} cores; background = other jobs' runnable threads):",
        "| run | from | measured s/step | own cores | error | shared, colocated's background | error "
        "| shared, run's background | background | error |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    errors: dict[str, list[float]] = {"own": [], "stay": [], "run": []}
    for colocated, t in pairs:
        bg = colocated.background or 0.0
        own = cross_check(colocated, t, pool=None)
        stay = cross_check(colocated, replace(t, background=None), pool=CorePool(cores, background=bg))
        run = cross_check(colocated, t, pool=CorePool(cores, background=bg))
        for key, res in (("own", own), ("stay", stay), ("run", run)):
            errors[key].append(res.error)
        lines.append(
            f"| {Path(t.run_dir).name} | {Path(colocated.run_dir).name} ({bg:.2f}) | {t.measured_step_s:.3f} "
            f"| {own.predicted.step_s:.3f} | {own.error:+.1%} "
            f"| {stay.predicted.step_s:.3f} | {stay.error:+.1%} | {run.predicted.step_s:.3f} | {_bg(t.background)} "
            f"| {run.error:+.1%} |"
        )
    inside = {k: sum(abs(e) <= 0.15 for e in v) for k, v in errors.items()}
    n = len(pairs)
    lines.append(
        f"\nwithin 15 %: own cores {inside['own']}/{n} · shared, colocated's background {inside['stay']}/{n}"
        f" · shared, run's background {inside['run']}/{n}"
    )
    return "\n".join(lines)


def _bg(background: float | None) -> str:
    return "—" if background is None else f"{background:.2f}"


def _lag(lag: dict[int, float]) -> str:
    return ", ".join(f"{k}: {v:.2f}" for k, v in lag.items())


if __name__ == "__main__":
    main()
