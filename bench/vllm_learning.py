"""Does a run learn with ``rollout.backend: vllm``? The issue's check, side by side with the HF engine.

Runs the quickstart exactly as a user would (``tandem train configs/quickstart.yaml rollout.backend=B
architecture.mode=M trainer.total_steps=S run.seed=K``) for both engines, both architectures and a few
seeds, one subprocess at a time, engines interleaved, and prints held-out greedy accuracy (200 prompts)
before and after, the gain, the mean train–inference mismatch and the wall time per run. A run "learns"
when its held-out accuracy rises by more than ``--margin`` (default 10 points; the warm start is ~30 %).

    .venv/bin/python bench/vllm_learning.py [--steps 30] [--seeds 0 1] [--modes colocated decoupled]
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


def run(backend: str, mode: str, seed: int, steps: int, out: Path) -> dict:
    """One quickstart run; its summary and the mean mismatch over its steps."""
    cmd = [
        str(TANDEM),
        "train",
        str(ROOT / "configs/quickstart.yaml"),
        f"rollout.backend={backend}",
        f"architecture.mode={mode}",
        f"trainer.total_steps={steps}",
        f"run.seed={seed}",
        f"run.output_dir={out}",
        "monitor.progress=false",
        "monitor.tensorboard=false",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, env=env, capture_output=True, cwd=ROOT)
    wall = time.perf_counter() - t0
    summary = json.loads((out / "summary.json").read_text())
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    diffs = [r["rollout/logprob_diff_mean"] for r in rows if "rollout/logprob_diff_mean" in r]
    before = summary["eval_before"]["eval/accuracy"]
    after = summary["eval_after"]["eval/accuracy"]
    return {
        "before": before,
        "after": after,
        "gain": after - before,
        "diff": statistics.mean(diffs),
        "wall": wall,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--modes", nargs="+", default=["colocated", "decoupled"])
    ap.add_argument("--backends", nargs="+", default=["hf", "vllm"])
    ap.add_argument("--margin", type=float, default=0.10)
    args = ap.parse_args()
    results: dict[tuple[str, str], list[dict]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for seed in args.seeds:
            for mode in args.modes:
                for backend in args.backends:  # interleaved: engines alternate within each (seed, mode)
                    r = run(backend, mode, seed, args.steps, Path(tmp) / f"{backend}-{mode}-{seed}")
                    results.setdefault((backend, mode), []).append(r)
                    print(
                        f"seed {seed} {mode:9s} {backend:4s}: {r['before']:.1%} -> {r['after']:.1%} "
                        f"(diff {r['diff']:.1e}, {r['wall']:.0f} s)",
                        flush=True,
                    )
    print(f"\n{args.steps} steps, seeds {args.seeds}; held-out greedy accuracy on 200 prompts")
    print(
        "| engine | mode | before | after (mean) | gain (min over seeds) | logprob diff | wall s | learns |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---|")
    for (backend, mode), rs in results.items():
        gain = min(r["gain"] for r in rs)
        print(
            f"| {backend} | {mode} | {statistics.mean(r['before'] for r in rs):.1%} "
            f"| {statistics.mean(r['after'] for r in rs):.1%} | {gain:+.1%} "
            f"| {statistics.mean(r['diff'] for r in rs):.1e} | {statistics.mean(r['wall'] for r in rs):.0f} "
            f"| {'yes' if gain > args.margin else 'NO'} |"
        )


if __name__ == "__main__":
    main()
