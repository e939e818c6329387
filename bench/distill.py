"""Distillation on the quickstart task: a quarter-size student after on-policy distillation (OPD) from the
GRPO-trained quickstart teacher, against the same student trained by SFT alone and by GRPO alone, from
the same start and with the same budget; optionally serving QPS of the INT8 student vs the teacher.

Budgets (CPU, shared machine: keep them small): every arm starts from the student warm start of
configs/opd.yaml (0.27M params, hidden 64, 4 layers; ``--start`` another, e.g. the latency-shaped
hidden-96, 2-layer student of docs/distillation.md) and trains ``--steps`` steps.
- OPD: configs/opd.yaml (32 prompts x 4 samples per step, lr 1e-3); opd_reward adds the task reward
  (algorithm.opd.reward_weight=1).
- GRPO: the same student and steps with the quickstart's GRPO settings (16 prompts x 8 samples, lr 6e-4,
  the task reward only): the same samples per step as OPD.
- SFT: the task's reference answers, batch 64, lr ``--sup-lr`` (3e-3: the warm start's), 2 x ``--steps`` steps
  (the same number of sequences as 128 samples per RL step).
- KD: ``tandem distill``'s loss (forward KL to the teacher's top-20 logits, tau 1) on the teacher's own
  greedy answers, same steps and batch as SFT.
Held-out accuracy: greedy, the quickstart's 200 test prompts (what training's eval reports). Wall time is
each arm's own training (and teacher passes for KD), printed with the load average since the machine is
shared.

Needs the teacher: ``tandem train configs/quickstart.yaml`` (runs/quickstart/checkpoints/step-00000450). The
figures recorded before 2026-12-02 used the preset's earlier 300 steps (``trainer.total_steps=300``: step-00000300).

    OMP_NUM_THREADS=1 .venv/bin/python bench/distill.py --steps 30 [--serve-seconds 10]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
TEACHER = REPO / "runs/quickstart/checkpoints/step-00000450/model"
TASK = {"digits": 2, "ops": "+"}


def heldout(model_dir: str | Path) -> float:
    """Greedy held-out accuracy on the quickstart's 200 test prompts (seed 0), as training evaluates."""
    from tandem.data import rows_from_task
    from tandem.evaluate import evaluate_prompts
    from tandem.models import load_causal_lm, load_tokenizer
    from tandem.rewards import RewardSet, get_task
    from tandem.rewards.functions import RewardFunction
    from tandem.rollout import EngineSpec, build_engine
    from tandem.rollout.base import SamplingParams

    task = get_task("arith", **TASK)
    rows = rows_from_task(task, "test", 200, 0).rows
    engine = build_engine(
        "hf", EngineSpec(model=load_causal_lm(model_dir), tokenizer=load_tokenizer(model_dir))
    )
    rewards = RewardSet([RewardFunction(name=task.name, fn=task.reward, weight=1.0)], on_error="raise")
    metrics = evaluate_prompts(engine, rows, rewards, SamplingParams(max_new_tokens=6, temperature=0.0))
    engine.close()
    return metrics["eval/accuracy"]


def rl_arm(name: str, steps: int, out: Path, overrides: list[str]) -> tuple[float, float, float]:
    """(accuracy before, after, training seconds) of configs/opd.yaml with ``overrides``."""
    from tandem.config import load_config
    from tandem.orchestration.runner import train

    base = [f"trainer.total_steps={steps}", f"run.output_dir={out / name}", "monitor.eval_every=0"]
    base += ["monitor.tensorboard=false", "monitor.sample_every=0"]
    cfg = load_config(REPO / "configs/opd.yaml", base + overrides)
    start = time.perf_counter()
    result = train(cfg, progress=False)
    seconds = time.perf_counter() - start
    return result.eval_before["eval/accuracy"], result.eval_after["eval/accuracy"], seconds


def sft_arm(start_dir: Path, steps: int, out: Path, lr: float) -> tuple[float, float]:
    from tandem.data import rows_from_task
    from tandem.models import load_causal_lm, load_tokenizer, save_pretrained_atomic
    from tandem.rewards import get_task
    from tandem.train.sft import SFTSettings, run_sft, sft_pair

    rows = rows_from_task(get_task("arith", **TASK), "train", 4096, 0).rows
    pairs = [sft_pair(r, "arith") for r in rows]
    model, tok = load_causal_lm(start_dir), load_tokenizer(start_dir)
    t0 = time.perf_counter()
    run_sft(model, tok, pairs, SFTSettings(steps=steps, lr=lr, batch_size=64, weight_decay=0.1, seed=1))
    seconds = time.perf_counter() - t0
    save_pretrained_atomic(model, tok, out / "sft", created_by="bench/distill.py")
    return heldout(out / "sft"), seconds


def kd_arm(start_dir: Path, steps: int, out: Path, lr: float) -> tuple[float, float]:
    from tandem.data import rows_from_task
    from tandem.models import load_causal_lm, load_tokenizer, save_pretrained_atomic
    from tandem.rewards import get_task
    from tandem.train.distill import DistillSettings, run_distill, teacher_completions, teacher_targets

    prompts = rows_from_task(get_task("arith", **TASK), "train", 4096, 0).prompts
    teacher, tok = load_causal_lm(TEACHER), load_tokenizer(TEACHER)
    model = load_causal_lm(start_dir)
    t0 = time.perf_counter()
    pairs = teacher_completions(teacher, tok, [p for p in prompts if isinstance(p, str)], max_new_tokens=6)
    targets = teacher_targets(teacher, tok, pairs, top_k=20)
    settings = DistillSettings(steps=steps, lr=lr, batch_size=64, weight_decay=0.1, seed=1)
    run_distill(model, tok, pairs, targets, settings)
    seconds = time.perf_counter() - t0
    save_pretrained_atomic(model, tok, out / "kd", created_by="bench/distill.py")
    return heldout(out / "kd"), seconds


def serve_qps(student_dir: Path, seconds: float, out: Path) -> dict[str, float]:
    """QPS of the fp32 teacher, the fp32 student and its INT8 export under bench/serve.py's load (32
    closed-loop clients, its lean HTTP client, batch 32, one thread per server), two interleaved rounds."""
    import asyncio
    import signal

    sys.path.insert(0, str(Path(__file__).parent))
    from serve import load_raw, start_server

    from tandem.export.api import export_model

    export_model(student_dir, out / "int8", "int8", task="arith", eval_size=8)
    models = {"teacher": TEACHER, "student-fp32": student_dir, "student-int8": out / "int8"}
    servers = {name: start_server(str(folder), 32, 1, 20.0) for name, folder in models.items()}
    qps: dict[str, list[float]] = {name: [] for name in servers}
    try:
        for _, url in servers.values():
            asyncio.run(load_raw(url, 32, 2.0, 16))  # warm-up
        for r in range(2):
            for name in list(servers) if r == 0 else list(reversed(servers)):
                qps[name].append(asyncio.run(load_raw(servers[name][1], 32, seconds, 16))["qps"])
    finally:
        for proc, _ in servers.values():
            proc.send_signal(signal.SIGINT)
            proc.wait(timeout=30)
    return {name: sum(values) / len(values) for name, values in qps.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument(
        "--arms", default="opd,opd_reward,grpo,sft,kd", help="comma-separated; 'none' runs no arm"
    )
    parser.add_argument("--sup-lr", type=float, default=3e-3, help="learning rate of the SFT and KD arms")
    parser.add_argument("--start", default="runs/cache/opd-student-warmstart-1500", help="student start")
    parser.add_argument("--serve-seconds", type=float, default=0.0, help="0 skips the serving comparison")
    args = parser.parse_args()
    if not TEACHER.exists():
        sys.exit(f"no teacher at {TEACHER}: run `tandem train configs/quickstart.yaml` first")
    torch.set_num_threads(1)
    from tandem.models import load_causal_lm

    arms = args.arms.split(",")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        teacher_acc = heldout(TEACHER)
        rows: list[tuple[str, float, float, float]] = []
        start_dir = REPO / args.start
        if "opd" in arms:
            before, after, secs = rl_arm("opd", args.steps, out, [f"model.path={start_dir}"])
            rows.append(("OPD", before, after, secs))
        if "opd_reward" in arms:  # OPD plus the task reward: w (R - group mean) on every token, w = 1
            extra = [f"model.path={start_dir}", "algorithm.opd.reward_weight=1.0"]
            before, after, secs = rl_arm("opd_reward", args.steps, out, extra)
            rows.append(("OPD + task reward (w = 1)", before, after, secs))
        if not start_dir.exists():
            sys.exit(f"no student warm start at {start_dir}: run the opd arm first (it builds it)")
        if "grpo" in arms:
            grpo = ["algorithm.name=grpo", "algorithm.opd.teacher=null", "data.prompts_per_step=16"]
            grpo += ["rollout.n=8", "trainer.lr=6e-4", f"model.path={start_dir}"]
            before, after, secs = rl_arm("grpo", args.steps, out, grpo)
            rows.append(("GRPO", before, after, secs))
        start_acc = heldout(start_dir)
        if "sft" in arms:
            acc, secs = sft_arm(start_dir, 2 * args.steps, out, args.sup_lr)
            rows.append((f"SFT only (lr {args.sup_lr:g})", start_acc, acc, secs))
        if "kd" in arms:
            acc, secs = kd_arm(start_dir, 2 * args.steps, out, args.sup_lr)
            rows.append((f"offline KD (teacher answers, top-20, lr {args.sup_lr:g})", start_acc, acc, secs))
        print(f"teacher (1.06M params, GRPO quickstart): held-out greedy accuracy {teacher_acc:.3f}")
        print(f"load average at the end: {os.getloadavg()}")
        size = sum(p.numel() for p in load_causal_lm(start_dir).parameters()) / 1e6
        print(
            f"| student ({size:.2f}M params) | accuracy before → after | × teacher | train s | points / minute |"
        )
        print("|---|---|---|---|---|")
        for name, before, after, secs in rows:
            ppm = 100 * (after - before) / (secs / 60)
            print(
                f"| {name} | {before:.3f} → {after:.3f} | {after / teacher_acc:.2f} | {secs:.0f} | {ppm:+.1f} |"
            )
        if rows:
            best = max(rows, key=lambda r: r[2])
            print(
                f"ratio: best student ({best[0]}) reaches {best[2] / teacher_acc:.2f}x the teacher's accuracy"
            )
        if args.serve_seconds > 0:  # QPS depends on the student's size, not its weights: the warm start
            qps = serve_qps(start_dir, args.serve_seconds, out)
            teacher_qps = qps["teacher"]
            print(
                f"serving: fp32 teacher {teacher_qps:.1f} QPS; fp32 student {qps['student-fp32']:.1f} "
                f"({qps['student-fp32'] / teacher_qps:.2f}x); INT8 student {qps['student-int8']:.1f} "
                f"({qps['student-int8'] / teacher_qps:.2f}x); 32 clients, 2 x {args.serve_seconds:.0f} s each, "
                f"max_tokens 16, load average {os.getloadavg()[0]:.1f}"
            )


if __name__ == "__main__":
    main()
