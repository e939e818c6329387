"""Validate the planner's calibrated step-time prediction against fresh CPU runs.

Runs the quickstart workload (``configs/quickstart.yaml``: arith, 16 prompts × 8 samples, ≤ 6 new tokens)
for ``--steps`` steps in each layout — colocated, and decoupled at η = 0, 1, 2 with 1 and 2 rollout workers
(loss ``decoupled_ppo``, one torch thread per process) — one ``tandem train`` subprocess at a time. For
each run folder it fits the phase times (``tandem.plan.calibrate.read_run``), simulates the run's own
layout and prints predicted vs measured wall time per step (steady steps, start-up left out). It also
predicts every decoupled layout from the *colocated* run's phases (no decoupled measurement used), which
leaves out the slowdown of two processes sharing the cores: the gap is printed too.

    OMP_NUM_THREADS=1 .venv/bin/python bench/plan_validate.py [--steps 16] [--keep DIR] [--fixtures DIR]

``--fixtures DIR`` writes each run's config.yaml and metrics.jsonl (timing keys only) under DIR/<name>/,
which is how ``tests/fixtures/plan`` was made. The machine's load average is printed with each run: on a
shared machine the phase times move between runs, but a run and its own prediction share the same load.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tandem.plan.calibrate import check, read_run  # noqa: E402
from tandem.plan.simulate import Layout  # noqa: E402

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
    if name != "colocated":
        overrides += ["architecture.mode=decoupled", *extra]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "tandem", "train", str(ROOT / "configs/quickstart.yaml"), *overrides]
    subprocess.run(cmd, check=True, env=env, cwd=ROOT, stdout=subprocess.DEVNULL)


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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--only", nargs="*", default=None, help="layout names to run (default: all)")
    ap.add_argument("--keep", type=Path, default=None, help="keep run folders here")
    ap.add_argument("--fixtures", type=Path, default=None, help="write calibration fixtures here")
    args = ap.parse_args()
    base = args.keep or Path(tempfile.mkdtemp(prefix="tandem-plan-"))
    names = args.only or list(LAYOUTS)
    print("| run | load avg | measured s/step | predicted s/step | error | lag measured | lag predicted |")
    print("|---|---:|---:|---:|---:|---|---|")
    colocated = None
    results = []
    for name in names:
        out = base / name
        if out.exists():
            shutil.rmtree(out)
        load = os.getloadavg()[0]
        run_layout(name, LAYOUTS[name], out, args.steps)
        timings = read_run(out)
        res = check(timings)
        results.append((name, timings, res))
        if name == "colocated":
            colocated = timings
        if args.fixtures is not None:
            save_fixture(out, args.fixtures / name)
        print(
            f"| {name} | {load:.1f} | {timings.measured_step_s:.3f} | {res.predicted.step_s:.3f} | "
            f"{res.error:+.1%} | {_lag(timings.measured_lag)} | {_lag(res.predicted.lag)} |",
            flush=True,
        )
    bad = [n for n, _, r in results if abs(r.error) > 0.15]
    print(f"\nwithin 15 %: {len(results) - len(bad)}/{len(results)}" + (f" (outside: {bad})" if bad else ""))
    if colocated is not None:
        print("\nFrom the colocated run's phases alone (no contention between the processes modelled):")
        print("| run | measured s/step | predicted from colocated | error |")
        print("|---|---:|---:|---:|")
        for name, timings, _ in results:
            if name == "colocated":
                continue
            pred = check(colocated, layout=Layout(**{**timings.layout.__dict__}))
            err = pred.predicted.step_s / timings.measured_step_s - 1
            print(f"| {name} | {timings.measured_step_s:.3f} | {pred.predicted.step_s:.3f} | {err:+.1%} |")
    if args.keep is None:
        shutil.rmtree(base, ignore_errors=True)


def _lag(lag: dict[int, float]) -> str:
    return ", ".join(f"{k}: {v:.2f}" for k, v in lag.items())


if __name__ == "__main__":
    main()
