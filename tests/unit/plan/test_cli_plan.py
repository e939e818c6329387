"""``tandem plan``: the layout table, recommendation and plot; calibration; one-line errors."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from tandem.cli.main import app
from tandem.cli.plan import parse_amount
from tandem.errors import ConfigError

RUNS = Path(__file__).parent / "recorded"


@pytest.fixture(autouse=True)
def wide_console(monkeypatch):
    """The table at 200 columns whatever the worker's terminal (``COLUMNS`` alone did not reach the shared
    console in a full xdist run, and rich wrapped the layout names)."""
    import tandem.cli.plan as plan_cli

    monkeypatch.setattr(plan_cli.out, "_width", 200)


def invoke(*args: str):
    return CliRunner().invoke(app, ["plan", *args], env={"COLUMNS": "200"})


def test_layout_table_recommendation_and_svg_plot(tmp_path):
    plot = tmp_path / "plan.svg"
    res = invoke(
        "--model-params",
        "7e9",
        "--gpus",
        "64",
        "--gpu",
        "h100",
        "--completion-len",
        "8k",
        "--plot",
        str(plot),
    )
    assert res.exit_code == 0, res.output
    assert "colocated 64" in res.output and "split " in res.output
    assert "recommended:" in res.output and "settings: architecture.mode=" in res.output
    assert plot.read_text().startswith("<") and "samples/s" in plot.read_text()


def test_staleness_two_or_more_recommends_the_corrected_loss():
    res = invoke("--model-params", "7B", "--gpus", "64", "--completion-len", "8k", "--etas", "2")
    assert res.exit_code == 0, res.output
    assert "algorithm.name=decoupled_ppo" in res.output


def test_calibrate_prints_predicted_and_measured():
    res = invoke("--calibrate", str(RUNS / "dec_eta1_w1"))
    assert res.exit_code == 0, res.output
    assert "measured" in res.output and "predicted" in res.output and "decoupled η=1" in res.output


def test_calibrate_with_shared_cores_slows_the_overlapped_layouts():
    """One core shared: the colocated run's phases predict η ≥ 1 no faster than colocated (own cores:
    max(G, T)), since the worker and the learner split the core."""
    res = invoke("--calibrate", str(RUNS / "colocated"), "--cores", "1")
    assert res.exit_code == 0, res.output
    assert "sharing 1 cores" in res.output
    rows = {
        line.split("│")[1].strip(): float(line.split("│")[2])
        for line in res.output.splitlines()
        if line.count("│") >= 6 and line.split("│")[2].strip().replace(".", "").isdigit()
    }
    assert rows["decoupled η=1 workers=1"] >= 0.99 * rows["colocated"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--calibrate", str(RUNS / "dec_eta1_w1"), "--cores", "2"],
            "--cores: --cores needs a colocated run",
        ),
        (["--model-params", "7e9", "--cores", "2"], "--cores: --cores applies to --calibrate only"),
        (["--model-params", "7e9", "--gpu", "tpu"], "--gpu: unknown device 'tpu'"),
        (["--model-params", "seven"], "--model-params: expected a number"),
        (["--model-params", "7e9", "--etas", "1,x"], "--etas: expected comma-separated integers"),
        (["--model-params", "2e12", "--gpus", "8"], "does not fit"),
        (["--model-params", "70e9", "--gpus", "2"], "no layout fits"),
        ([], "--model-params: nothing to plan"),
        (["--calibrate", "/nonexistent/run"], "not a run folder"),
    ],
)
def test_bad_input_is_one_line(args, message):
    res = invoke(*args)
    assert res.exit_code == 2
    assert message in res.output
    assert "Traceback" not in res.output


def test_parse_amount():
    assert parse_amount("7e9", "--x") == 7e9
    assert parse_amount("1.5B", "--x") == 1.5e9
    assert parse_amount("8k", "--x", binary=True) == 8192
    assert parse_amount("8k", "--x") == 8000
    with pytest.raises(ConfigError, match="--x: must be positive"):
        parse_amount("0", "--x")
