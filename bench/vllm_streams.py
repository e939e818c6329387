"""Are the groups of one vLLM batch independent samples? Both engines side by side, same model and prompts.

vLLM seeds sample ``j`` of a request with ``seed + j``; a batch whose prompts got seeds one apart made
prompt ``i + 1``'s sample ``j`` reuse prompt ``i``'s sample ``j + 1`` random stream. Two measurements,
each for the HF engine and vLLM on the quickstart warm start:

* three copies of one prompt, ``n`` = 8 at temperature 1.5: distinct completions among the 24, and whether
  copy 1's sample ``j`` equals copy 0's sample ``j + 1`` for every ``j`` (shifted copies: shared streams);
* ``12+7=`` and ``13+6=`` (both answer 19), ``n`` = 8 at temperature 1, over ``--seeds`` batch seeds: how
  often the second prompt's sample ``j`` equals the first's sample ``j + 1`` (the pairs that shared a
  stream) against sample ``j`` (pairs that never did). Independent groups give about the same rate.

    OMP_NUM_THREADS=1 .venv/bin/python bench/vllm_streams.py [--seeds 40]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from tandem.rollout import EngineSpec, SamplingParams, build_engine

MODEL = Path(__file__).resolve().parents[1] / "checkpoints" / "quickstart-warmstart"


def copies(engine) -> tuple[int, bool]:
    """Distinct completions of three copies of one prompt (8 samples each), and whether they are shifted
    copies of one another."""
    batch = engine.generate(
        ["12+7="] * 3, SamplingParams(max_new_tokens=6, temperature=1.5, n=8, seed=5, stop=[])
    )
    rows = [tuple(r[m].tolist()) for r, m in zip(batch.response_ids, batch.response_mask, strict=True)]
    groups = [rows[8 * i : 8 * i + 8] for i in range(3)]
    shifted = all(groups[i + 1][j] == groups[i][j + 1] for i in range(2) for j in range(7))
    return len(set(rows)), shifted


def coupling(engine, seeds: int) -> tuple[float, float]:
    """Identical-completion rates of the stream-sharing pairs and of the other pairs of two prompts."""
    shared = other = total = 0
    for seed in range(seeds):
        done = engine.generate(
            ["12+7=", "13+6="], SamplingParams(max_new_tokens=6, temperature=1.0, n=8, seed=seed, stop=[])
        ).completions
        for j in range(7):
            shared += done[8 + j] == done[j + 1]
            other += done[8 + j] == done[j]
            total += 1
    return shared / total, other / total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=40, help="Batch seeds of the two-prompt measurement.")
    args = parser.parse_args()
    print(
        "| engine | distinct of 24 (3 copies) | shifted copies | identical, stream-sharing pairs | identical, other pairs |"
    )
    print("|---|---:|---|---:|---:|")
    for name in ("hf", "vllm"):
        engine = build_engine(name, EngineSpec(path=str(MODEL)))
        try:
            distinct, shifted = copies(engine)
            shared, other = coupling(engine, args.seeds)
        finally:
            engine.close()
        print(f"| {name} | {distinct} | {'yes' if shifted else 'no'} | {shared:.2f} | {other:.2f} |")


if __name__ == "__main__":
    main()
