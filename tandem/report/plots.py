"""Matplotlib figures of a run's metrics, one PNG per panel; several runs share each panel's axes.

matplotlib is an optional dependency (extra ``report``) imported lazily with the Agg backend (no display).
"""

from __future__ import annotations

import io
from dataclasses import dataclass

from tandem.errors import MissingDependencyError
from tandem.report.data import RunData


@dataclass(frozen=True)
class Panel:
    """One plot: an id (HTML element and file name), a title and the metrics (or a prefix) it draws."""

    id: str
    title: str
    metrics: tuple[str, ...] = ()
    prefix: str | None = None
    exclude: tuple[str, ...] = ()

    def keys(self, available: set[str]) -> list[str]:
        if self.prefix is not None:
            return sorted(k for k in available if k.startswith(self.prefix) and k not in self.exclude)
        return [k for k in self.metrics if k in available]


PANELS = (
    Panel("reward", "Reward and held-out accuracy", ("reward/mean", "eval/accuracy", "eval/reward_mean")),
    Panel("kl", "KL divergence", ("actor/kl", "actor/kl_ref", "actor/approx_kl")),
    Panel("entropy", "Policy entropy", ("actor/entropy",)),
    Panel(
        "signal",
        "Groups with all-equal rewards (no gradient)",
        ("groups/all_equal_frac", "groups/all_equal_low_frac", "groups/all_equal_high_frac"),
    ),
    Panel("grad_norm", "Gradient norm", ("actor/grad_norm",)),
    Panel("lengths", "Response length", ("response/length_mean", "response/length_max", "eval/length_mean")),
    Panel("timing", "Time per phase (s)", prefix="timing/", exclude=("timing/step",)),
    Panel("throughput", "Throughput (tokens/s)", prefix="perf/"),
    Panel("staleness", "Staleness (policy versions)", prefix="staleness/"),
)


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        raise MissingDependencyError("matplotlib", "report") from None
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def render_panel(panel: Panel, runs: list[RunData], alert_steps: dict[str, list[int]]) -> bytes | None:
    """PNG bytes of one panel over all ``runs`` (None when no run has any of its metrics).
    Alerts are drawn as dotted vertical lines at their steps."""
    available = set().union(*(r.metric_names() for r in runs))
    keys = panel.keys(available)
    if not keys:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 3.2), dpi=90)
    styles = ("-", "--", ":", "-.")
    for i, run in enumerate(runs):
        for key in keys:
            xs, ys = run.series(key)
            if xs:
                label = key if len(runs) == 1 else f"{run.name}: {key}"
                ax.plot(xs, ys, styles[i % len(styles)], marker="." if len(xs) < 30 else None, label=label)
        for step in alert_steps.get(run.name, []):
            ax.axvline(step, color="red", linestyle=":", linewidth=1)
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_title(panel.title)
    ax.set_xlabel("step")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return buf.getvalue()
