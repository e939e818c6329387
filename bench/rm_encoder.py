"""Encoder reward model on the shipped safety preference set (not a test; a few minutes on 2 cores).

A tiny BERT (hidden 64, 2 layers, WordPiece vocabulary trained on the training pairs' text, randomly
initialised) trained as ``tandem rm`` would (Bradley–Terry, 4 epochs, batch 32), beside a randomly
initialised causal-LM head of the same width (the char-level Llama of ``tandem init-model``). Prints
held-out pairwise accuracy per epoch and seconds per epoch for both, so docs/rlhf.md can quote them.

Run: OMP_NUM_THREADS=1 .venv/bin/python bench/rm_encoder.py [--lr 1e-3] [--epochs 4]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch

from tandem.data.preference import validate_row
from tandem.rewards.tasks.safety import SafetyTask, make_preference_rows


def _pairs(split: str, n: int):
    rows = make_preference_rows(SafetyTask(), split, n, seed=0)
    return [validate_row(r, f"{split}:{i}") for i, r in enumerate(rows)]


def _run(name: str, folder: Path, train, val, lr: float, epochs: int) -> None:
    from tandem.train import rm

    torch.manual_seed(0)
    model, tok = rm.load_reward_model(folder, init_head=True)
    params = sum(p.numel() for p in model.parameters())
    start = time.perf_counter()
    history = rm.train_reward_model(
        model, tok, train, val, rm.RMSettings(epochs=epochs, lr=lr, batch_size=32)
    )
    per_epoch = (time.perf_counter() - start) / epochs
    accs = " → ".join(f"{row['rm/val_accuracy']:.3f}" for row in history)
    print(f"{name} ({params / 1e3:.0f}k params): held-out pairwise accuracy {accs}; {per_epoch:.1f} s/epoch")


def main() -> None:
    from tandem.models import init_tiny_model
    from tandem.models.encoder import build_tiny_encoder

    parser = argparse.ArgumentParser()
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--epochs", type=int, default=4)
    args = parser.parse_args()
    torch.set_num_threads(1)
    train, val = _pairs("train", 2000), _pairs("test", 300)
    texts = [f"{p.prompt} {p.chosen} {p.rejected}" for p in train]
    with tempfile.TemporaryDirectory() as tmp:
        bert = build_tiny_encoder(Path(tmp) / "bert", texts, hidden_size=64, num_layers=2, num_heads=2)
        llama = init_tiny_model(Path(tmp) / "llama", hidden_size=64, num_layers=2, num_heads=2, seed=0)
        _run("tiny BERT encoder", bert, train, val, args.lr, args.epochs)
        _run("tiny Llama causal head", llama, train, val, args.lr, args.epochs)


if __name__ == "__main__":
    main()
