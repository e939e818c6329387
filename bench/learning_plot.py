"""The figure of ``bench/learning.py --plot``: held-out accuracy of Tandem and TRL, per step and per second.

One row per warm start in the results, two panels: accuracy against training steps, and against training
wall seconds (evaluations excluded, as in the table). Each series is drawn once per seed (thin) and as the
seeds' mean (thick, :func:`learning_table.mean_curve`): every Tandem variant of the results, and TRL at the
learning rate of its sweep with the highest mean best accuracy (:func:`learning_table.best_lr`). The
dashed line is the accuracy target; on the wall panel, circles mark where each Tandem seed first reaches it,
stars where each TRL seed reaches its best, and the shaded band ends at a third of TRL's mean time to its
best — the time target, seed by seed in the table.

matplotlib (the ``report`` extra) is imported when a figure is drawn.
"""

from __future__ import annotations

import io
import sys
from pathlib import Path
from typing import Any

table = sys.modules["learning_table"]  # loaded by bench/learning.py (or a test) before this module
DEFAULT = table.DEFAULT


def series(results: list[dict[str, Any]], start: str, max_steps: int) -> list[tuple[str, list[Any]]]:
    """``(label, runs)`` to draw for one warm start: each Tandem variant, then TRL at its best lr."""
    mine = [r for r in results if r["start"] == start]
    out: list[tuple[str, list[Any]]] = []
    variants = dict.fromkeys(r.get("variant", DEFAULT) for r in mine if r["system"] == "tandem")
    for variant in sorted(variants, key=lambda v: v != DEFAULT):  # the default recipe first (colour C0)
        runs = [
            table.run_from_result(r)
            for r in mine
            if r["system"] == "tandem" and r.get("variant", DEFAULT) == variant
        ]
        out.append(("Tandem" if variant == DEFAULT else f"Tandem ({variant})", runs))
    trl = [table.run_from_result(r) for r in mine if r["system"] == "trl"]
    if trl:
        lr = table.best_lr(trl, max_steps)
        out.append((f"TRL lr {lr:g}", [r for r in trl if r.lr == lr]))
    return out


def plot(results: list[dict[str, Any]], out: Path, max_steps: int = 300) -> None:
    """Draw the figure of ``results`` (lines of ``results.jsonl``) to the PNG ``out``."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    starts = list(dict.fromkeys(r["start"] for r in results))
    if not starts:
        raise SystemExit("--plot: no results to draw")
    fig, axes = plt.subplots(len(starts), 2, figsize=(11, 3.3 * len(starts)), squeeze=False)
    for (by_step, by_wall), start in zip(axes, starts, strict=True):
        drawn = series(results, start, max_steps)
        first = min((r for _, runs in drawn for r in runs), key=lambda r: r.seed)
        target = table.target_accuracy(min(first.evals, key=lambda e: e.step).acc)
        for i, (label, runs) in enumerate(drawn):
            color = f"C{i}"
            for r in runs:
                kept = [e for e in r.evals if e.step <= max_steps]
                by_step.plot([e.step for e in kept], [e.acc for e in kept], color=color, alpha=0.25, lw=0.8)
                by_wall.plot([e.wall for e in kept], [e.acc for e in kept], color=color, alpha=0.25, lw=0.8)
                if label.startswith("TRL"):
                    best = table.best_eval(r.evals, max_steps)
                    by_wall.plot(best.wall, best.acc, marker="*", color=color, ms=9, ls="")
                else:
                    hit = table.first_reaching(r.evals, target, max_steps)
                    if hit is not None:
                        by_wall.plot(hit.wall, hit.acc, marker="o", color=color, ms=5, ls="")
            mean = [e for e in table.mean_curve(runs) if e.step <= max_steps]
            name = f"{label} ({len(runs)} seed{'s' if len(runs) > 1 else ''})"
            by_step.plot([e.step for e in mean], [e.acc for e in mean], color=color, lw=2.2, label=name)
            by_wall.plot([e.wall for e in mean], [e.acc for e in mean], color=color, lw=2.2)
            if label.startswith("TRL"):
                to_best = [table.best_eval(r.evals, max_steps).wall for r in runs]
                third = table.TIME_FRACTION * sum(to_best) / len(to_best)
                by_wall.axvspan(0, third, color="0.85", zorder=0, label="1/3 of TRL's mean time to its best")
        for ax in (by_step, by_wall):
            ax.axhline(target, color="0.4", ls="--", lw=1)
            ax.set_ylabel("held-out greedy accuracy", fontsize=8)
            ax.grid(alpha=0.3)
        by_step.set_title(f"{start}: accuracy per step (target {target:.1%}, dashed)", fontsize=9)
        by_wall.set_title(f"{start}: accuracy per training second", fontsize=9)
        by_step.set_xlabel("training step", fontsize=8)
        by_wall.set_xlabel("training wall seconds (evaluations excluded)", fontsize=8)
        by_step.legend(fontsize=7, loc="lower right")
        if by_wall.get_legend_handles_labels()[0]:
            by_wall.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    buf = io.BytesIO()
    fig.savefig(buf, dpi=72)
    plt.close(fig)
    from PIL import Image  # matplotlib's own dependency

    with Image.open(buf) as img:  # a 256-colour palette: the figure in a third of the bytes
        img.convert("RGB").quantize(256).save(out, optimize=True)
