"""Does a multi-turn agent learn to use its tool? The issue-16 check, colocated and decoupled.

Runs a shipped agent config exactly as a user would (``tandem train configs/agent_calculator.yaml
architecture.mode=M trainer.total_steps=S run.seed=K``), one subprocess at a time, architectures
interleaved (decoupled at staleness η = 1 by default: η = 0 would repeat the colocated run bit for bit),
and prints for every run the held-out greedy curve (``monitor.eval_every``): accuracy and
tool calls per episode (``eval/agent/tool_calls_mean``), then before/after per run and the mean gain per
architecture. The calculator config starts from a deliberately weak warm start (SFT on transcripts of
which only 25% call the tool), so the tool-call rate has room to rise. A run "learns" when both held-out
accuracy and tool calls per episode rise by more than ``--margin`` (default 0.2: 20 points and 0.2 calls);
``--judge`` picks other measures (``accuracy calls ok_calls return turns``; ``ok_calls``: calls per
episode that ran without an error), e.g. ``accuracy return`` for an
environment whose return rewards doing it in few turns.

    .venv/bin/python bench/agents_learning.py [--config configs/agent_calculator.yaml] [--steps 20]
        [--seeds 0 1] [--modes colocated decoupled] [--eval-every 5] [--set key=value ...]

``--agent guess`` is ``--config configs/agent_guess.yaml --judge accuracy return``: the number-guessing
game (1-10 in 4 tries) from a warm start whose greedy games count up from 1 while a quarter of its SFT
games bisect; it learns when held-out success and return per episode both rise by more than the margin.

``--agent python`` is ``--config configs/agent_python.yaml --judge accuracy ok_calls``: countdown from a
warm start that writes a one-line search for the sandbox (a subprocess per call) in nearly every held-out
episode but often miscopies the prompt into it, so many calls fail; it learns when held-out success and the
calls that run without an error both rise by more than the margin. Every run also prints the environment
time per step (``timing/env``) and the sandbox kills.

Training on 2 shared CPU cores is slow: the load average is printed beside every run's wall time.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TANDEM = Path(sys.executable).parent / "tandem"
# the metrics a curve point is read from: held-out greedy accuracy, tool calls, return and turns per episode
KEYS = {
    "accuracy": "eval/accuracy",
    "calls": "eval/agent/tool_calls_mean",
    "return": "eval/agent/return_mean",
    "turns": "eval/agent/turns_mean",
}
ERROR_RATE = "eval/agent/tool_error_rate"  # failed calls per call
# what each curve point holds, in order; ok_calls: calls per episode that ran without an error
MEASURES = ("accuracy", "calls", "ok_calls", "return", "turns")

# --agent NAME: the shipped config and what must rise for it to count as learning
AGENTS = {
    "calculator": (ROOT / "configs/agent_calculator.yaml", ["accuracy", "calls"]),
    "guess": (ROOT / "configs/agent_guess.yaml", ["accuracy", "return"]),
    "python": (ROOT / "configs/agent_python.yaml", ["accuracy", "ok_calls"]),
}


def point(step: int, metrics: dict) -> tuple:
    """``(step, accuracy, calls, ok_calls, return, turns)`` from one evaluation's metrics; ``ok_calls`` is
    tool calls per episode that ran without an error."""
    values = {name: float(metrics.get(key, 0.0)) for name, key in KEYS.items()}
    values["ok_calls"] = values["calls"] * (1.0 - float(metrics.get(ERROR_RATE, 0.0)))
    return (step, *(values[name] for name in MEASURES))


def run(config: Path, mode: str, seed: int, args: argparse.Namespace, out: Path) -> dict:
    """One training run; its held-out curve (:func:`point` every ``eval_every`` steps) and wall time."""
    cmd = [
        str(TANDEM),
        "train",
        str(config),
        f"architecture.mode={mode}",
        f"architecture.staleness={args.staleness if mode == 'decoupled' else 0}",
        f"trainer.total_steps={args.steps}",
        f"run.seed={seed}",
        f"run.output_dir={out}",
        f"monitor.eval_every={args.eval_every}",
        "checkpoint.every=0",
        "monitor.progress=false",
        "monitor.tensorboard=false",
        *args.set,
    ]
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    load0, t0 = os.getloadavg()[0], time.perf_counter()
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=ROOT, check=False)
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        sys.exit(f"run failed ({' '.join(cmd)}):\n{done.stderr[-3000:]}")
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    curve = {r["step"]: point(r["step"], r) for r in rows if KEYS["accuracy"] in r}
    summary = json.loads((out / "summary.json").read_text())
    for key, step in (("eval_before", 0), ("eval_after", args.steps)):  # the run's own ends of the curve
        if KEYS["accuracy"] in (summary.get(key) or {}):
            curve[step] = point(step, summary[key])
    curve = [curve[s] for s in sorted(curve)]
    # the sampled (temperature-1) training episodes of every step: tool calls and turns per episode,
    # mean reward
    train = [
        (r["step"], r["agent/tool_calls_mean"], r.get("agent/turns_mean", 0.0), r.get("reward/mean", 0.0))
        for r in rows
        if "agent/tool_calls_mean" in r
    ]
    load = (load0 + os.getloadavg()[0]) / 2
    # seconds per step waiting on environments (tool calls: the python sandbox's subprocesses), kills
    env_s = [r["timing/env"] for r in rows if "timing/env" in r]
    kills = sum(r.get("agent/sandbox_kills", 0.0) for r in rows)
    env = {"env_s_mean": statistics.mean(env_s) if env_s else 0.0, "env_s_max": max(env_s, default=0.0)}
    env["sandbox_kills"] = kills
    return {"mode": mode, "seed": seed, "curve": curve, "train": train, "wall": wall, "load": load, **env}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--agent", choices=list(AGENTS), help="a shipped agent: its config and --judge")
    ap.add_argument("--config", type=Path, default=ROOT / "configs/agent_calculator.yaml")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--modes", nargs="+", default=["colocated", "decoupled"])
    ap.add_argument("--eval-every", type=int, default=5)
    ap.add_argument(
        "--staleness", type=int, default=1, help="decoupled runs' η (0 would equal the colocated run)"
    )
    ap.add_argument("--margin", type=float, default=0.2)
    ap.add_argument(
        "--judge",
        nargs="+",
        default=None,
        choices=list(MEASURES),
        help="what must rise by more than --margin for a run to count as learning (accuracy calls)",
    )
    ap.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS of each run")
    ap.add_argument("--set", nargs="*", default=[], help="extra dotted overrides for every run")
    ap.add_argument("--json", type=Path, help="write the results here")
    args = ap.parse_args()
    if args.agent:
        args.config, judge = AGENTS[args.agent]
        args.judge = args.judge or judge
    args.judge = args.judge or ["accuracy", "calls"]

    results = []
    with tempfile.TemporaryDirectory(prefix="agents_learning_") as tmp:
        for seed in args.seeds:
            for mode in args.modes:
                r = run(args.config, mode, seed, args, Path(tmp) / f"{mode}_{seed}")
                results.append(r)
                points = "  ".join(f"{p[0]}:" + "/".join(f"{v:.2f}" for v in p[1:]) for p in r["curve"])
                print(f"{mode:10s} seed {seed}  step:{'/'.join(MEASURES)}  {points}", flush=True)
                sampled = " ".join(f"{c:.2f}/{t:.2f}/{m:.2f}" for _, c, t, m in r["train"])
                print(f"{'':10s} training episodes' tool calls/turns/reward per step: {sampled}", flush=True)
                print(f"{'':10s} wall {r['wall']:.0f} s, load average ~{r['load']:.1f}", flush=True)
                print(
                    f"{'':10s} env time per step {r['env_s_mean']:.2f} s (max {r['env_s_max']:.2f} s), "
                    f"sandbox kills in training episodes {r['sandbox_kills']:.0f}",
                    flush=True,
                )

    names = list(MEASURES)
    head = "  ".join(f"{n + ' ' + w:>14s}" for n in names for w in ("before", "after"))
    print(f"\n{'mode':10s} {'seed':>4s}  {head}  learns")
    verdict = True
    for r in results:
        first, last = r["curve"][0], r["curve"][-1]
        cols = "  ".join(f"{first[i + 1]:14.2f}  {last[i + 1]:14.2f}" for i in range(len(names)))
        learns = all(last[names.index(k) + 1] - first[names.index(k) + 1] > args.margin for k in args.judge)
        verdict &= learns
        print(f"{r['mode']:10s} {r['seed']:4d}  {cols}  {'yes' if learns else 'NO'}")
    for mode in args.modes:
        rs = [r for r in results if r["mode"] == mode]
        gains = ", ".join(
            f"{k} {statistics.mean(r['curve'][-1][i + 1] - r['curve'][0][i + 1] for r in rs):+.2f}"
            for i, k in enumerate(names)
        )
        print(f"{mode}: mean gain {gains}")
    judged = " and ".join(args.judge)
    print(
        f"all runs raise {judged} by > {args.margin}"
        if verdict
        else f"some run did not raise {judged} by > {args.margin}"
    )
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    sys.exit(0 if verdict else 1)


if __name__ == "__main__":
    main()
