"""Which off-policy correction keeps learning at lag η = 2? One run per loss on ``bench/architectures.py``'s
workload (``arith`` from the quickstart warm start, 150 steps × 128 samples, one worker + one learner);
prints the held-out greedy accuracy after training (a decoupled run can move by about a point between
repeats: timing decides which batch sees which policy version).

    .venv/bin/python bench/lag_corrections.py [--steps 150] [--only NAME ...]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from architectures import config  # noqa: E402

ETA2 = {"mode": "decoupled", "staleness": 2}
VARIANTS: dict[
    str, tuple[dict, dict, dict]
] = {  # name: (architecture, algorithm overrides, trainer overrides)
    "colocated (reference)": ({"mode": "colocated"}, {}, {}),
    "η=1 decoupled_ppo (reference)": ({"mode": "decoupled", "staleness": 1}, {}, {}),
    "ppo_clip, no correction": (ETA2, {"name": "grpo", "policy_loss": "ppo_clip"}, {}),
    "agro": (ETA2, {"name": "agro"}, {}),
    "ppo_clip + token_rs 0.8-1.25": (
        ETA2,
        {
            "name": "grpo",
            "policy_loss": "ppo_clip",
            "correction": "token_rs",
            "correction_low": 0.8,
            "correction_high": 1.25,
        },
        {},
    ),  # fmt: skip
    "decoupled_ppo cap 1.0": (ETA2, {"correction_high": 1.0}, {}),
    "decoupled_ppo cap 1.1": (ETA2, {"correction_high": 1.1}, {}),
    "decoupled_ppo cap 1.2": (ETA2, {"correction_high": 1.2}, {}),
    "decoupled_ppo cap 2.0 (default)": (ETA2, {}, {}),
    "topr": (ETA2, {"name": "topr"}, {}),
    "decoupled_ppo lr 1.2e-3": (ETA2, {}, {"lr": 1.2e-3}),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--only", nargs="*", choices=list(VARIANTS), help="run only these variants")
    args = ap.parse_args()
    import torch

    torch.set_num_threads(1)
    from tandem.config import build_config
    from tandem.orchestration.runner import train

    print("| loss (η = 2 unless named) | accuracy after | wall s |\n|---|---:|---:|")
    for name in args.only or list(VARIANTS):
        arch, algo, trainer = VARIANTS[name]
        with tempfile.TemporaryDirectory() as tmp:
            raw = config(arch, Path(tmp) / "run", args.steps)
            raw["algorithm"].update(algo)
            raw["trainer"].update(trainer)
            t0 = time.perf_counter()
            result = train(build_config(raw), progress=False)
            print(
                f"| {name} | {result.eval_after['eval/accuracy']:.3f} | {time.perf_counter() - t0:.1f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
