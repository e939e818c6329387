"""Does the train–inference mismatch metric catch a broken engine, and does a rollout correction help?

Four arms on the quickstart task (``arith`` 2-digit addition from ``checkpoints/quickstart-warmstart``,
GRPO, colocated): the clean ``hf`` engine, and a deliberately perturbed engine that samples at
``--scale`` × the configured temperature while reporting its own behaviour log-probs (what a sampler bug
such as a temperature applied twice would do), each without and with ``algorithm.correction``. The trainer
recomputes log-probs at the configured temperature, so with the perturbed engine every sample is
off-policy by a known amount. Per arm and seed: the mean over steps of ``rollout/logprob_diff_mean``,
``rollout/logprob_diff_max`` and ``rollout/ratio_outside_frac``, the correction's mean weight and masked
fraction, the mean ``actor/grad_norm`` and ``actor/approx_kl`` (current vs old policy), and the held-out
greedy accuracy (200 prompts) before and after. Two mini-batches per step, so the old log-probs are
recomputed and ``approx_kl`` measures how far each step moves the policy. Arms run one after another in
this process, interleaved per seed.

    .venv/bin/python bench/mismatch.py [--steps 30] [--seeds 0 1] [--scale 1.5] [--correction token_tis]
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SKEWED = "hf_temperature_skew"  # the perturbed engine's name in the engine table while this runs


class TemperatureSkewEngine:
    """The ``hf`` engine, sampling at ``temperature_scale`` × the requested temperature (greedy stays greedy)
    and reporting the behaviour log-probs of that temperature: a deliberately wrong sampler whose
    mismatch with the trainer is known. ``rollout.engine_options.temperature_scale`` sets the factor
    (default 1.5); the other options go to the ``hf`` engine. Built through the registry like any engine."""

    def __init__(self, inner: Any, scale: float) -> None:
        self.inner = inner
        self.scale = scale

    @classmethod
    def from_spec(cls, spec: Any) -> TemperatureSkewEngine:
        from tandem.rollout import build_engine

        options = dict(spec.options)
        scale = float(options.pop("temperature_scale", 1.5))
        return cls(build_engine("hf", dataclasses.replace(spec, options=options)), scale)

    @property
    def version(self) -> int:
        return self.inner.version

    def update_weights(self, state_dict: Any, version: int) -> None:
        self.inner.update_weights(state_dict, version)

    def close(self) -> None:
        self.inner.close()

    def generate(self, prompts: list[str], params: Any, **kwargs: Any) -> Any:
        def skew(p: Any) -> Any:
            return dataclasses.replace(p, temperature=p.temperature * self.scale)

        params = skew(params) if not isinstance(params, list | tuple) else [skew(p) for p in params]
        return self.inner.generate(prompts, params, **kwargs)


def arm_config(
    out: Path, seed: int, steps: int, *, skewed: bool, scale: float, correction: str | None
) -> dict:
    """The quickstart's settings (16 prompts × 8 samples, 6 new tokens, GRPO, lr 6e-4) for ``steps`` steps,
    with two mini-batches per step; only the engine and the correction differ between arms."""
    return {
        "run": {"output_dir": str(out), "seed": seed},
        "model": {"path": str(ROOT / "checkpoints/quickstart-warmstart")},
        "data": {
            "task": "arith",
            "task_options": {"digits": 2, "ops": "+"},
            "prompts_per_step": 16,
            "eval_size": 200,
        },
        "rollout": {
            "n": 8,
            "max_new_tokens": 6,
            "temperature": 1.0,
            "backend": SKEWED if skewed else "hf",
            "engine_options": {"temperature_scale": scale} if skewed else {},
        },
        "algorithm": {"name": "grpo", "correction": correction},
        # two mini-batches per step: old log-probs are recomputed and the second update is off-policy
        # w.r.t. them, so approx_kl and the clipping see the policy move within a step
        "trainer": {"total_steps": steps, "lr": 6e-4, "warmup_steps": 5, "mini_batch_size": 64},
        "monitor": {"eval_every": 0, "sample_every": 0, "tensorboard": False, "progress": False},
        "checkpoint": {"save_final": False},
    }


KEYS = (
    "rollout/logprob_diff_mean",
    "rollout/logprob_diff_max",
    "rollout/ratio_outside_frac",
    "actor/correction_weight_mean",
    "actor/correction_weight_min",
    "actor/grad_norm",
    "actor/approx_kl",
)
HEAD = ["diff mean", "diff max", "outside", "w mean", "w min", "grad norm", "grad max", "approx KL"]
HEAD += ["acc before", "acc after"]


def run_arm(seed: int, steps: int, *, skewed: bool, scale: float, correction: str | None) -> dict[str, float]:
    """Train one arm in this process; the mean over steps of :data:`KEYS`, the largest grad norm, the
    accuracy before/after and the wall time."""
    from tandem.config import build_config
    from tandem.monitor import read_metrics
    from tandem.orchestration.runner import train

    with tempfile.TemporaryDirectory() as tmp:
        cfg = build_config(
            arm_config(Path(tmp) / "run", seed, steps, skewed=skewed, scale=scale, correction=correction)
        )
        t0 = time.perf_counter()
        result = train(cfg, progress=False)
        wall = time.perf_counter() - t0
        rows = [r for r in read_metrics(result.run_dir) if "rollout/logprob_diff_mean" in r]
    out = {k: statistics.fmean(r[k] for r in rows) if rows and k in rows[0] else float("nan") for k in KEYS}
    out["grad_max"] = max(r["actor/grad_norm"] for r in rows)
    out["acc_before"] = result.eval_before.get("eval/accuracy", float("nan"))
    out["acc_after"] = result.eval_after.get("eval/accuracy", float("nan"))
    out["wall_s"] = wall
    return out


def _cells(r: dict[str, float]) -> list[str]:
    values = [*(r[k] for k in KEYS[:6]), r["grad_max"], r["actor/approx_kl"], r["acc_before"], r["acc_after"]]
    return [_fmt(v) for v in values]


def _fmt(x: Any) -> str:
    return "—" if x is None or x != x else f"{x:.3g}"


def _row(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--scale", type=float, default=1.5, help="perturbed engine: temperature × this")
    ap.add_argument("--correction", default="token_tis", help="a name in tandem.algos.CORRECTIONS")
    args = ap.parse_args()
    import torch

    torch.set_num_threads(1)
    from tandem.rollout import ENGINES

    ENGINES[SKEWED] = f"{__name__}:TemperatureSkewEngine"
    arms = [
        ("clean", False, None),
        ("clean + " + args.correction, False, args.correction),
        (f"temp ×{args.scale}", True, None),
        (f"temp ×{args.scale} + {args.correction}", True, args.correction),
    ]
    print(_row(["arm", "seed", *HEAD, "wall s"]) + "\n|---|---|" + "---:|" * (len(HEAD) + 1), flush=True)
    results: dict[str, list[dict[str, float]]] = {name: [] for name, _, _ in arms}
    for seed in args.seeds:  # interleaved: every arm once per seed before the next seed
        for name, skewed, correction in arms:
            r = run_arm(seed, args.steps, skewed=skewed, scale=args.scale, correction=correction)
            results[name].append(r)
            print(_row([name, str(seed), *_cells(r), f"{r['wall_s']:.0f}"]), flush=True)
    print(f"\nmean over {len(args.seeds)} seeds\n\n" + _row(["arm", *HEAD]) + "\n|---|" + "---:|" * len(HEAD))
    for name, rs in results.items():
        mean = {k: statistics.fmean(r[k] for r in rs) for k in rs[0]}
        print(_row([name, *_cells(mean)]))
    clean, skew = results["clean"], results[f"temp ×{args.scale}"]
    ratio = statistics.fmean(r["rollout/logprob_diff_mean"] for r in skew) / max(
        1e-12, statistics.fmean(r["rollout/logprob_diff_mean"] for r in clean)
    )
    print(f"\nperturbed / clean logprob_diff_mean: {ratio:.3g}x")


if __name__ == "__main__":
    sys.exit(main())
