"""DPO step time, peak memory and implicit-reward accuracy: TRL's ``DPOTrainer`` vs ``tandem dpo``.

Same starting HF folder (a tiny character-level Llama, hidden 128, 4 layers, 4 heads, built once), the
same preference pairs (the shipped ``safety`` set, 2000 train pairs), the same batch size (8 pairs per
optimiser step), sigmoid loss with β = 0.1, AdamW at the same constant learning rate, gradient clipping
at 1.0, fp32, no evaluation, no checkpoints. Variants:

- ``tandem``: ``tandem.train.dpo`` — reference log-probs computed once before training (that time is
  reported separately as ``ref s``), one policy forward/backward of the 2B stacked rows per step;
- ``trl``: ``DPOTrainer`` with its defaults (a reference forward at every step);
- ``trl-precompute``: ``DPOTrainer`` with ``precompute_ref_log_probs=True`` (TRL's own cache);
- ``tandem-full-rows`` (only with ``--variants``): ``tandem`` with ``shared_prefix=False`` — each pair's
  prompt runs twice, once per completion, as before 2026-11-29.

Each (variant, round) is a separate subprocess (one JSON line back), run one at a time with the variant
order reversed every round, so peak RSS is per variant. Every run sets ``torch.set_num_threads(--threads)``
(1 by default). Step time is the median over all steps after ``--warmup`` of all runs, wall-clock and
process CPU time (steadier when other jobs share the cores; the ratio line uses CPU time). Final
``rewards/accuracies`` is the mean of the last 10 steps' training-batch values (TRL logs the same metric).

    .venv/bin/python bench/dpo_vs_trl.py [--steps 40] [--rounds 2] [--threads 1]
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

BATCH = 8
BETA = 0.1
TRAIN_PAIRS = 2000
VARIANTS = ("tandem", "trl", "trl-precompute")
EXTRA_VARIANTS = ("tandem-full-rows",)


def _rows(seed: int) -> list[dict[str, Any]]:
    from tandem.rewards.tasks.safety import SafetyTask, make_preference_rows

    rows = make_preference_rows(SafetyTask(), "train", TRAIN_PAIRS, seed)
    return [{"prompt": r["prompt"], "chosen": r["chosen"], "rejected": r["rejected"]} for r in rows]


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def run_tandem(
    model_dir: str, steps: int, lr: float, seed: int, shared_prefix: bool = True
) -> dict[str, Any]:
    from tandem.data.preference import validate_row
    from tandem.models import load_causal_lm, load_tokenizer
    from tandem.train import dpo

    tok = load_tokenizer(model_dir)
    pairs = [validate_row(r, f"row {i}") for i, r in enumerate(_rows(seed))]
    t0 = time.perf_counter()
    ref_model = load_causal_lm(model_dir)
    ref = dpo.reference_logps(ref_model, tok, pairs, batch_size=64)
    del ref_model
    ref_s = time.perf_counter() - t0
    policy = load_causal_lm(model_dir)
    settings = dpo.DPOSettings(
        beta=BETA,
        lr=lr,
        batch_size=BATCH,
        max_steps=steps,
        warmup_steps=0,
        seed=seed,
        shared_prefix=shared_prefix,
    )
    marks = [(time.perf_counter(), time.process_time())]
    acc: list[float] = []

    def on_step(step: int, metrics: dict[str, float]) -> None:
        marks.append((time.perf_counter(), time.process_time()))
        acc.append(metrics["rewards/accuracies"])

    dpo.train_dpo(policy, tok, pairs, ref, settings, on_step=on_step)
    return _result(marks, acc) | {"ref_s": ref_s}


def run_trl(model_dir: str, steps: int, lr: float, seed: int, precompute: bool) -> dict[str, Any]:
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, TrainerCallback
    from trl import DPOConfig, DPOTrainer

    from tandem.models import load_tokenizer

    tok = load_tokenizer(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True)
    marks: list[tuple[float, float]] = []
    acc: list[float] = []

    class Clock(TrainerCallback):
        def on_train_begin(self, args, state, control, **kw):  # noqa: ANN001
            marks.append((time.perf_counter(), time.process_time()))

        def on_step_end(self, args, state, control, **kw):  # noqa: ANN001
            marks.append((time.perf_counter(), time.process_time()))

        def on_log(self, args, state, control, logs=None, **kw):  # noqa: ANN001
            if logs and "rewards/accuracies" in logs:
                acc.append(float(logs["rewards/accuracies"]))

    with tempfile.TemporaryDirectory() as out:
        args = DPOConfig(
            output_dir=out, per_device_train_batch_size=BATCH, gradient_accumulation_steps=1,
            learning_rate=lr, lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0,
            max_grad_norm=1.0, max_steps=steps, beta=BETA, loss_type="sigmoid",
            precompute_ref_log_probs=precompute, use_cpu=True, seed=seed, report_to="none",
            logging_steps=1, save_strategy="no", eval_strategy="no", disable_tqdm=True,
            dataloader_num_workers=0, bf16=False,
        )  # fmt: skip
        t0 = time.perf_counter()
        trainer = DPOTrainer(
            model=model,
            args=args,
            train_dataset=Dataset.from_list(_rows(seed)),
            processing_class=tok,
            callbacks=[Clock()],
        )
        setup_s = time.perf_counter() - t0
        trainer.train()
    return _result(marks, acc) | {"ref_s": setup_s}


def _result(marks: list[tuple[float, float]], acc: list[float]) -> dict[str, Any]:
    pairs = list(zip(marks, marks[1:], strict=False))
    return {"times": [b[0] - a[0] for a, b in pairs], "cpu": [b[1] - a[1] for a, b in pairs], "acc": acc}


def child(args: argparse.Namespace) -> None:
    import torch

    torch.set_num_threads(args.threads)
    torch.set_num_interop_threads(1)
    if args.variant.startswith("tandem"):
        out = run_tandem(args.model, args.steps, args.lr, args.seed, shared_prefix=args.variant == "tandem")
    else:
        out = run_trl(args.model, args.steps, args.lr, args.seed, precompute=args.variant == "trl-precompute")
    out.update(variant=args.variant, peak_rss_mb=_peak_rss_mb())
    print("@@RESULT " + json.dumps(out), flush=True)


def spawn(args: argparse.Namespace, variant: str, model: str) -> dict[str, Any]:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--variant", variant, "--model", model]
    cmd += [
        "--steps",
        str(args.steps),
        "--lr",
        str(args.lr),
        "--seed",
        str(args.seed),
        "--threads",
        str(args.threads),
    ]
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    env.update(
        OMP_NUM_THREADS=str(args.threads), MKL_NUM_THREADS=str(args.threads), TOKENIZERS_PARALLELISM="false"
    )
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    for line in proc.stdout.splitlines():
        if line.startswith("@@RESULT "):
            return json.loads(line[len("@@RESULT ") :])
    raise RuntimeError(f"{variant} run failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")


def parent(args: argparse.Namespace) -> None:
    from tandem.models import init_tiny_model

    with tempfile.TemporaryDirectory() as tmp:
        model = str(init_tiny_model(Path(tmp) / "tiny", hidden_size=128, num_layers=4, num_heads=4, seed=0))
        runs: dict[str, list[dict[str, Any]]] = {v: [] for v in args.variants}
        for r in range(args.rounds):
            order = list(args.variants) if r % 2 == 0 else list(reversed(args.variants))
            for variant in order:
                print(f"round {r + 1}/{args.rounds}: {variant} ...", file=sys.stderr, flush=True)
                runs[variant].append(spawn(args, variant, model))
    summary = {}
    for variant, rs in runs.items():
        summary[variant] = {
            "wall": statistics.median([t for x in rs for t in x["times"][args.warmup :]]),
            "cpu": statistics.median([t for x in rs for t in x["cpu"][args.warmup :]]),
            "rss": max(x["peak_rss_mb"] for x in rs),
            "acc": statistics.mean(statistics.mean(x["acc"][-10:]) for x in rs),
            "ref": statistics.mean(x["ref_s"] for x in rs),
        }
    print(f"\nDPO, tiny Llama 128x4, batch {BATCH} pairs, beta {BETA}, {args.steps} steps x {args.rounds} rounds, "
          f"{args.threads} thread(s)")  # fmt: skip
    print(
        f"{'variant':<16}{'s/step wall':>12}{'s/step cpu':>12}{'peak RSS MB':>13}{'setup/ref s':>13}{'rewards/acc':>13}"
    )
    for v, s in summary.items():
        print(
            f"{v:<16}{s['wall']:>12.4f}{s['cpu']:>12.4f}{s['rss']:>13.0f}{s['ref']:>13.2f}{s['acc']:>13.3f}"
        )
    if "tandem" in summary:
        for v in summary:
            if v != "tandem":
                print(f"ratio {v} / tandem (cpu s/step): {summary[v]['cpu'] / summary['tandem']['cpu']:.2f}x "
                      f"(wall {summary[v]['wall'] / summary['tandem']['wall']:.2f}x)")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variant", choices=VARIANTS + EXTRA_VARIANTS, help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    ap.add_argument("--variants", nargs="+", choices=VARIANTS + EXTRA_VARIANTS, default=list(VARIANTS))
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--lr", type=float, default=5e-4)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    if args.variant:
        child(args)
    else:
        parent(args)


if __name__ == "__main__":
    main()
