"""Colocated vs decoupled (η = 1 and η = 2) on ``arith``: wall time, samples/s, held-out accuracy, lag.

All systems start from the quickstart's shipped warm start (``checkpoints/quickstart-warmstart``: a partial
SFT on 2-digit addition, ~30 % held-out greedy accuracy), draw the same prompts (same seed) and train the
same number of samples: ``--steps`` steps × 16 prompts × 8 samples, up to 6 new tokens, the quickstart's
lr 6e-4, loss ``decoupled_ppo`` (at lag 0 it is plain PPO-clip, so the colocated run uses the very same
objective). Threads: colocated runs in one process with one torch thread; decoupled runs one learner and
one rollout worker process with one torch thread each — the two sides overlap on the two cores.

Throughput is steady state: samples trained between the logged rows of step 1 and step ``steps − 1``
divided by the time between them (this leaves out process start-up and the final evaluation). Wall time
is the whole ``train()`` call (start-up, the before/after evaluations of the held-out prompts included).
Each (system, round) is its own subprocess; subprocesses run one at a time, systems interleaved.
``--no-shared-prefix`` scores every sample's prompt separately in training (the pre-2026-11-29 learner).

    .venv/bin/python bench/architectures.py [--steps 100] [--rounds 2] [--json rounds.json]

This VM's speed drifts by up to ±20 % within minutes, so read the per-round ratios (and pool several runs
with ``--json``) rather than one run's medians.
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

SYSTEMS = {
    "colocated": {"mode": "colocated"},
    "decoupled η=1": {"mode": "decoupled", "staleness": 1},
    "decoupled η=2": {"mode": "decoupled", "staleness": 2},
}
ROOT = Path(__file__).resolve().parents[1]


def config(
    arch: dict,
    out: Path,
    steps: int,
    prompts: int = 16,
    n: int = 8,
    new_tokens: int = 6,
    shared_prefix: bool = True,
) -> dict:
    """The shared run config; only ``architecture`` differs between systems."""
    return {
        "run": {"output_dir": str(out), "seed": 0},
        "model": {"path": str(ROOT / "checkpoints/quickstart-warmstart")},
        "data": {
            "task": "arith",
            "task_options": {"digits": 2, "ops": "+"},
            "prompts_per_step": prompts,
            "eval_size": 500,
        },
        "rollout": {"n": n, "max_new_tokens": new_tokens, "temperature": 1.0},
        "algorithm": {"name": "decoupled_ppo"},
        "trainer": {"total_steps": steps, "lr": 6e-4, "warmup_steps": 5, "shared_prefix": shared_prefix},
        "architecture": arch,
        "monitor": {"eval_every": 0, "sample_every": 0, "tensorboard": False, "progress": False},
        "checkpoint": {"save_final": False},
    }


def run_one(system: str, steps: int, shared_prefix: bool = True) -> dict:
    """Train one system in this process; return its measurements."""
    import torch

    torch.set_num_threads(1)
    from tandem.config import build_config
    from tandem.monitor import read_metrics
    from tandem.orchestration.runner import train

    with tempfile.TemporaryDirectory() as tmp:
        cfg = build_config(config(SYSTEMS[system], Path(tmp) / "run", steps, shared_prefix=shared_prefix))
        t0 = time.perf_counter()
        result = train(cfg, progress=False)
        wall = time.perf_counter() - t0
        rows = {r["step"]: r for r in read_metrics(result.run_dir)}
    samples = cfg.samples_per_step
    span = rows[steps - 1]["time"] - rows[1]["time"]
    last = rows[steps]
    lags = {k.removeprefix("staleness/lag_"): v for k, v in last.items() if k.startswith("staleness/lag_")}
    return {
        "system": system,
        "wall_s": wall,
        "samples_per_s": (steps - 2) * samples / span,
        "acc_before": result.eval_before.get("eval/accuracy", float("nan")),
        "acc_after": result.eval_after.get("eval/accuracy", float("nan")),
        "lag": lags or {"0": 1.0},
        "dropped": last.get("decoupled/dropped_samples", 0.0),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--no-shared-prefix", action="store_true", help="score each sample's prompt separately")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--json", help="also write every round's measurements to this file")
    ap.add_argument("--one", choices=list(SYSTEMS), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(run_one(args.one, args.steps, shared_prefix=not args.no_shared_prefix)))
        return
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    results: dict[str, list[dict]] = {s: [] for s in SYSTEMS}
    for rnd in range(args.rounds):
        for system in SYSTEMS:  # interleaved: every round runs each system once, one at a time
            cmd = [sys.executable, __file__, "--one", system, "--steps", str(args.steps)]
            cmd += ["--no-shared-prefix"] if args.no_shared_prefix else []
            out = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, check=False)
            if out.returncode:
                sys.exit(f"{system} failed:\n{out.stderr[-3000:]}")
            res = json.loads(out.stdout.strip().splitlines()[-1])
            results[system].append(res)
            print(f"round {rnd + 1} {system}: {res['samples_per_s']:.1f} samples/s", file=sys.stderr)
    _table(results, args)


def _table(results: dict[str, list[dict]], args: argparse.Namespace) -> None:
    med = {
        s: {
            k: statistics.median(r[k] for r in rs)
            for k in ("wall_s", "samples_per_s", "acc_before", "acc_after")
        }
        for s, rs in results.items()
    }
    print(
        "| system | wall s | samples/s | × colocated | accuracy before → after | policy lag (share of samples) | dropped |"
    )
    print("|---|---|---|---|---|---|---|")
    base = med["colocated"]["samples_per_s"]
    for s, rs in results.items():
        m = med[s]
        lag = ", ".join(f"{k}: {v:.2f}" for k, v in sorted(rs[-1]["lag"].items()))
        print(
            f"| {s} | {m['wall_s']:.1f} | {m['samples_per_s']:.1f} | {m['samples_per_s'] / base:.2f} | "
            f"{m['acc_before']:.3f} → {m['acc_after']:.3f} | {lag} | {int(rs[-1]['dropped'])} |"
        )
    print(f"\nmedians of {args.rounds} rounds, {args.steps} steps × {16 * 8} samples each")
    colo = results["colocated"]
    for s in SYSTEMS:
        if s == "colocated":
            continue
        per_round = [d["samples_per_s"] / c["samples_per_s"] for d, c in zip(results[s], colo, strict=True)]
        delta = 100 * (med[s]["acc_after"] - med["colocated"]["acc_after"])
        ok = med[s]["samples_per_s"] / base >= 1.6 and abs(delta) <= 2
        print(
            f"ratio {s}: {med[s]['samples_per_s'] / base:.2f}x (rounds {' / '.join(f'{r:.2f}' for r in per_round)}; "
            f"median per round {statistics.median(per_round):.2f}x, min {min(per_round):.2f}x), "
            f"accuracy {delta:+.1f} points vs colocated -> {'meets' if ok else 'misses'} the target "
            "(≥ 1.6x, within 2 points)"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))  # raw rounds, to pool several runs


if __name__ == "__main__":
    main()
