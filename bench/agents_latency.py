"""Environment latency hiding (issue 16): wall time of one step's episodes with a 50 ms tool, the
environment steps of a turn run one after another vs concurrently.

A tiny char Llama (HF engine, 1 torch thread) runs ``--prompts`` x ``--n`` episodes of ``--turns``
turns against an async environment whose every step sleeps ``--latency`` seconds (a tool call's
latency) and answers with a short observation. Arms (same seed, same episodes):

- ``no env``: the same number of engine turns with no environment latency (generation alone; the
  environment answers at once);
- ``serial``: ``env.concurrent=false``: every episode's step waits for the previous one;
- ``concurrent``: ``env.concurrent=true`` (the default): a turn's steps overlap.

The ideal concurrent cost over generation alone is ``latency x turns`` (steps of a turn overlap fully);
serial costs ``latency x turns x episodes``. ``env wait`` is the step's ``timing/env`` (seconds the
loop waited on environments), which generation noise does not blur. The machine is shared: the load
average is printed beside.

    OMP_NUM_THREADS=1 .venv/bin/python bench/agents_latency.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time

import torch


class Tool:
    """Every step waits ``latency`` seconds (a tool call), then answers; never done before max_turns."""

    latency = 0.05

    def reset(self, row):
        return row["prompt"]

    async def step(self, action):
        if self.latency:
            await asyncio.sleep(self.latency)
        return "RESULT 42\n", 0.0, False, {"tool_calls": 1}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--latency", type=float, default=0.05)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(1)
    from tandem.models import init_tiny_model, load_causal_lm, load_tokenizer
    from tandem.rollout import EngineSpec, build_engine
    from tandem.rollout.base import SamplingParams
    from tandem.rollout.episodes import EpisodeRunner, EpisodeSettings

    with tempfile.TemporaryDirectory() as tmp:
        path = init_tiny_model(f"{tmp}/m", seed=0)
        model, tok = load_causal_lm(path), load_tokenizer(path)
    engine = build_engine("hf", EngineSpec(model=model, tokenizer=tok))
    prompts = [f"{10 + i}*{20 + i}=" for i in range(args.prompts)]
    params = SamplingParams(max_new_tokens=8, temperature=1.0, n=args.n, stop=["\n"], seed=0)
    arms = {"no env": (0.0, True), "serial": (args.latency, False), "concurrent": (args.latency, True)}
    times: dict[str, list[float]] = {a: [] for a in arms}
    waits: dict[str, list[float]] = {a: [] for a in arms}  # timing/env: seconds waiting on the environment
    for _ in range(args.repeats):
        for arm, (latency, concurrent) in arms.items():
            env = type("T", (Tool,), {"latency": latency})
            runner = EpisodeRunner(engine, env, EpisodeSettings(max_turns=args.turns, concurrent=concurrent))
            t0 = time.perf_counter()
            runner.generate(prompts, params)
            times[arm].append(time.perf_counter() - t0)
            waits[arm].append(runner.last.metrics["timing/env"])
            assert runner.last.metrics["agent/turns_mean"] == args.turns
    episodes = args.prompts * args.n
    print(
        f"{episodes} episodes x {args.turns} turns, tool latency {args.latency * 1000:.0f} ms, "
        f"load average {os.getloadavg()[0]:.2f}"
    )
    print(f"{'arm':<12} {'median s/step':>14} {'over no env':>12} {'env wait s':>11}")
    base = statistics.median(times["no env"])
    for arm in arms:
        med = statistics.median(times[arm])
        print(f"{arm:<12} {med:>14.3f} {med - base:>12.3f} {statistics.median(waits[arm]):>11.3f}")
    serial, conc = statistics.median(times["serial"]), statistics.median(times["concurrent"])
    print(
        f"ideal env cost: serial {args.latency * args.turns * episodes:.2f} s, concurrent "
        f"{args.latency * args.turns:.2f} s"
    )
    print(f"ratio serial / concurrent wall time per step: {serial / conc:.1f}x")
    wait_s, wait_c = statistics.median(waits["serial"]), statistics.median(waits["concurrent"])
    print(f"ratio serial / concurrent environment wait per step: {wait_s / wait_c:.1f}x")


if __name__ == "__main__":
    main()
