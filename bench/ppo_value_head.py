"""Separate critic vs shared-backbone value head (``critic.shared_backbone``) on one small PPO run.

Both runs start from the quickstart's shipped warm start (``checkpoints/quickstart-warmstart``), draw the
same prompts (same seed) and use ``configs/ppo.yaml`` scaled down: ``--steps`` steps × 8 prompts × 4
samples, 8 new tokens, critic lr 1e-4 without warm-up. The separate critic is a full copy of the policy
(``critic.path`` unset); the shared head is one ``Linear(hidden, 1)`` on the policy. Reported per run:
mean seconds per step (``timing/step``, steps 2..N), mean ``timing/logprob`` and ``timing/update``, and
the mean ``critic/vf_loss`` and ``critic/explained_var`` of the first and last 5 steps. One torch thread.

    OMP_NUM_THREADS=1 .venv/bin/python bench/ppo_value_head.py [--steps 30]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

import torch

from tandem.config import load_config
from tandem.orchestration.runner import train

ROOT = Path(__file__).resolve().parents[1]


def run(shared: bool, steps: int, out: Path) -> dict[str, float]:
    overrides = [
        f"run.output_dir={out}",
        "data.prompts_per_step=8",
        "data.eval_size=0",
        "rollout.n=4",
        f"trainer.total_steps={steps}",
        "trainer.warmup_steps=0",
        "critic.warmup_steps=0",
        f"critic.shared_backbone={'true' if shared else 'false'}",
        "checkpoint.every=0",
        "checkpoint.save_final=false",
        "monitor.eval_every=0",
        "monitor.sample_every=0",
        "monitor.tensorboard=false",
        "monitor.progress=false",
    ]
    cfg = load_config(ROOT / "configs" / "ppo.yaml", overrides)
    train(cfg, progress=False)
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if r["step"] >= 1 and "timing/step" in r]
    head, tail, steady = rows[:5], rows[-5:], rows[1:]
    return {
        "s_per_step": statistics.mean(r["timing/step"] for r in steady),
        "logprob_s": statistics.mean(r["timing/logprob"] for r in steady),
        "update_s": statistics.mean(r["timing/update"] for r in steady),
        "vf_loss_first5": statistics.mean(r["critic/vf_loss"] for r in head),
        "vf_loss_last5": statistics.mean(r["critic/vf_loss"] for r in tail),
        "explained_var_first5": statistics.mean(r["critic/explained_var"] for r in head),
        "explained_var_last5": statistics.mean(r["critic/explained_var"] for r in tail),
        "reward_last5": statistics.mean(r["reward/mean"] for r in tail),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        for name, shared in (("separate critic", False), ("shared head", True)):
            result = run(shared, args.steps, Path(tmp) / name.replace(" ", "_"))
            print(json.dumps({"system": name, **{k: round(v, 4) for k, v in result.items()}}), flush=True)


if __name__ == "__main__":
    main()
