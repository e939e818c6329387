"""What the planner predicts for published asynchronous-RL speed-ups (a sanity table, docs/planning.md).

Each row is a published claim with the setup we *assume* for it (model size, devices, lengths, batch —
the papers' exact batch shapes and length distributions are not all public, so these are stated
assumptions, not their configs). The planner's colocated layout stands for the synchronous baseline; the
asynchronous system is the best decoupled layout at the η it allows, with ``streaming`` (partial rollouts,
engines never drain) for the systems that do that. Pure computation, a few seconds:

    .venv/bin/python bench/plan_published.py
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tandem.plan.cost import Efficiency, LengthDist, ModelShape, Workload  # noqa: E402
from tandem.plan.devices import get_device  # noqa: E402
from tandem.plan.layouts import candidates  # noqa: E402


@dataclass(frozen=True)
class Claim:
    name: str
    published: str
    params: float
    gpus: int
    mean_len: int
    max_len: int
    samples: int
    etas: tuple[int, ...]
    streaming: bool


CLAIMS = [
    Claim("AReaL async vs sync (1.5B)", "2.77×", 1.5e9, 64, 8192, 32768, 4096, (4,), True),
    Claim("AReaL async vs sync (7B)", "up to 2.77×", 7e9, 64, 8192, 32768, 4096, (4,), True),
    Claim("verl fully-async, 7B, 128 GPUs", "2.35–2.67×", 7e9, 128, 4096, 16384, 4096, (4,), True),
    Claim("verl fully-async, 7B, 64 GPUs", "≈ 2×", 7e9, 64, 4096, 16384, 4096, (4,), True),
    Claim("verl fully-async, 7B, 32 GPUs", "≈ 2×", 7e9, 32, 4096, 16384, 4096, (4,), True),
    Claim("one-step-off-policy, 7B, 32 GPUs", "+23 % (1.23×)", 7e9, 32, 2048, 8192, 1024, (1,), False),
]


def main() -> None:
    eff = Efficiency()
    h100 = get_device("h100")
    print("| claim | published | assumed setup | colocated s/step | best async layout | predicted × |")
    print("|---|---|---|---:|---|---:|")
    for c in CLAIMS:
        w = Workload(
            model=ModelShape.from_params(c.params),
            prompt_len=512,
            completion=LengthDist(mean=c.mean_len, max_len=c.max_len, cv=0.8),
            samples_per_step=c.samples,
        )
        cands = candidates(w, h100, c.gpus, eff=eff, etas=c.etas, streaming=c.streaming)
        col = next(x for x in cands if x.layout.mode == "colocated")
        best = next(x for x in cands if x.layout.mode == "decoupled")
        setup = (
            f"{c.params / 1e9:g}B, {c.gpus} H100, {c.samples} samples, mean {c.mean_len} / max {c.max_len} "
            f"tokens, η={c.etas[0]}{', streaming' if c.streaming else ''}"
        )
        print(
            f"| {c.name} | {c.published} | {setup} | {col.result.step_s:.0f} | {best.name} "
            f"(workers {best.layout.workers}) | {best.result.samples_per_s / col.result.samples_per_s:.2f} |"
        )


if __name__ == "__main__":
    main()
