"""Measure the machine's co-run interference, then re-run the planner's cross-prediction with it.

Two fixed torch workloads stand for the two phase kinds, each in a process of its own with one torch thread:

* ``generate``: a decode-like loop — batches of 1, 2, 4, 8, 16 and 32 rows each pushed through 6 "tokens" of
  4 square 768-wide layers (``x = tanh(x @ W)``; 9.4 MB of weights read per token, like a small model's decode;
  ``--gen-width 2048``: 64 MB, more than this VM's 32 MB L3 cache, so every token streams from memory);
* ``update``: forward, backward and an AdamW step of one small transformer block (width 256, 4 heads,
  feed-forward 1024) on a 16 × 32 batch.

Each workload is timed alone (median seconds per iteration over ``--seconds``), then while k = 1 … C − 1
copies of itself compute in other processes (C: the machine's cores; the copies run before, during and after
the timed window). Its slowdown divided by what fair CPU sharing allows (1 while the k + 1 processes fit the
cores, else (k + 1) / C) is its interference factor (``tandem.plan.sharing.interference_factor``); the mean
over k is the figure per phase kind. The whole series is repeated ``--rounds`` times, interleaved, and the
median per k kept. Beside it, each kind is also timed next to one process of the *other* kind (reported,
not used).

The factors then go into ``CorePool(interference=...)`` and every decoupled run of the recorded fixtures
(``tests/unit/plan/recorded`` and ``recorded_sampled``) is predicted again from its colocated run's phases,
before (factor 1) and after. Nothing is fitted to those runs.

    OMP_NUM_THREADS=1 .venv/bin/python bench/plan_interference.py [--seconds 2] [--rounds 3]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tandem.plan.calibrate import cross_check, read_run  # noqa: E402
from tandem.plan.sharing import CorePool, fair_slowdown, interference_factor  # noqa: E402

KINDS = ("generate", "update")
FIXTURES = (ROOT / "tests/unit/plan/recorded", ROOT / "tests/unit/plan/recorded_sampled")


def _workload(kind: str, width: int = 768):
    """One iteration of the phase-like workload, as a closure (torch imported here, in the child)."""
    import torch

    torch.set_num_threads(1)
    torch.manual_seed(0)
    if kind == "generate":
        layers = [torch.randn(width, width) / width**0.5 for _ in range(4)]

        @torch.no_grad()
        def step() -> None:
            for b in (1, 2, 4, 8, 16, 32):
                x = torch.randn(b, width)
                for _ in range(6):
                    for w in layers:
                        x = torch.tanh(x @ w)

        return step
    block = torch.nn.TransformerEncoderLayer(256, 4, dim_feedforward=1024, dropout=0.0, batch_first=True)
    opt = torch.optim.AdamW(block.parameters(), lr=1e-4)
    x = torch.randn(16, 32, 256)

    def step() -> None:
        opt.zero_grad()
        block(x).square().mean().backward()
        opt.step()

    return step


def _neighbour(kind: str, width: int, ready, go, stop) -> None:
    step = _workload(kind, width)
    step()
    ready.wait()
    go.wait()
    while not stop.is_set():
        step()


def _target(kind: str, width: int, seconds: float, ready, go, out) -> None:
    step = _workload(kind, width)
    for _ in range(3):
        step()
    ready.wait()
    go.wait()
    time.sleep(0.2)  # the neighbours are computing by now
    times = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        t = time.perf_counter()
        step()
        times.append(time.perf_counter() - t)
    out.put(statistics.median(times))


def time_beside(kind: str, neighbours: list[str], seconds: float, width: int = 768) -> float:
    """Median seconds per iteration of ``kind`` while one process per entry of ``neighbours`` computes."""
    ctx = mp.get_context("spawn")
    ready, go, stop, out = ctx.Barrier(len(neighbours) + 2), ctx.Event(), ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_neighbour, args=(n, width, ready, go, stop)) for n in neighbours]
    procs.append(ctx.Process(target=_target, args=(kind, width, seconds, ready, go, out)))
    for p in procs:
        p.start()
    ready.wait()
    go.set()
    result = out.get()
    stop.set()
    for p in procs:
        p.join()
    return result


def measure(cores: int, seconds: float, rounds: int, width: int = 768) -> dict[str, dict[str, object]]:
    ks = list(range(1, max(2, cores)))
    raw: dict[str, dict[int, list[float]]] = {k: {n: [] for n in [0, *ks]} for k in KINDS}
    mixed: dict[str, list[float]] = {k: [] for k in KINDS}
    for _ in range(rounds):
        for kind in KINDS:
            for n in [0, *ks]:
                raw[kind][n].append(time_beside(kind, [kind] * n, seconds, width))
            other = KINDS[1 - KINDS.index(kind)]
            mixed[kind].append(time_beside(kind, [other], seconds, width))
    result: dict[str, dict[str, object]] = {}
    for kind in KINDS:
        alone = statistics.median(raw[kind][0])
        per_k = {n: statistics.median(raw[kind][n]) for n in ks}
        factors = {n: interference_factor(alone, per_k[n], n + 1, cores) for n in ks}
        result[kind] = {
            "alone": alone,
            "beside": per_k,
            "factors": factors,
            "factor": statistics.fmean(factors.values()),
            "mixed": interference_factor(alone, statistics.median(mixed[kind]), 2, cores),
        }
    return result


def cross_rows(interference: dict[str, float], cores: float) -> tuple[list[str], dict[str, list[float]]]:
    """Each recorded decoupled run from its colocated run's phases: shared cores beside the colocated
    run's background / the run's own background, without and with the interference factors."""
    lines = [
        "| fixtures | run | measured s/step | shared, colocated's B: before | after | shared, run's B: before "
        "| after |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    errors: dict[str, list[float]] = {"stay0": [], "stay1": [], "run0": [], "run1": []}
    for folder in FIXTURES:
        colocated = read_run(folder / "colocated")
        bg = colocated.background or 0.0
        for d in sorted(p for p in folder.iterdir() if p.name.startswith("dec_")):
            t = read_run(d)
            cells = []
            for key, target in (("stay", replace(t, background=None)), ("run", t)):
                for i, inter in enumerate(({}, interference)):
                    res = cross_check(
                        colocated, target, pool=CorePool(cores, background=bg, interference=inter)
                    )
                    errors[f"{key}{i}"].append(res.error)
                    cells.append(f"{res.predicted.step_s:.3f} ({res.error:+.1%})")
            lines.append(
                f"| {folder.name} | {d.name} | {t.measured_step_s:.3f} | " + " | ".join(cells) + " |"
            )
    return lines, errors


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=2.0, help="timed window per measurement")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cores", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--gen-width", type=int, default=768, help="width of the generate workload's layers")
    args = ap.parse_args()
    load0 = os.getloadavg()
    t0 = time.time()
    m = measure(args.cores, args.seconds, args.rounds, args.gen_width)
    print(
        f"cores {args.cores}; load average before {load0[0]:.2f}, after {os.getloadavg()[0]:.2f}; "
        f"{time.time() - t0:.0f} s"
    )
    print(
        "| phase kind | alone s/iter | k copies beside: s/iter (slowdown; fair share; factor) | factor | "
        "beside the other kind: factor |"
    )
    print("|---|---:|---|---:|---:|")
    for kind in KINDS:
        r = m[kind]
        alone = r["alone"]
        cells = ", ".join(
            f"k={n}: {s:.4f} ({s / alone:.2f}×; {fair_slowdown(n + 1, args.cores):.2f}×; {r['factors'][n]:.2f})"
            for n, s in r["beside"].items()
        )
        print(f"| {kind} | {alone:.4f} | {cells} | {r['factor']:.2f} | {r['mixed']:.2f} |")
    interference = {kind: float(m[kind]["factor"]) for kind in KINDS}
    print(
        f"\ninterference = {{'generate': {interference['generate']:.2f}, 'update': {interference['update']:.2f}}}\n"
    )
    lines, errors = cross_rows(interference, float(args.cores))
    print("\n".join(lines))
    n = len(errors["stay0"])
    inside = {k: sum(abs(e) <= 0.15 for e in v) for k, v in errors.items()}
    print(
        f"\nwithin 15 %: colocated's B {inside['stay0']}/{n} -> {inside['stay1']}/{n}; "
        f"run's B {inside['run0']}/{n} -> {inside['run1']}/{n}"
    )


if __name__ == "__main__":
    main()
