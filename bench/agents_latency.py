"""Environment latency hiding (issue 16): wall time of one step's episodes against a slow tool, the
environment steps run one after another, concurrently in lockstep turns, or as async episodes.

A tiny char Llama (HF engine, 1 torch thread) runs ``--prompts`` x ``--n`` episodes of ``--turns``
turns against an async environment whose every step sleeps (a tool call's latency) and answers with a
short observation. Two tools: ``fixed`` (every step ``--latency`` s) and ``variable`` (each step a
latency drawn uniformly from ``--low``..``--high`` s, the same draws in every arm: seeded by episode and
step). Arms (same seed, same episodes, run interleaved: every repeat runs each arm once):

- ``no env``: the same number of engine turns with no environment latency (generation alone);
- ``serial``: ``env.concurrent=false``: every episode's step waits for the previous one;
- ``lockstep``: ``env.concurrent=true``, ``env.schedule=lockstep`` (the default): a turn's steps
  overlap each other, the next turn waits for the slowest;
- ``async``: ``env.schedule=async``: an episode continues as soon as its step is done, batched with
  the other episodes ready then, while the others' steps go on (they overlap generation).

``env wait`` is ``timing/env`` (seconds the loop waited on environments, not generating), ``calls``
the engine's ``generate_ids`` calls per step. Lockstep's ideal cost over generation alone is the sum
over turns of the slowest step; async can hide steps behind other episodes' generation but pays for
more, smaller engine calls. The machine is shared: the load average is printed beside.

    OMP_NUM_THREADS=1 .venv/bin/python bench/agents_latency.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import random
import statistics
import tempfile
import time

import torch


class Tool:
    """Every step waits ``latency`` seconds (or a seeded draw in ``[low, high]`` when ``high``), then
    answers; never done before max_turns."""

    latency, low, high = 0.05, 0.0, 0.0
    order = itertools.count()  # episodes of a call are built in order: the same index in every arm

    def __init__(self) -> None:
        self.rng = random.Random(next(self.order))

    def reset(self, row):
        return row["prompt"]

    async def step(self, action):
        wait = self.rng.uniform(self.low, self.high) if self.high else self.latency
        if wait:
            await asyncio.sleep(wait)
        return "RESULT 42\n", 0.0, False, {"tool_calls": 1}


class Counting:
    """The engine, counting its ``generate_ids`` calls."""

    def __init__(self, engine) -> None:
        self.engine, self.tokenizer, self.calls = engine, engine.tokenizer, 0

    @property
    def version(self):
        return self.engine.version

    def generate(self, prompts, params, **kw):
        return self.engine.generate(prompts, params, **kw)

    def generate_ids(self, prompt_ids, params, **kw):
        self.calls += 1
        return self.engine.generate_ids(prompt_ids, params, **kw)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--latency", type=float, default=0.05)
    ap.add_argument("--low", type=float, default=0.01)
    ap.add_argument("--high", type=float, default=0.2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--min-batch", type=float, default=0.5, help="env.async_min_batch")
    ap.add_argument("--max-wait", type=float, default=0.05, help="env.async_max_wait_s")
    ap.add_argument("--tools", default="fixed,variable")
    ap.add_argument("--no-serial", action="store_true", help="skip the (slow) serial arm")
    args = ap.parse_args()
    torch.set_num_threads(1)
    from tandem.models import init_tiny_model, load_causal_lm, load_tokenizer
    from tandem.rollout import EngineSpec, build_engine
    from tandem.rollout.base import SamplingParams
    from tandem.rollout.episodes import EpisodeRunner, EpisodeSettings

    with tempfile.TemporaryDirectory() as tmp:
        path = init_tiny_model(f"{tmp}/m", seed=0)
        model, tok = load_causal_lm(path), load_tokenizer(path)
    engine = Counting(build_engine("hf", EngineSpec(model=model, tokenizer=tok)))
    prompts = [f"{10 + i}*{20 + i}=" for i in range(args.prompts)]
    params = SamplingParams(max_new_tokens=8, temperature=1.0, n=args.n, stop=["\n"], seed=0)
    tools = {
        "fixed": {"latency": args.latency},
        "variable": {"latency": 0.0, "low": args.low, "high": args.high},
    }
    tools = {k: v for k, v in tools.items() if k in args.tools.split(",")}
    arms = {  # (latency on, concurrent, schedule)
        "no env": (False, True, "lockstep"),
        "serial": (True, False, "lockstep"),
        "lockstep": (True, True, "lockstep"),
        "async": (True, True, "async"),
    }
    if args.no_serial:
        del arms["serial"]
    runs = [
        (tool, arm) for tool in tools for arm in arms if not (arm == "no env" and tool != next(iter(tools)))
    ]
    times: dict[tuple[str, str], list[float]] = {r: [] for r in runs}
    waits: dict[tuple[str, str], list[float]] = {r: [] for r in runs}
    calls: dict[tuple[str, str], list[int]] = {r: [] for r in runs}
    loads = []
    for _ in range(args.repeats):
        for tool, arm in runs:
            on, concurrent, schedule = arms[arm]
            spec = tools[tool] if on else {"latency": 0.0}
            env = type("T", (Tool,), {**spec, "order": itertools.count()})
            settings = EpisodeSettings(
                max_turns=args.turns,
                concurrent=concurrent,
                schedule=schedule,
                async_min_batch=args.min_batch,
                async_max_wait_s=args.max_wait,
            )
            runner = EpisodeRunner(engine, env, settings)
            engine.calls = 0
            t0 = time.perf_counter()
            runner.generate(prompts, params)
            times[tool, arm].append(time.perf_counter() - t0)
            waits[tool, arm].append(runner.last.metrics["timing/env"])
            calls[tool, arm].append(engine.calls)
            assert runner.last.metrics["agent/turns_mean"] == args.turns
        loads.append(os.getloadavg()[0])
    episodes = args.prompts * args.n
    print(
        f"{episodes} episodes x {args.turns} turns; fixed tool {args.latency * 1000:.0f} ms, variable tool "
        f"{args.low * 1000:.0f}-{args.high * 1000:.0f} ms; async_min_batch {args.min_batch}, "
        f"async_max_wait_s {args.max_wait}; {args.repeats} repeats, load average "
        f"{min(loads):.2f}-{max(loads):.2f}"
    )
    print(f"{'tool':<9} {'arm':<9} {'median s/step':>14} {'over no env':>12} {'env wait s':>11} {'calls':>6}")
    base = statistics.median(times[next(iter(tools)), "no env"])
    for tool, arm in runs:
        med = statistics.median(times[tool, arm])
        print(
            f"{tool if arm != 'no env' else '-':<9} {arm:<9} {med:>14.3f} {med - base:>12.3f} "
            f"{statistics.median(waits[tool, arm]):>11.3f} {statistics.median(calls[tool, arm]):>6.0f}"
        )
    for tool in tools:
        med = {a: statistics.median(times[tool, a]) for a in arms if (tool, a) in times}
        over = {a: med[a] - base for a in med}
        line = f"{tool}: wall lockstep / async {med['lockstep'] / med['async']:.2f}x"
        if "serial" in med:
            line += f", serial / async {med['serial'] / med['async']:.1f}x"
        line += f"; cost over no env lockstep {over['lockstep']:.3f} s, async {over['async']:.3f} s"
        print(line)


if __name__ == "__main__":
    main()
