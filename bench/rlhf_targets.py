"""Issue 4's acceptance targets on the shipped safety scenario (~3-7 min on 2 cores; not a test —
the test suite guards learning on small budgets in tests/unit/train/test_rm.py and test_dpo.py):
reward model held-out pairwise accuracy >= 0.9 on the noise-free set (RM initialised from the SFT
policy, as in the standard recipe), and DPO held-out implicit-reward accuracy >= 0.85 with a higher
held-out verifier score than its SFT start.

Run: OMP_NUM_THREADS=1 .venv/bin/python bench/rlhf_targets.py
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import torch

from tandem.data.preference import validate_row
from tandem.rewards.tasks.safety import SafetyTask, make_preference_rows


def _pairs(split: str, n: int):
    rows = make_preference_rows(SafetyTask(), split, n, seed=0)
    return [validate_row(r, f"{split}:{i}") for i, r in enumerate(rows)]


def _sft(tmp_path, steps: int):
    from tandem.train.sft import build_warm_start

    torch.manual_seed(0)
    return build_warm_start(
        tmp_path / f"sft{steps}", task="safety", steps=steps, lr=3e-3,
        model_options={"hidden_size": 64, "num_layers": 2, "num_heads": 2},
    )  # fmt: skip


def reward_model_target(tmp_path) -> float:
    from tandem.train import rm

    model, tok = rm.load_reward_model(_sft(tmp_path, 400), init_head=True)
    settings = rm.RMSettings(epochs=4, lr=1e-3, batch_size=32)
    history = rm.train_reward_model(model, tok, _pairs("train", 2000), _pairs("test", 300), settings)
    for epoch, row in enumerate(history, 1):
        print(f"rm epoch {epoch}: held-out pairwise accuracy {row['rm/val_accuracy']:.3f}")
    return history[-1]["rm/val_accuracy"]


def dpo_target(tmp_path) -> tuple[float, float, float]:
    from tandem.evaluate.heldout import evaluate_prompts
    from tandem.models import load_causal_lm, load_tokenizer
    from tandem.rewards import RewardFunction, RewardSet
    from tandem.rollout import HFEngine, SamplingParams
    from tandem.train import dpo

    path = _sft(tmp_path, 150)
    policy, tok = load_causal_lm(path), load_tokenizer(path)
    task = SafetyTask()
    rows = task.make_rows("test", 200, 0)
    rewards = RewardSet([RewardFunction(name="safety", fn=task.reward)], on_error="raise")

    def verifier() -> float:
        engine = HFEngine(policy, tok, add_special_tokens=False)
        return evaluate_prompts(engine, rows, rewards, SamplingParams(max_new_tokens=32, temperature=0.0))[
            "eval/accuracy"
        ]

    train, val = _pairs("train", 2000), _pairs("test", 300)
    ref_train, ref_val = dpo.reference_logps(policy, tok, train), dpo.reference_logps(policy, tok, val)
    before = verifier()
    settings = dpo.DPOSettings(beta=0.1, lr=2e-4, batch_size=16, epochs=1, sft_coef=1.0)
    dpo.train_dpo(policy, tok, train, ref_train, settings)
    held_out = dpo.implicit_reward_metrics(policy, tok, val, ref_val, settings.beta)
    after = verifier()
    return held_out["rewards/accuracies"], before, after


def main() -> None:
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        acc = reward_model_target(Path(tmp))
        dpo_acc, before, after = dpo_target(Path(tmp))
    print(
        f"reward model held-out pairwise accuracy: {acc:.3f} (target >= 0.90: {'met' if acc >= 0.9 else 'MISSED'})"
    )
    print(
        f"DPO held-out implicit-reward accuracy:   {dpo_acc:.3f} (target >= 0.85: {'met' if dpo_acc >= 0.85 else 'MISSED'})"
    )
    print(f"DPO held-out verifier score: SFT start {before:.3f} -> {after:.3f}")


if __name__ == "__main__":
    main()
