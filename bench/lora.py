"""LoRA vs full fine-tuning: the issue's two checks, side by side, one subprocess per run.

1. **Learning.** ``tandem train CONFIG model.lora.r=8 trainer.total_steps=S`` against the same command
   with ``model.lora.r=0`` (full fine-tuning), each at a few learning rates (``--full-lrs``, default the
   quickstart's 6e-4; ``--lora-lrs``: adapters usually want a larger one), for each of ``--seeds``.
   CONFIG is ``--config`` (default ``configs/quickstart.yaml``, the shipped char-level warm start);
   ``--config configs/lora_qwen.yaml`` runs a second model, a Qwen2/BPE one with a chat template whose
   warm start the preset builds (``model.warm_start_sft``; built here first, before any timing, if
   ``model.path`` is missing). Prints held-out greedy accuracy (``data.eval_size`` prompts) before, every
   ``--eval-every`` steps, and after; a line per seed compares the best LoRA run with the best full
   fine-tuning run (the issue asks for within 5 points).
2. **Memory.** Peak resident memory (``ru_maxrss`` of the ``tandem train`` process) of a short GRPO run
   with a KL reference (``algorithm.beta=0.04``) on a ~100M-parameter Llama built with
   ``init_tiny_model``: full fine-tuning holds weights, gradients, AdamW moments and a reference copy;
   LoRA holds the weights once plus the adapter's few. The issue asks for LoRA <= 50 % of full.

    .venv/bin/python bench/lora.py [--config configs/quickstart.yaml] [--steps 30] [--full-lrs 6e-4]
        [--lora-lrs 6e-4 2e-3 6e-3] [--seeds 0 1] [--skip-learning] [--skip-memory]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TANDEM = Path(sys.executable).parent / "tandem"
QUICKSTART = ROOT / "configs/quickstart.yaml"
FULL_LR = 6e-4  # configs/quickstart.yaml
# Runs the command given as argv and prints its peak RSS in KiB (the only child it waits for).
MAXRSS = (
    "import resource, subprocess, sys\n"
    "rc = subprocess.run(sys.argv[1:]).returncode\n"
    "print('MAXRSS', resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, rc)\n"
)


def _train(overrides: list[str], config: Path = QUICKSTART) -> tuple[float, float]:
    """``tandem train CONFIG OVERRIDES`` in a subprocess: wall seconds, peak RSS (MiB)."""
    cmd = [str(TANDEM), "train", str(config), *overrides]
    cmd += ["monitor.progress=false", "monitor.tensorboard=false"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    t0 = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-c", MAXRSS, *cmd], env=env, capture_output=True, text=True, cwd=ROOT
    )
    wall = time.perf_counter() - t0
    line = [s for s in out.stdout.splitlines() if s.startswith("MAXRSS")]
    if not line or line[0].split()[2] != "0":
        sys.exit(f"run failed: {' '.join(cmd)}\n{out.stdout[-2000:]}\n{out.stderr[-3000:]}")
    return wall, int(line[0].split()[1]) / 1024


def ensure_warm_start(config: Path) -> None:
    """Build ``config``'s model (``model.warm_start_sft``) now if its folder is missing, so no timed run
    includes it; the same folder and seed ``tandem train CONFIG`` would build and cache."""
    sys.path.insert(0, str(ROOT))
    from tandem.config import load_config
    from tandem.orchestration.build import ensure_model

    cfg = load_config(config)
    path = ROOT / cfg.model.path
    if path.exists() or cfg.model.warm_start_sft is None:
        return
    print(f"building {cfg.model.path} (model.warm_start_sft of {config.name}) ...", flush=True)
    t0 = time.perf_counter()
    ensure_model(cfg.model.model_copy(update={"path": str(path)}), seed=cfg.run.seed)
    print(f"built in {time.perf_counter() - t0:.0f} s (load average {os.getloadavg()[0]:.1f})", flush=True)


def learning(
    config: Path,
    steps: int,
    full_lrs: list[float],
    lora_lrs: list[float],
    eval_every: int,
    seed: int,
    root: Path,
) -> None:
    runs = [("full", 0, lr) for lr in full_lrs] + [("lora r=8", 8, lr) for lr in lora_lrs]
    results = []
    for label, r, lr in runs:
        out = root / f"learn-{seed}-{r}-{lr}"
        overrides = [f"trainer.total_steps={steps}", f"trainer.lr={lr}", f"run.output_dir={out}"]
        overrides += [f"run.seed={seed}"]
        overrides += [f"monitor.eval_every={eval_every}", "monitor.sample_every=0", "checkpoint.every=0"]
        overrides += [f"model.lora.r={r}"]
        wall, rss = _train(overrides, config)
        rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x.strip()]
        curve = [(r_["step"], r_["eval/accuracy"]) for r_ in rows if "eval/accuracy" in r_]
        summary = json.loads((out / "summary.json").read_text())
        after = summary["eval_after"]["eval/accuracy"]
        results.append((label, lr, summary["eval_before"]["eval/accuracy"], after, curve, wall, rss))
        load = os.getloadavg()[0]
        print(
            f"{label:9s} seed {seed} lr={lr:<7g} acc {curve[0][1]:.3f} -> {after:.3f}  {wall:6.1f}s  "
            f"{rss:6.0f} MiB  (load {load:.1f})"
        )
        print("          curve " + " ".join(f"{s}:{a:.3f}" for s, a in curve), flush=True)
    if not full_lrs or not lora_lrs:  # one side only (e.g. more learning rates for it): nothing to compare
        return
    full = max(results[: len(full_lrs)], key=lambda x: x[3])
    best = max(results[len(full_lrs) :], key=lambda x: x[3])
    print(
        f"learning (seed {seed}): best LoRA (lr={best[1]:g}) {best[3]:.3f} vs best full fine-tuning "
        f"(lr={full[1]:g}) {full[3]:.3f}: {100 * (best[3] - full[3]):+.1f} points (issue: within 5 points)"
    )


def memory(root: Path, steps: int, hidden: int, layers: int, heads: int) -> None:
    sys.path.insert(0, str(ROOT))
    from tandem.models import init_tiny_model, load_causal_lm

    model = init_tiny_model(root / "m100", hidden_size=hidden, num_layers=layers, num_heads=heads)
    n_params = sum(p.numel() for p in load_causal_lm(model).parameters())
    common = [
        f"run.output_dir={root}/mem",
        f"model.path={model}",
        "data.prompts_per_step=2",
        "data.eval_size=0",
        "data.train_size=64",
        "rollout.n=4",
        "rollout.max_new_tokens=8",
        "algorithm.name=grpo",
        "algorithm.beta=0.04",
        f"trainer.total_steps={steps}",
        "trainer.lr=1e-4",
        "monitor.eval_every=0",
        "monitor.sample_every=0",
        "checkpoint.every=0",
        "checkpoint.save_final=false",
    ]
    rows = []
    for label, r in (("full", 0), ("lora r=8", 8)):
        shutil.rmtree(root / "mem", ignore_errors=True)
        wall, rss = _train([*common, f"model.lora.r={r}"])
        rows.append((label, rss, wall))
        print(
            f"{label:9s} {n_params / 1e6:.0f}M params  peak RSS {rss:7.0f} MiB  {wall:6.1f} s wall ({steps} steps, incl. start)"
        )
    print(f"memory: LoRA peak RSS = {100 * rows[1][1] / rows[0][1]:.0f}% of full fine-tuning (issue: <= 50%)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", type=Path, default=QUICKSTART, help="preset the learning runs train")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--eval-every", type=int, default=10)
    ap.add_argument("--full-lrs", type=float, nargs="*", default=[FULL_LR])
    ap.add_argument("--lora-lrs", type=float, nargs="*", default=[6e-4, 2e-3, 6e-3])
    ap.add_argument("--seeds", "--seed", type=int, nargs="+", default=[0])
    ap.add_argument("--skip-learning", action="store_true")
    ap.add_argument("--skip-memory", action="store_true")
    ap.add_argument("--mem-steps", type=int, default=3)
    ap.add_argument("--mem-hidden", type=int, default=768)
    ap.add_argument("--mem-layers", type=int, default=10)
    ap.add_argument("--mem-heads", type=int, default=12)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-lora-") as tmp:
        root = Path(tmp)
        if not args.skip_learning:
            config = args.config.resolve()
            print(f"learning: {config.relative_to(ROOT) if config.is_relative_to(ROOT) else config}")
            ensure_warm_start(config)
            for seed in args.seeds:
                learning(config, args.steps, args.full_lrs, args.lora_lrs, args.eval_every, seed, root)
        if not args.skip_memory:
            memory(root, args.mem_steps, args.mem_hidden, args.mem_layers, args.mem_heads)


if __name__ == "__main__":
    main()
