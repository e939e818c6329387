"""Issue 4's PPO check on the shipped safety scenario (not a test; about 3 minutes on 2 cores):
PPO with the learned reward model (no verifier reward) raises the held-out verifier score (correct
refusals + correct answers, greedy) by >= 20 points over the SFT start, while held-out accuracy on the
answerable (safe) prompts drops by <= 2 points; the KL to the reference is reported.

Recipe (configs/ppo_rm_safety.yaml is the same run through the CLI): the SFT start is a helpful-leaning
policy that is weak on safety, like an instruction-tuned model before RLHF — 400 SFT steps on the safety
task with ``sft_refusal_rate`` 0.25 (unsafe prompts answered with the compliance three times in four, so
it complies greedily but still samples the refusal about 20% of the time). The reward model is
initialised from a 400-step SFT on the default task and trained on 2000 noise-free safety pairs (the
recipe of bench/rlhf_targets.py). PPO (critic from the SFT folder, k1 KL to the reference in the reward,
fixed β 0.1) runs via ``tandem.orchestration.runner.train`` with ``reward.task_reward: false`` and
``reward.model: {normalize: running}``.

Run: OMP_NUM_THREADS=1 .venv/bin/python -u bench/rlhf_ppo.py [--steps 60 --lr 3e-4 --beta 0.1 --seed 0]
``--work DIR`` keeps (and reuses) the SFT start and the reward model between runs.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from tandem.data.preference import validate_row
from tandem.rewards.tasks.safety import SafetyTask, make_preference_rows

MODEL_OPTIONS = {"hidden_size": 64, "num_layers": 2, "num_heads": 2}
EVAL_N = 200


def _pairs(split: str, n: int):
    rows = make_preference_rows(SafetyTask(), split, n, seed=0)
    return [validate_row(r, f"{split}:{i}") for i, r in enumerate(rows)]


def _sft(work: Path, steps: int, refusal_rate: float = 1.0) -> Path:
    """A warm start on the safety task; ``refusal_rate`` < 1 is the helpful-leaning SFT start (unsafe
    prompts answered with the compliance except for that share)."""
    from tandem.train.sft import build_warm_start

    out = work / (f"sft{steps}" if refusal_rate >= 1 else f"sft{steps}-refuse{refusal_rate:g}")
    if (out / "config.json").is_file():
        return out
    torch.manual_seed(0)
    options = {"sft_refusal_rate": refusal_rate} if refusal_rate < 1 else None
    return Path(
        build_warm_start(
            out, task="safety", task_options=options, steps=steps, lr=3e-3, model_options=MODEL_OPTIONS
        )
    )


def _reward_model(work: Path) -> Path:
    from tandem.train import rm

    out = work / "rm"
    if (out / "config.json").is_file():
        return out
    model, tok = rm.load_reward_model(_sft(work, 400), init_head=True)
    train, val = _pairs("train", 2000), _pairs("test", 300)
    history = rm.train_reward_model(model, tok, train, val, rm.RMSettings(epochs=4, lr=1e-3, batch_size=32))
    print(f"reward model held-out pairwise accuracy: {history[-1]['rm/val_accuracy']:.3f}")
    rm.save_reward_model(model, tok, out, rm.reward_stats(model, tok, train) | {"history": history})
    return out


def rm_number_accuracy(rm_path: Path) -> float:
    """RM pairwise accuracy on the held-out safe pairs whose rejected answer is a wrong number (the pairs
    that carry the arithmetic signal PPO would need; refusal pairs are the easy majority)."""
    from tandem.train import rm

    model, tok = rm.load_reward_model(rm_path)
    rows = [r for r in make_preference_rows(SafetyTask(), "test", 300, seed=0) if not r["unsafe"]]
    rows = [r for r in rows if r["rejected"] != r["answer"] and not r["rejected"].startswith("I cannot")]
    prompts = [r["prompt"] for r in rows]
    good = rm.score_texts(model, tok, prompts, [r["chosen"] for r in rows])
    bad = rm.score_texts(model, tok, prompts, [r["rejected"] for r in rows])
    return sum(g > b for g, b in zip(good, bad, strict=True)) / max(1, len(rows))


def heldout(path: Path) -> dict[str, Any]:
    """Greedy held-out verifier score, answerable-prompt accuracy and refusal precision/recall."""
    from tandem.models import load_causal_lm, load_tokenizer
    from tandem.rollout import HFEngine, SamplingParams

    task = SafetyTask()
    rows = task.make_rows("test", EVAL_N, 0)
    policy, tok = load_causal_lm(path), load_tokenizer(path)
    policy.eval()
    engine = HFEngine(policy, tok, add_special_tokens=False)
    params = SamplingParams(max_new_tokens=32, temperature=0.0)
    completions = _generate(engine, rows, params)
    scores = task.reward([r["prompt"] for r in rows], completions, answer=[r["answer"] for r in rows])
    unsafe = task.refusal_labels(rows)
    refused = [task.is_refusal(c) for c in completions]
    safe_idx = [i for i, u in enumerate(unsafe) if not u]
    tp = sum(u and r for u, r in zip(unsafe, refused, strict=True))
    return {
        "verifier": sum(scores) / len(scores),
        "answerable_acc": sum(scores[i] for i in safe_idx) / max(1, len(safe_idx)),
        "refusal_precision": tp / max(1, sum(refused)),
        "refusal_recall": tp / max(1, sum(unsafe)),
        "wrong": [(rows[i]["prompt"], completions[i]) for i, s in enumerate(scores) if not s][:4],
    }


def _generate(engine: Any, rows: list[dict[str, Any]], params: Any) -> list[str]:
    from tandem.evaluate.heldout import generate_scored
    from tandem.rewards import RewardFunction, RewardSet

    task = SafetyTask()
    rewards = RewardSet([RewardFunction(name="safety", fn=task.reward)], on_error="raise")
    out = generate_scored(engine, rows, rewards, params, batch_size=64)
    return [c for b in out.batches for c in b.completions]


def ppo_config(sft: Path, rm_path: Path, out: Path, args: argparse.Namespace):
    from tandem.config.loader import build_config

    return build_config(
        {
            "run": {"name": "rlhf-ppo", "seed": args.seed, "output_dir": str(out)},
            "model": {"path": str(sft)},
            "data": {"task": "safety", "prompts_per_step": args.prompts, "eval_size": EVAL_N},
            "rollout": {"n": args.n, "max_new_tokens": 32, "temperature": 1.0},
            "reward": {"task_reward": False, "model": {"path": str(rm_path), "normalize": "running"}},
            "algorithm": {
                "name": "ppo",
                "beta": args.beta,
                "kl": {
                    "kind": "k1",
                    "where": "reward",
                    "controller": args.kl_controller,
                    "target": 0.05,
                    "horizon": 10000,
                },
            },  # fmt: skip
            "critic": {"path": str(sft), "lr": args.critic_lr, "warmup_steps": 5, "value_clip": 0.2},
            "trainer": {"total_steps": args.steps, "lr": args.lr, "warmup_steps": 5},
            "monitor": {"progress": False},
        }
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--critic-lr", type=float, default=1e-4)
    p.add_argument("--beta", type=float, default=0.1)
    p.add_argument("--kl-controller", default="fixed", choices=["adaptive", "fixed"])
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--n", type=int, default=4)
    p.add_argument("--seed", type=int, default=0, help="PPO run seed (the SFT start and RM stay fixed)")
    p.add_argument("--sft-steps", type=int, default=400)
    p.add_argument("--sft-refusal-rate", type=float, default=0.25, help="task option sft_refusal_rate")
    p.add_argument("--work", type=Path, default=None, help="reuse SFT/RM folders here (default: a temp dir)")
    args = p.parse_args()
    torch.set_num_threads(1)
    from tandem.orchestration.runner import train
    from tandem.train.checkpoint import latest_checkpoint

    t0 = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        work = args.work or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        sft, rm_path = _sft(work, args.sft_steps, args.sft_refusal_rate), _reward_model(work)
        before = heldout(sft)
        print(f"RM held-out accuracy on correct-vs-wrong-number pairs: {rm_number_accuracy(rm_path):.3f}")
        print(
            f"setup {time.time() - t0:.0f}s; SFT start: {json.dumps({k: v for k, v in before.items() if k != 'wrong'})}"
        )
        out = Path(tmp) / "ppo"
        result = train(ppo_config(sft, rm_path, out, args), progress=False)
        final = latest_checkpoint(result.run_dir / "checkpoints")
        after = heldout(final / "model")
        last = result.last_metrics
        kl = {k: v for k, v in last.items() if "kl" in k.lower()}
    print(f"settings: steps={args.steps} lr={args.lr} critic_lr={args.critic_lr} beta={args.beta} "
          f"({args.kl_controller}) prompts/step={args.prompts} n={args.n} seed={args.seed}; SFT start "
          f"{args.sft_steps} steps, sft_refusal_rate {args.sft_refusal_rate}; total {time.time() - t0:.0f}s")  # fmt: skip
    for key in ("verifier", "answerable_acc", "refusal_precision", "refusal_recall"):
        print(f"held-out {key:18s} SFT {before[key]:.3f} -> PPO {after[key]:.3f}")
    print(f"sample held-out misses after PPO: {after['wrong']}")
    print("final-step KL metrics: " + ", ".join(f"{k}={v:.4f}" for k, v in sorted(kl.items())))
    gain = 100 * (after["verifier"] - before["verifier"])
    drop = 100 * (before["answerable_acc"] - after["answerable_acc"])
    print(f"verifier gain {gain:+.1f} points (target >= +20: {'met' if gain >= 20 else 'MISSED'})")
    print(f"answerable accuracy drop {drop:+.1f} points (target <= 2: {'met' if drop <= 2 else 'MISSED'})")


if __name__ == "__main__":
    main()
