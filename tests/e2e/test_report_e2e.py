"""``tandem report``: a self-contained HTML page with every plot, rendered in headless Chromium.

Chromium is the Debian package ``chromium``; the rendering checks are skipped (with that reason) where
it is absent. The page's inline script stores how many plot images decoded and any script error on
``<body>``; ``--dump-dom`` returns the DOM after load.
"""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest
from typer.testing import CliRunner

from tandem.cli.main import app
from tandem.config import build_config
from tandem.orchestration.runner import train

TASK = {"min_len": 2, "max_len": 3}  # the options tests/e2e/conftest.py trains warm_model on
COLOCATED_PLOTS = {"reward", "kl", "entropy", "signal", "grad_norm", "lengths", "timing", "throughput"}
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None, reason="headless Chromium not installed (Debian package `chromium`)"
)


def _run(model, out, *, mode="colocated", steps=3, seed=0):
    alerts = [{"name": "entropy_watch", "metric": "actor/entropy", "kind": "above", "threshold": 0.0}]
    cfg = build_config(
        {
            "run": {"name": out.name, "output_dir": str(out), "seed": seed},
            "model": {"path": str(model)},
            "data": {"task": "reverse", "task_options": TASK, "prompts_per_step": 4, "eval_size": 8},
            "rollout": {"n": 4, "max_new_tokens": 5},
            "trainer": {"total_steps": steps, "lr": 1e-3},
            "architecture": {"mode": mode, "staleness": 1},
            "monitor": {
                "alerts": alerts,
                "eval_every": 1,
                "sample_every": 1,
                "tensorboard": False,
                "progress": False,
            },
        }
    )
    train(cfg, progress=False)
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory, warm_model):
    root = tmp_path_factory.mktemp("runs")
    return _run(warm_model, root / "run-a"), _run(warm_model, root / "run-b", seed=1, steps=2)


def render(html_path, tmp_path) -> str:
    """The DOM after load, from headless Chromium."""
    proc = subprocess.run(
        [
            CHROMIUM,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            f"--user-data-dir={tmp_path / 'chromium-profile'}",
            "--virtual-time-budget=5000",
            "--dump-dom",
            html_path.resolve().as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


def _body_attrs(dom: str) -> dict[str, str]:
    body = re.search(r"<body([^>]*)>", dom).group(1)
    return dict(re.findall(r'data-([a-z-]+)="([^"]*)"', body))


def _plot_ids(html: str) -> set[str]:
    return set(re.findall(r'<img class="plot" id="plot-([a-z_]+)"', html))


def test_report_single_run_has_every_section(runs, tmp_path):
    run_a, _ = runs
    res = CliRunner().invoke(app, ["report", str(run_a), "--out", str(tmp_path / "rep")])
    assert res.exit_code == 0, res.output
    html = (tmp_path / "rep" / "report.html").read_text()
    assert _plot_ids(html) == COLOCATED_PLOTS
    assert {p.stem for p in (tmp_path / "rep").glob("*.png")} == COLOCATED_PLOTS
    assert 'src="data:image/png;base64,' in html and "<link" not in html  # self-contained
    assert "entropy_watch" in html and "<table id='alerts'>" in html  # the alert raised during training
    assert "class='samples'" in html and "reverse " in html  # sample completions
    assert "eval/accuracy" in html and "class='eval'" in html  # eval table
    assert "class='diagnosis'" in html and ("<td>learned</td>" in html or "<td>flat</td>" in html)  # verdict
    assert "what the metrics say" in res.output  # the same findings on the console, as train prints them
    assert "task: reverse" in html  # the config


@needs_chromium
def test_report_renders_in_headless_chromium(runs, tmp_path):
    run_a, _ = runs
    path = CliRunner().invoke(app, ["report", str(run_a), "--out", str(tmp_path / "rep")])
    assert path.exit_code == 0, path.output
    dom = render(tmp_path / "rep" / "report.html", tmp_path)
    attrs = _body_attrs(dom)
    assert "errors" not in attrs, attrs.get("errors")
    assert attrs["plots-total"] == attrs["plots-loaded"] == str(len(COLOCATED_PLOTS))
    assert _plot_ids(dom) == COLOCATED_PLOTS


@needs_chromium
def test_report_two_runs_side_by_side(runs, tmp_path):
    run_a, run_b = runs
    res = CliRunner().invoke(app, ["report", str(run_a), str(run_b), "--out", str(tmp_path / "cmp")])
    assert res.exit_code == 0, res.output
    assert res.output.count("what the metrics say") == 2  # each run's findings
    html = (tmp_path / "cmp" / "report.html").read_text()
    assert "run-a vs run-b" in html and "<div class='cols'>" in html
    assert html.count("<h3>run-a</h3>") >= 2 and html.count("<h3>run-b</h3>") >= 2
    attrs = _body_attrs(render(tmp_path / "cmp" / "report.html", tmp_path))
    assert "errors" not in attrs and attrs["plots-loaded"] == attrs["plots-total"] == str(
        len(COLOCATED_PLOTS)
    )


@pytest.mark.slow
@needs_chromium
def test_report_renders_for_a_decoupled_run(warm_model, tmp_path):
    run = _run(warm_model, tmp_path / "dec", mode="decoupled", steps=2)
    res = CliRunner().invoke(app, ["report", str(run)])
    assert res.exit_code == 0, res.output
    html_path = run / "report" / "report.html"
    assert "staleness" in _plot_ids(html_path.read_text())
    attrs = _body_attrs(render(html_path, tmp_path))
    assert "errors" not in attrs and attrs["plots-loaded"] == attrs["plots-total"]
    assert int(attrs["plots-total"]) == len(COLOCATED_PLOTS) + 1


def test_report_out_is_a_new_folder_or_an_earlier_report(runs, tmp_path):
    run_a, _ = runs
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "notes.txt").write_text("mine")
    for target, message in ((precious, "not a Tandem report folder"), (precious / "notes.txt", "is a file")):
        res = CliRunner().invoke(app, ["report", str(run_a), "--out", str(target)])
        assert res.exit_code == 2 and message in res.output, res.output
    assert [p.name for p in precious.iterdir()] == ["notes.txt"]
