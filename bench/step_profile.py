"""Where a step of the outside-model recipe goes: per-phase time, the recipe against variants, interleaved.

Builds Tandem's recipe (``warm_starts.train_config``) on one warm start of ``bench/warm_starts.py`` once per
configuration — the default and each ``--variant LABEL=key=value[,key=value...]`` — and trains them all in
the same process, ``--block`` steps each in turn (the order reverses every round), so each configuration's
steps see the same machine load. It prints the mean of every ``timing/*`` phase over the steps after
``--skip`` warm-up steps, each variant's ratio to the default, and the row statistics that explain the
time (share of distinct rows in the update, extra samples of adaptive group size). ``--adamw`` also times
one optimiser step of the warm start's model with the per-tensor (foreach) and fused AdamW kernels.

    OMP_NUM_THREADS=1 .venv/bin/python bench/step_profile.py --warm /tmp/warm --start sub2-mid \\
        --variant allrows=trainer.dedupe_rows=false,rollout.engine_options.shared_decode=false --adamw

The configurations train apart (each its own model and optimiser) and drift apart after a few dozen steps,
so the statistics differ a little between them; the timings are not a learning comparison.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Any

import learning  # bench/learning.py: tandem_config, parse_variants, warm_starts

STATS = ("actor/distinct_frac", "adaptive/extra_samples")


def build(start: str, warm: Path, steps: int, overrides: tuple[str, ...]) -> Any:
    from tandem.orchestration.colocated import ColocatedTrainer
    from tandem.orchestration.parts import build_parts

    w = learning.warm_starts.WARM_STARTS[start]
    return ColocatedTrainer(build_parts(learning.tandem_config(w, warm / start, steps, 0, overrides)))


def adamw_ms(model_dir: Path, repeats: int = 100) -> dict[str, float]:
    """Milliseconds per ``optimizer.step()`` over every parameter of the model, per kernel."""
    import torch
    from transformers import AutoModelForCausalLM

    params = list(AutoModelForCausalLM.from_pretrained(model_dir).parameters())
    for p in params:
        p.grad = torch.randn_like(p)
    out = {}
    for name, kernel in (("foreach", {"foreach": True}), ("fused", {"fused": True})):
        opt = torch.optim.AdamW(params, lr=1e-4, **kernel)
        for _ in range(5):
            opt.step()
        t0 = time.perf_counter()
        for _ in range(repeats):
            opt.step()
        out[name] = 1000 * (time.perf_counter() - t0) / repeats
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--warm", type=Path, default=Path("/tmp/warm"), help="Folder of the warm starts.")
    ap.add_argument("--start", default="sub2-mid", choices=list(learning.warm_starts.WARM_STARTS))
    ap.add_argument("--steps", type=int, default=80, help="Steps per configuration.")
    ap.add_argument("--skip", type=int, default=5, help="Warm-up steps left out of the means.")
    ap.add_argument("--block", type=int, default=10, help="Steps of one configuration before the next.")
    ap.add_argument("--variant", action="append", default=[], help="LABEL=key=value[,key=value...]")
    ap.add_argument("--adamw", action="store_true", help="Also time the foreach and fused AdamW kernels.")
    args = ap.parse_args()
    if args.steps <= args.skip or args.block < 1:
        raise SystemExit("--steps must exceed --skip, and --block must be at least 1")
    if not (args.warm / args.start / "model").is_dir():
        raise SystemExit(f"{args.warm / args.start}: no warm start; build it with bench/warm_starts.py")
    variants = learning.parse_variants(args.variant)
    trainers = {label: build(args.start, args.warm, args.steps, o) for label, o in variants.items()}
    rows: dict[str, list[dict[str, float]]] = {label: [] for label in trainers}
    order, done = list(trainers), 0
    while done < args.steps:
        n = min(args.block, args.steps - done)
        for label in order:
            rows[label] += [trainers[label].train_step() for _ in range(n)]
        order.reverse()
        done += n
        print(f"{done}/{args.steps} steps per configuration", flush=True)

    def mean(label: str, key: str) -> float:
        values = [float(r[key]) for r in rows[label][args.skip :] if key in r]
        return statistics.mean(values) if values else float("nan")

    labels = list(trainers)
    keys = sorted({k for r in rows[labels[0]] for k in r if k.startswith("timing/")})
    head = "| phase | " + " | ".join(f"{x} (ms)" for x in labels)
    head += "".join(f" | {x} / {labels[0]}" for x in labels[1:]) + " |"
    print(
        f"\n{args.start}, {args.steps} steps per configuration, means of steps {args.skip + 1}-{args.steps}"
    )
    print(head)
    print("|" + "---|" * (len(labels) * 2))
    for key in keys:
        ms = [1000 * mean(x, key) for x in labels]
        cells = " | ".join(f"{m:.1f}" for m in ms) + "".join(f" | {m / ms[0]:.2f}" for m in ms[1:])
        print(f"| {key} | {cells} |")
    for key in STATS:
        print(f"| {key} | " + " | ".join(f"{mean(x, key):.3f}" for x in labels) + " |" * len(labels))
    if args.adamw:
        ms = adamw_ms(args.warm / args.start / "model")
        print(f"\nAdamW step over the model: foreach {ms['foreach']:.2f} ms, fused {ms['fused']:.2f} ms")


if __name__ == "__main__":
    main()
