"""A chart of the candidate layouts: predicted samples/s (bars) and mean policy lag (label).

matplotlib when it is installed (``tandem-rl[report]``: PNG, SVG or PDF by the file's suffix); without it an
SVG is written by hand (and a PNG path is refused with the extra to install).
"""

from __future__ import annotations

from collections.abc import Sequence
from html import escape
from pathlib import Path

from tandem.errors import MissingDependencyError
from tandem.plan.layouts import Candidate

_COLOURS = {None: "#7f7f7f", 0: "#1f77b4", 1: "#2ca02c", 2: "#ff7f0e", 4: "#d62728"}


def _colour(c: Candidate) -> str:
    key = None if c.layout.mode == "colocated" else c.layout.staleness
    return _COLOURS.get(key, "#9467bd")


def plot_candidates(cands: Sequence[Candidate], path: str | Path, *, best: Candidate | None = None) -> Path:
    """Write the chart to ``path``; returns it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        if path.suffix.lower() != ".svg":
            raise MissingDependencyError("matplotlib", "report") from None
        path.write_text(_svg(cands, best))
        return path
    fig, ax = plt.subplots(figsize=(8, 0.3 * len(cands) + 1.2))
    names = [c.name for c in cands][::-1]
    values = [c.result.samples_per_s for c in cands][::-1]
    colours = [_colour(c) for c in cands][::-1]
    bars = ax.barh(names, values, color=colours)
    for bar, c in zip(bars, list(cands)[::-1], strict=True):
        mark = "  ← recommended" if c is best else ""
        ax.text(
            bar.get_width(),
            bar.get_y() + bar.get_height() / 2,
            f" lag {c.result.mean_lag:.2f}{mark}",
            va="center",
            fontsize=7,
        )
    ax.set_xlabel("predicted samples/s")
    ax.set_title("tandem plan: candidate layouts")
    ax.tick_params(axis="y", labelsize=7)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def _svg(cands: Sequence[Candidate], best: Candidate | None) -> str:
    """A horizontal bar chart as plain SVG."""
    row, left, width = 18, 230, 420
    top = max((c.result.samples_per_s for c in cands), default=1.0) or 1.0
    height = row * len(cands) + 50
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{left + width + 160}" height="{height}" '
        'font-family="sans-serif" font-size="11">',
        f'<text x="{left}" y="16" font-size="13">predicted samples/s per layout (label: mean policy lag)</text>',
    ]
    for i, c in enumerate(cands):
        y = 28 + i * row
        w = width * c.result.samples_per_s / top
        mark = " ← recommended" if c is best else ""
        parts += [
            f'<text x="{left - 6}" y="{y + 12}" text-anchor="end">{escape(c.name)}</text>',
            f'<rect x="{left}" y="{y}" width="{w:.1f}" height="{row - 4}" fill="{_colour(c)}"/>',
            f'<text x="{left + w + 4:.1f}" y="{y + 12}">{c.result.samples_per_s:.3g}/s, lag '
            f"{c.result.mean_lag:.2f}{escape(mark)}</text>",
        ]
    parts.append("</svg>")
    return "\n".join(parts) + "\n"
