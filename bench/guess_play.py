"""How a model plays the ``guess`` game (issue 16): success, turns and whether it uses the feedback.

Plays ``--prompts`` held-out games (the ``guess`` task's ``test`` split, secrets in ``1..--high``) against
the ``guess`` environment with ``--max-turns`` tries, greedy (one game per prompt) and at temperature 1
(``--n`` games per prompt, as GRPO samples them), and prints per mode: success rate, return and turns per
game, the share of games cut by ``max_turns`` or the model's positions, the share of prompts whose ``n``
sampled returns are all equal (a GRPO group without signal), and per guess: ``consistent`` (inside the
interval the feedback so far leaves), ``bisect`` (the midpoint of that interval), ``non-number`` and
``repeat``. It is the diagnosis behind docs/benchmarks.md's guess sections: a warm start that never
bisects gives GRPO only luck to reinforce.

    OMP_NUM_THREADS=1 .venv/bin/python bench/guess_play.py MODEL [--high 10] [--max-turns 4] [--prompts 64]
"""

from __future__ import annotations

import argparse
import os
import re
from collections import Counter

import torch

from tandem.agents.guess import GuessNumber
from tandem.data import rows_from_task
from tandem.models import load_causal_lm, load_tokenizer
from tandem.rewards import get_task
from tandem.rollout.base import SamplingParams
from tandem.rollout.episodes import EpisodeRunner, EpisodeSettings
from tandem.rollout.hf import HFEngine


def guesses(conversation: str, secret: int, high: int) -> Counter:
    """Per-guess counts of one game: ``n``, ``consistent``, ``bisect``, ``nonnum``, ``repeat``."""
    lo, hi, seen, out = 1, high, set(), Counter()
    # a guess that ended on EOS has no newline of its own: the feedback line follows on the same line
    lines = re.sub(r"(?<=[^\n])(higher|lower|a number please)\n", r"\n\1\n", conversation).split("\n")
    for line in lines[0::2]:  # guesses and feedback lines alternate
        if not line:
            continue
        out["n"] += 1
        if not line.lstrip("-").isdigit():
            out["nonnum"] += 1
            continue
        v = int(line)
        out["consistent"] += lo <= v <= hi
        out["bisect"] += v == (lo + hi) // 2
        out["repeat"] += v in seen
        seen.add(v)
        lo, hi = (max(lo, v + 1), hi) if v < secret else (lo, min(hi, v - 1)) if v > secret else (lo, hi)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--high", type=int, default=10)
    ap.add_argument("--max-turns", type=int, default=4)
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    torch.manual_seed(args.seed)
    model, tok = load_causal_lm(args.model), load_tokenizer(args.model)
    settings = EpisodeSettings(
        max_turns=args.max_turns, max_context_tokens=model.config.max_position_embeddings
    )
    runner = EpisodeRunner(HFEngine(model, tok), GuessNumber, settings, tokenizer=tok)
    rows = rows_from_task(get_task("guess", high=args.high), "test", args.prompts, args.seed).rows
    prompts, extras = [r["prompt"] for r in rows], [{"secret": r["secret"]} for r in rows]
    for label, temperature, n in (("greedy", 0.0, 1), ("sampled", 1.0, args.n)):
        params = SamplingParams(max_new_tokens=4, temperature=temperature, n=n, stop=["\n"], seed=args.seed)
        batch = runner.generate(prompts, params, extras=extras)
        assert runner.last is not None
        returns, m = runner.last.returns, runner.last.metrics  # [B] float
        per = Counter()
        for b, (x, c) in enumerate(zip(batch.extras, batch.completions, strict=True)):
            per += guesses(x.get("conversation", c), extras[b // n]["secret"], args.high)
        groups = returns.view(-1, n)  # [prompts, n]
        equal = float((groups == groups[:, :1]).all(dim=1).float().mean()) if n > 1 else float("nan")
        guessed = max(1, per["n"])
        print(
            f"{label:8s} success {float((returns > 0).float().mean()):.2f}  return {float(returns.mean()):.3f}  "
            f"turns {m['agent/turns_mean']:.2f}  out of turns {m['agent/unfinished_frac']:.2f}  "
            f"context full {m['agent/context_full']:.0f}  all-equal groups {equal:.2f}  |  per guess: "
            + "  ".join(f"{k} {per[k] / guessed:.2f}" for k in ("consistent", "bisect", "nonnum", "repeat")),
            flush=True,
        )
        print(f"{'':8s} e.g. {x.get('conversation', c)!r}", flush=True)
    print(f"load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
