"""GRPO step time, peak memory and reward: TRL's ``GRPOTrainer`` vs Tandem's colocated GRPO.

Both systems start from the same HF folder (a 1.06M-param character-level tiny Llama: hidden 128, 4 layers,
4 heads), draw from the same ``arith`` prompt pool, and do the same work per step: 8 prompts × 8 samples,
up to 32 new tokens at temperature 1.0 (no top-k/top-p), GRPO advantages normalised by the group std,
PPO-clip loss (ε = 0.2) averaged per sequence then over sequences (TRL ``loss_type="grpo"``, Tandem
preset ``grpo``), β = 0 (no reference model), one PPO epoch with the whole batch as one optimiser step
(TRL ``num_iterations=1``, ``per_device_train_batch_size=64``), AdamW at the same constant learning rate,
gradient clipping at 1.0, no evaluation, no checkpoints, no logging.

Stopping: both stop a sample on EOS — and only on EOS: Tandem's default ``"\\n"`` stop string is turned
off — or after 32 tokens, and both keep decoding the batch until every row has stopped. Same rule, so the
same work; the mean completion length of each variant is printed to show it.

Variants (``--variants``): ``tandem`` / ``trl`` in fp32; ``tandem-bf16`` / ``trl-bf16`` with bf16
autocast (TRL's default precision); ``trl-bf16-eager``, TRL in bf16 with eager attention (sidesteps the
slow CPU bf16 flash-attention backward, as a TRL user could); ``trl-defaults``, TRL's own defaults for
``bf16`` (on) and ``gradient_checkpointing`` (on — recomputation a tiny model on CPU does not need).
The ratio per precision is the fastest TRL variant without checkpointing ÷ Tandem.

Each (variant, reward, round) is a separate subprocess (``--variant ... --steps N`` prints one JSON
line), so peak RSS is per variant; subprocesses run one at a time, the variant order reversing every
block, never concurrently. Every run calls ``torch.set_num_threads(--threads)``. Step time is the median
over all steps after ``--warmup`` of all runs, as wall-clock and as process CPU time (steadier when other
jobs share the cores). The final ``ratio:`` line is the smaller CPU-time ratio of the two precisions.
Two rewards: ``arith`` (the task verifier; ≈0 for an untrained model) and ``digits`` (share of digit
characters; learnable from scratch).

``--lora R`` trains a LoRA adapter of rank R in both (Tandem ``model.lora``, TRL ``peft_config``; alpha 16,
every linear layer but the LM head).

    .venv/bin/python bench/grpo_vs_trl.py [--steps 30] [--rounds 3] [--threads 1] [--variants ...] [--lora 8]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REWARDS = ("arith", "digits")
PROMPTS_PER_STEP = 8
SAMPLES = 8
NEW_TOKENS = 32
TRAIN_SIZE = 4096

# What each variant runs. bf16 = autocast on CPU (Tandem ``model.autocast_bf16``, TRL ``bf16=True``).
VARIANTS: dict[str, dict[str, Any]] = {
    "tandem": {"system": "tandem", "bf16": False},
    "trl": {"system": "trl", "bf16": False, "checkpointing": False, "attn": None},
    "tandem-bf16": {"system": "tandem", "bf16": True},
    "trl-bf16": {"system": "trl", "bf16": True, "checkpointing": False, "attn": None},
    "trl-bf16-eager": {"system": "trl", "bf16": True, "checkpointing": False, "attn": "eager"},
    # TRL's own defaults for these two knobs: bf16 on, gradient checkpointing on.
    "trl-defaults": {"system": "trl", "bf16": True, "checkpointing": True, "attn": None},
}


def digit_fraction(prompts: list[str], completions: list[str], **_: Any) -> list[float]:
    """Fraction of the completion's characters that are digits (0 for an empty completion)."""
    return [sum(c.isdigit() for c in text) / len(text) if text else 0.0 for text in completions]


def _setup_threads(threads: int) -> None:
    import torch

    torch.set_num_threads(threads)
    torch.set_num_interop_threads(1)


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


# -- Tandem ------------------------------------------------------------------------------------------------
def run_tandem(
    model: str, steps: int, lr: float, seed: int, reward: str, bf16: bool, lora: int = 0
) -> dict[str, Any]:
    from tandem.config import TandemConfig
    from tandem.orchestration.colocated import ColocatedTrainer
    from tandem.orchestration.parts import build_parts

    rewards: dict[str, Any] = {"task_reward": True}
    if reward == "digits":
        rewards = {
            "task_reward": False,
            "functions": [{"path": f"{Path(__file__).resolve()}:digit_fraction"}],
        }
    cfg = TandemConfig.model_validate(
        {
            "run": {"seed": seed},
            "model": {"path": model, "autocast_bf16": bf16, "lora": {"r": lora, "alpha": 16.0}},
            "data": {
                "task": "arith",
                "train_size": TRAIN_SIZE,
                "eval_size": 0,
                "prompts_per_step": PROMPTS_PER_STEP,
            },
            "reward": rewards,
            "rollout": {"n": SAMPLES, "max_new_tokens": NEW_TOKENS, "temperature": 1.0, "stop": []},
            "algorithm": {"name": "grpo", "beta": 0.0},
            "trainer": {
                "total_steps": steps,
                "lr": lr,
                "lr_schedule": "constant",
                "warmup_steps": 0,
                "max_grad_norm": 1.0,
            },
            "monitor": {"eval_every": 0, "sample_every": 0, "tensorboard": False, "progress": False},
            "checkpoint": {"save_final": False},
        }
    )
    trainer = ColocatedTrainer(build_parts(cfg))
    times, cpu, rewards_seen, lengths, phases = [], [], [], [], []
    for _ in range(steps):
        start, start_cpu = time.perf_counter(), time.process_time()
        metrics = trainer.train_step()
        times.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
        rewards_seen.append(metrics["reward/mean"])
        lengths.append(metrics["response/length_mean"])
        phases.append({k[7:]: v for k, v in metrics.items() if k.startswith("timing/")})
    return {"times": times, "cpu": cpu, "rewards": rewards_seen, "lengths": lengths, "phases": phases}


# -- TRL ---------------------------------------------------------------------------------------------------
def grpo_config(
    out: str,
    *,
    prompts_per_step: int,
    samples: int,
    new_tokens: int,
    lr: float,
    steps: int,
    seed: int,
    bf16: bool = False,
    checkpointing: bool = False,
    attn: str | None = None,
    lr_schedule: str = "constant",
    warmup_steps: int = 0,
) -> Any:
    """TRL ``GRPOConfig`` doing Tandem's ``grpo`` step: ``prompts_per_step`` × ``samples`` completions of at
    most ``new_tokens`` at temperature 1 (no top-k/top-p), group-std-normalised advantages, PPO clip 0.2,
    per-sequence mean (``loss_type="grpo"``), β = 0, the whole batch as one optimiser step, clip 1.0, no
    weight decay, no logging/saving/eval (also used by ``bench/learning.py``)."""
    from trl import GRPOConfig

    return GRPOConfig(
        output_dir=out,
        per_device_train_batch_size=prompts_per_step * samples,
        gradient_accumulation_steps=1,
        num_generations=samples,
        max_completion_length=new_tokens,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        learning_rate=lr,
        lr_scheduler_type=lr_schedule,
        warmup_steps=warmup_steps,
        weight_decay=0.0,
        max_grad_norm=1.0,
        max_steps=steps,
        beta=0.0,
        num_iterations=1,
        epsilon=0.2,
        loss_type="grpo",
        scale_rewards="group",
        gradient_checkpointing=checkpointing,
        bf16=bf16,
        model_init_kwargs={"attn_implementation": attn} if attn else None,
        use_cpu=True,
        seed=seed,
        report_to="none",
        logging_steps=10**9,
        save_strategy="no",
        eval_strategy="no",
        disable_tqdm=True,
        dataloader_num_workers=0,
    )


def run_trl(
    model: str,
    steps: int,
    lr: float,
    seed: int,
    reward: str,
    bf16: bool,
    checkpointing: bool,
    attn: str | None,
    lora: int = 0,
) -> dict[str, Any]:
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOTrainer

    from tandem.data import rows_from_task
    from tandem.rewards import get_task

    task = get_task("arith")
    rows = rows_from_task(task, "train", TRAIN_SIZE, seed).rows
    dataset = Dataset.from_dict(
        {"prompt": [r["prompt"] for r in rows], "answer": [r["answer"] for r in rows]}
    )
    base_fn = task.reward if reward == "arith" else digit_fraction
    rewards_seen: list[float] = []
    lengths: list[float] = []

    def reward_fn(prompts: list[str], completions: list[str], **kwargs: Any) -> list[float]:
        values = [float(v) for v in base_fn(prompts, completions, **kwargs)]
        rewards_seen.append(sum(values) / len(values))
        ids = kwargs["completion_ids"]
        lengths.append(sum(len(c) for c in ids) / len(ids))
        return values

    reward_fn.__name__ = reward

    class StepClock(TrainerCallback):
        """Wall time between consecutive optimiser-step ends (the first from the start of training)."""

        def __init__(self) -> None:
            self.marks: list[tuple[float, float]] = []

        def on_train_begin(self, args, state, control, **kw):  # noqa: ANN001
            self.marks.append((time.perf_counter(), time.process_time()))

        def on_step_end(self, args, state, control, **kw):  # noqa: ANN001
            self.marks.append((time.perf_counter(), time.process_time()))

    clock = StepClock()
    with tempfile.TemporaryDirectory() as out:
        args = grpo_config(
            out,
            prompts_per_step=PROMPTS_PER_STEP,
            samples=SAMPLES,
            new_tokens=NEW_TOKENS,
            lr=lr,
            steps=steps,
            seed=seed,
            bf16=bf16,
            checkpointing=checkpointing,
            attn=attn,
        )
        peft_config = None
        if lora:  # the same adapter as Tandem's model.lora: r, alpha 16, every linear layer but the LM head
            from peft import LoraConfig

            peft_config = LoraConfig(
                r=lora, lora_alpha=16, target_modules="all-linear", task_type="CAUSAL_LM"
            )
        trainer = GRPOTrainer(
            model=model,
            reward_funcs=[reward_fn],
            args=args,
            train_dataset=dataset,
            callbacks=[clock],
            peft_config=peft_config,
        )
        trainer.train()
    pairs = list(zip(clock.marks, clock.marks[1:], strict=False))
    times = [b[0] - a[0] for a, b in pairs]
    cpu = [b[1] - a[1] for a, b in pairs]
    return {"times": times, "cpu": cpu, "rewards": rewards_seen, "lengths": lengths, "phases": []}


# -- driver ------------------------------------------------------------------------------------------------
def child(args: argparse.Namespace) -> None:
    _setup_threads(args.threads)
    v = VARIANTS[args.variant]
    if v["system"] == "tandem":
        out = run_tandem(args.model, args.steps, args.lr, args.seed, args.reward, v["bf16"], args.lora)
    else:
        out = run_trl(
            args.model, args.steps, args.lr, args.seed, args.reward, v["bf16"], v["checkpointing"], v["attn"],
            args.lora,
        )  # fmt: skip
    out.update(variant=args.variant, reward=args.reward, seed=args.seed, peak_rss_mb=_peak_rss_mb())
    print("@@RESULT " + json.dumps(out), flush=True)


def spawn(args: argparse.Namespace, variant: str, reward: str, seed: int, model: str) -> dict[str, Any]:
    """Run one (variant, reward, seed) in a fresh interpreter and return its JSON result."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--variant", variant, "--reward", reward]
    cmd += ["--seed", str(seed), "--steps", str(args.steps), "--lr", str(args.lr)]
    cmd += ["--threads", str(args.threads), "--model", model, "--lora", str(args.lora)]
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    env.update(OMP_NUM_THREADS=str(args.threads), MKL_NUM_THREADS=str(args.threads))
    env.update(TOKENIZERS_PARALLELISM="false")
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    for line in proc.stdout.splitlines():
        if line.startswith("@@RESULT "):
            return json.loads(line[len("@@RESULT ") :])
    raise RuntimeError(f"{variant} run failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")


def summarise(runs: list[dict[str, Any]], warmup: int, last: int) -> dict[str, Any]:
    """Median step times (wall and CPU) past the warm-up steps of every run, peak RSS, final rewards."""
    wall = [t for r in runs for t in r["times"][warmup:]]
    cpu = [t for r in runs for t in r["cpu"][warmup:]]
    by_reward = {
        name: [statistics.mean(r["rewards"][-last:]) for r in runs if r["reward"] == name] for name in REWARDS
    }
    phases: dict[str, list[float]] = {}
    for r in runs:
        for p in r["phases"][warmup:]:
            for k, v in p.items():
                phases.setdefault(k, []).append(v)
    return {
        "wall": statistics.median(wall),
        "cpu": statistics.median(cpu),
        "peak_rss_mb": max(r["peak_rss_mb"] for r in runs),
        "reward": {k: (statistics.mean(v), min(v), max(v)) for k, v in by_reward.items() if v},
        "length": statistics.mean(x for r in runs for x in r["lengths"]),
        "phases": {k: statistics.median(v) for k, v in phases.items()},
        "steps_timed": len(wall),
    }


def print_table(summary: dict[str, dict[str, Any]], args: argparse.Namespace) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=160)
    table = Table(
        title=f"GRPO, tiny Llama 1.06M, {PROMPTS_PER_STEP} prompts × {SAMPLES} samples × ≤{NEW_TOKENS} "
        f"tokens, {args.steps} steps × {args.rounds} rounds × {len(REWARDS)} rewards, "
        f"{args.threads} thread(s)"
    )
    columns = ["variant", "s/step wall", "s/step CPU", "peak RSS MB", "mean len"]
    columns += [f"{r} reward (last {args.last})" for r in REWARDS]
    for col in columns:
        table.add_column(col, justify="left" if col == "variant" else "right")
    for name, m in summary.items():
        rw = {k: f"{v[0]:.3f} [{v[1]:.3f}–{v[2]:.3f}]" for k, v in m["reward"].items()}
        table.add_row(
            name,
            f"{m['wall']:.3f}",
            f"{m['cpu']:.3f}",
            f"{m['peak_rss_mb']:.0f}",
            f"{m['length']:.1f}",
            *(rw.get(r, "-") for r in REWARDS),
        )
    console.print(table)
    for name, m in summary.items():
        if m["phases"]:
            parts = ", ".join(
                f"{k} {v:.3f}" for k, v in m["phases"].items() if k not in ("step", "weight_sync")
            )
            console.print(f"{name} phases (median wall s): {parts}")


def ratios(summary: dict[str, dict[str, Any]]) -> dict[str, tuple[str, float, float]]:
    """Per precision: (fastest comparable TRL variant, wall ratio, CPU ratio) = TRL s/step ÷ Tandem s/step.
    ``trl-defaults`` (gradient checkpointing on) is shown in the table but not taken as the comparable."""
    out = {}
    for bf16 in (False, True):
        tandem = [n for n in summary if VARIANTS[n]["system"] == "tandem" and VARIANTS[n]["bf16"] == bf16]
        trl = [
            n
            for n in summary
            if VARIANTS[n]["system"] == "trl"
            and VARIANTS[n]["bf16"] == bf16
            and not VARIANTS[n]["checkpointing"]
        ]
        if tandem and trl:
            t = summary[tandem[0]]
            best = min(trl, key=lambda n: summary[n]["cpu"])
            out["bf16" if bf16 else "fp32"] = (
                best,
                summary[best]["wall"] / t["wall"],
                summary[best]["cpu"] / t["cpu"],
            )
    return out


def parent(args: argparse.Namespace) -> None:
    from rich.console import Console

    from tandem.models import init_tiny_model

    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        raise SystemExit(f"unknown variant(s) {', '.join(unknown)}; valid: {', '.join(VARIANTS)}")
    console = Console(width=160)
    runs: dict[str, list[dict[str, Any]]] = {v: [] for v in variants}
    with tempfile.TemporaryDirectory() as tmp:
        model = str(init_tiny_model(f"{tmp}/tiny", hidden_size=128, num_layers=4, num_heads=4, seed=0))
        turn = 0
        for r in range(args.rounds):
            for reward in REWARDS:
                order = variants if turn % 2 == 0 else variants[::-1]  # alternate who goes first
                turn += 1
                for variant in order:
                    res = spawn(args, variant, reward, args.seed + r, model)
                    runs[variant].append(res)
                    console.log(
                        f"round {r} {reward:>6} {variant:<15} "
                        f"wall {statistics.median(res['times'][args.warmup :]):.3f} "
                        f"cpu {statistics.median(res['cpu'][args.warmup :]):.3f} s/step, "
                        f"reward {statistics.mean(res['rewards'][-args.last :]):.3f}, "
                        f"peak {res['peak_rss_mb']:.0f} MB"
                    )
    summary = {v: summarise(runs[v], args.warmup, args.last) for v in variants}
    print_table(summary, args)
    if args.json:
        Path(args.json).write_text(
            json.dumps({"args": vars(args), "summary": summary, "runs": runs}, indent=1)
        )
    found = ratios(summary)
    for precision, (best, wall, cpu) in found.items():
        mine = "tandem-bf16" if precision == "bf16" else "tandem"
        print(f"{precision}: {best} ÷ {mine} = {wall:.2f}× wall-clock, {cpu:.2f}× CPU time (s/step)")
    if "trl-defaults" in summary and "tandem-bf16" in summary:
        d = summary["trl-defaults"]["cpu"] / summary["tandem-bf16"]["cpu"]
        print(f"trl-defaults (bf16 + gradient checkpointing) ÷ tandem-bf16 = {d:.2f}× CPU time")
    if found:
        # Conservative headline: the smaller CPU-time ratio over the precisions run.
        ratio = min(cpu for _, _, cpu in found.values())
        print(f"ratio: {ratio:.2f}× ({'Tandem' if ratio >= 1 else 'TRL'} faster)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30, help="training steps per run")
    parser.add_argument("--rounds", type=int, default=3, help="runs per variant and reward (seeds)")
    parser.add_argument("--warmup", type=int, default=2, help="first steps of each run left out of timing")
    parser.add_argument("--last", type=int, default=5, help="reward = mean over the last N steps")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch threads in every run")
    parser.add_argument(
        "--variants", default=",".join(VARIANTS), help="comma list of: " + ", ".join(VARIANTS)
    )
    parser.add_argument("--json", help="write every per-step result to this file")
    parser.add_argument(
        "--lora", type=int, default=0, help="LoRA rank for both systems (0: full fine-tuning)"
    )
    parser.add_argument("--variant", choices=list(VARIANTS), help=argparse.SUPPRESS)
    parser.add_argument("--reward", choices=REWARDS, default="arith", help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.variant:
        child(args)
    else:
        parent(args)


if __name__ == "__main__":
    main()
