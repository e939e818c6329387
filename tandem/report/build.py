"""Build the HTML report of one run (or two side by side) with its PNG plots.

The page is self-contained: plots are embedded as ``data:`` URIs (the PNG files are written beside it
too, for slides and issues). A small inline script records image-load failures and script errors in
``data-`` attributes of ``<body>``, so a headless browser test can check the rendered page.
"""

from __future__ import annotations

import base64
import html
from pathlib import Path
from typing import Any

from tandem.data.outputs import check_output_dir
from tandem.errors import ConfigError
from tandem.monitor.diagnose import diagnose
from tandem.report.data import RunData, load_run
from tandem.report.plots import PANELS, render_panel
from tandem.utils.io import atomic_write_bytes, atomic_write_text

STYLE = """
body{font-family:system-ui,sans-serif;margin:2em;color:#222;max-width:1400px}
h1{margin-bottom:0}.sub{color:#666;margin-top:.2em}
.plots{display:grid;grid-template-columns:repeat(auto-fill,minmax(560px,1fr));gap:1em}
.plots figure{margin:0;border:1px solid #ddd;padding:.5em}
table{border-collapse:collapse;margin:.5em 0;font-size:90%}td,th{border:1px solid #ccc;padding:.25em .6em}
th{background:#f3f3f3}td.num{text-align:right;font-variant-numeric:tabular-nums}
pre{background:#f7f7f7;padding:.8em;overflow:auto;font-size:85%}.cols{display:flex;gap:1em}.cols>div{flex:1}
.alert-stop,.alert-rollback{color:#b00}.alert-skip{color:#a60}
"""

CHECK_SCRIPT = """
window.addEventListener('error', e => {
  const b = document.body; b.dataset.errors = (b.dataset.errors || '') + (e.message || 'resource') + ';';
}, true);
window.addEventListener('load', () => {
  const imgs = [...document.querySelectorAll('img.plot')];
  document.body.dataset.plotsLoaded = imgs.filter(i => i.complete && i.naturalWidth > 0).length;
  document.body.dataset.plotsTotal = imgs.length;
});
"""

MAX_SAMPLE_STEPS = 4
SAMPLES_PER_STEP = 3


def esc(value: Any) -> str:
    return html.escape(str(value))


def fmt(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else esc("-" if v is None else v)


def build_report(run_paths: list[str | Path], out_dir: str | Path | None = None) -> Path:
    """Write ``report.html`` and ``<plot>.png`` files for one or two runs; returns the HTML path.
    Default folder: ``RUN/report`` (one run) or ``RUN_A/report-vs-<RUN_B name>`` (two)."""
    runs = [load_run(p) for p in run_paths]
    default = runs[0].path / ("report" if len(runs) == 1 else f"report-vs-{runs[1].name}")
    out = Path(out_dir) if out_dir is not None else default
    # a new or empty folder, or an earlier report; never an unrelated folder, a file, or a run itself
    check_output_dir(out, "report", sources=run_paths, where="--out")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ConfigError(f"cannot create {out}: {err.strerror}", where="--out") from None
    alert_steps = {r.name: sorted({int(a["step"]) for a in r.alerts if a.get("step", -1) >= 0}) for r in runs}
    figures = []
    for panel in PANELS:
        png = render_panel(panel, runs, alert_steps)
        if png is None:
            continue
        atomic_write_bytes(out / f"{panel.id}.png", png)
        uri = "data:image/png;base64," + base64.b64encode(png).decode("ascii")
        figures.append(
            f'<figure><img class="plot" id="plot-{panel.id}" alt="{esc(panel.title)}" src="{uri}"></figure>'
        )
    body = "\n".join(
        [
            _header(runs),
            "<h2>Metrics</h2>",
            f'<div class="plots">{"".join(figures)}</div>',
            "<h2>Held-out evaluation</h2>",
            _eval_tables(runs),
            "<h2>What the metrics say</h2>",
            _diagnosis(runs),
            "<h2>Alerts</h2>",
            _alerts(runs),
            "<h2>Sample completions</h2>",
            _side_by_side(runs, _samples),
            "<h2>Config</h2>",
            _side_by_side(runs, lambda r: f"<pre>{esc(r.config_text or '(no config.yaml)')}</pre>"),
        ]
    )
    title = " vs ".join(r.name for r in runs)
    page = (
        f'<!DOCTYPE html><html><head><meta charset="utf-8"><title>Tandem report: {esc(title)}</title>'
        f"<style>{STYLE}</style><script>{CHECK_SCRIPT}</script></head><body>{body}</body></html>\n"
    )
    path = out / "report.html"
    atomic_write_text(path, page)
    return path


def _header(runs: list[RunData]) -> str:
    rows = []
    for r in runs:
        steps = r.rows[-1]["step"] if r.rows else 0
        status = "finished" if r.summary else "unfinished (no summary.json)"
        if r.summary.get("stopped_by_alert") is not None:
            status = f"stopped by an alert at step {r.summary['stopped_by_alert']}"
        rows.append(
            f"<tr><td>{esc(r.name)}</td><td>{esc(r.path)}</td><td>{esc(r.architecture)}</td>"
            f"<td class=num>{steps}</td><td>{esc(status)}</td><td class=num>{len(r.alerts)}</td></tr>"
        )
    head = "<tr><th>run</th><th>folder</th><th>architecture</th><th>steps</th><th>status</th><th>alerts</th></tr>"
    title = " vs ".join(esc(r.name) for r in runs)
    return f"<h1>Tandem run report: {title}</h1><table>{head}{''.join(rows)}</table>"


def _eval_tables(runs: list[RunData]) -> str:
    """Per run: one row per evaluated step with every ``eval/*`` metric; then final values side by side."""
    parts = []
    for r in runs:
        keys = sorted(k for k in r.metric_names() if k.startswith("eval/"))
        rows = [row for row in r.rows if any(k in row for k in keys)]
        if not rows:
            parts.append(f"<p>{esc(r.name)}: no held-out evaluation logged.</p>")
            continue
        head = "<tr><th>step</th>" + "".join(f"<th>{esc(k)}</th>" for k in keys) + "</tr>"
        body = "".join(
            f"<tr><td class=num>{row['step']}</td>"
            + "".join(f"<td class=num>{fmt(row.get(k))}</td>" for k in keys)
            + "</tr>"
            for row in rows
        )
        parts.append(f"<h3>{esc(r.name)}</h3><table class='eval'>{head}{body}</table>")
    return "\n".join(parts)


def _diagnosis(runs: list[RunData]) -> str:
    """Per run: the findings of :func:`~tandem.monitor.diagnose.diagnose` (verdict, causes, what to try)."""
    parts = []
    for r in runs:
        findings = diagnose(r.rows, r.eval_size)
        if not findings:
            parts.append(f"<p>{esc(r.name)}: no training steps logged.</p>")
            continue
        body = "".join(
            f"<tr><td>{esc(f.code)}</td><td>{esc(f.message)}</td><td>{esc(f.hint or '-')}</td></tr>"
            for f in findings
        )
        head = "<tr><th>finding</th><th>seen</th><th>try</th></tr>"
        parts.append(f"<h3>{esc(r.name)}</h3><table class='diagnosis'>{head}{body}</table>")
    return "\n".join(parts)


def _alerts(runs: list[RunData]) -> str:
    rows = [
        f"<tr class='alert-{esc(a.get('action'))}'><td>{esc(r.name)}</td><td class=num>{esc(a.get('step'))}</td>"
        f"<td>{esc(a.get('rule'))}</td><td>{esc(a.get('action'))}</td><td>{esc(a.get('message'))}</td>"
        f"<td>{esc(a.get('effect', ''))}</td></tr>"
        for r in runs
        for a in r.alerts
    ]
    if not rows:
        return "<p>No alerts were raised.</p>"
    head = "<tr><th>run</th><th>step</th><th>rule</th><th>action</th><th>message</th><th>effect</th></tr>"
    return f"<table id='alerts'>{head}{''.join(rows)}</table>"


def _samples(run: RunData) -> str:
    """Up to three completions at up to four steps spread over the run (first, last, between)."""
    steps = sorted({int(s["step"]) for s in run.samples})
    if not steps:
        return "<p>No samples logged (monitor.sample_every).</p>"
    if len(steps) > MAX_SAMPLE_STEPS:
        idx = [round(i * (len(steps) - 1) / (MAX_SAMPLE_STEPS - 1)) for i in range(MAX_SAMPLE_STEPS)]
        steps = [steps[i] for i in sorted(set(idx))]
    rows = []
    for step in steps:
        for s in [s for s in run.samples if int(s["step"]) == step][:SAMPLES_PER_STEP]:
            rows.append(
                f"<tr><td class=num>{step}</td><td><pre>{esc(s.get('prompt', ''))}</pre></td>"
                f"<td><pre>{esc(s.get('completion', ''))}</pre></td><td class=num>{fmt(s.get('reward'))}</td></tr>"
            )
    head = "<tr><th>step</th><th>prompt</th><th>completion</th><th>reward</th></tr>"
    return f"<table class='samples'>{head}{''.join(rows)}</table>"


def _side_by_side(runs: list[RunData], section) -> str:
    if len(runs) == 1:
        return section(runs[0])
    cols = "".join(f"<div><h3>{esc(r.name)}</h3>{section(r)}</div>" for r in runs)
    return f"<div class='cols'>{cols}</div>"
