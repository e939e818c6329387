"""``tandem plan``: the layout table, recommendation and plot; calibration; one-line errors."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from tandem.cli.main import app
from tandem.cli.plan import parse_amount, parse_interference
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
        (
            ["--model-params", "7e9", "--interference", "generate=1.2"],
            "--interference: --interference applies to --calibrate only",
        ),
        (
            ["--calibrate", str(RUNS / "colocated"), "--interference", "generate=1.2"],
            "--interference: --interference needs --cores",
        ),
        (
            ["--calibrate", str(RUNS / "colocated"), "--cores", "2", "--interference", "decode=1.2"],
            "--interference: expected KIND=FACTOR with KIND one of generate, update, got 'decode=1.2'",
        ),
        (
            ["--calibrate", str(RUNS / "colocated"), "--cores", "2", "--interference", "update=-1"],
            "--interference: update: expected a factor > 0, got '-1'",
        ),
        (
            ["--calibrate", str(RUNS / "colocated"), "--cores", "2", "--interference", "update=x"],
            "--interference: update: expected a factor > 0, got 'x'",
        ),
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


def _rows(output: str) -> dict[str, float]:
    """Layout name → predicted step time from the other-layouts table."""
    return {
        line.split("│")[1].strip(): float(line.split("│")[2])
        for line in output.splitlines()
        if line.count("│") >= 6 and line.split("│")[2].strip().replace(".", "").isdigit()
    }


def test_interference_slows_only_the_layouts_where_phases_overlap():
    """Factors > 1 apply while two of the run's phases compute at once: η = 1 gets slower; colocated (one
    phase at a time) does not, and η = 0 barely (only the learner's logging overlaps the next rollout)."""
    base = invoke("--calibrate", str(RUNS / "colocated"), "--cores", "2")
    slow = invoke(
        "--calibrate", str(RUNS / "colocated"), "--cores", "2", "--interference", "generate=1.5,update=1.3"
    )
    assert base.exit_code == 0 and slow.exit_code == 0, slow.output
    before, after = _rows(base.output), _rows(slow.output)
    assert after["colocated"] == before["colocated"]
    assert (
        before["decoupled η=0 workers=1"]
        <= after["decoupled η=0 workers=1"]
        < 1.05 * before["decoupled η=0 workers=1"]
    )
    assert after["decoupled η=1 workers=1"] > 1.1 * before["decoupled η=1 workers=1"]


def test_parse_interference():
    assert parse_interference("generate=1.2, update=1") == {"generate": 1.2, "update": 1.0}
    with pytest.raises(ConfigError, match="generate given twice"):
        parse_interference("generate=1.2,generate=1.3")
    with pytest.raises(ConfigError, match="expected KIND=FACTOR"):
        parse_interference("1.2")
    with pytest.raises(ConfigError, match="expected a factor > 0, got 'inf'"):
        parse_interference("update=inf")


def test_calibrate_a_run_with_cpu_times_predicts_from_them_under_its_own_load():
    """A run that logged cpu/<phase>: the table shows CPU seconds, the default background is the load that
    explains its share of a core, so the colocated row gives its own step time back; --background 0 (the
    machine idle) predicts it faster."""
    run = Path(__file__).parent / "recorded_paired" / "colocated_before_dec_eta1_w1"
    loaded = invoke("--calibrate", str(run), "--cores", "2")
    idle = invoke("--calibrate", str(run), "--cores", "2", "--background", "0")
    assert loaded.exit_code == 0 and idle.exit_code == 0, loaded.output
    assert "cpu s per thread" in loaded.output and "share of a core per thread" in loaded.output
    measured = float(loaded.output.split("measured ")[1].split(" s/step")[0])
    assert _rows(loaded.output)["colocated"] == pytest.approx(measured, rel=0.05)
    assert _rows(idle.output)["colocated"] < 0.6 * measured  # the run got well under half a core


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--samples-per-step", "4", "--group-size", "8"], "--samples-per-step: 4 is less than one group"),
        (["--samples-per-step", "10", "--group-size", "3"], "--samples-per-step: 10 is not a multiple"),
    ],
)
def test_a_step_that_is_not_whole_groups_is_refused(args, message):
    result = invoke("--model-params", "7B", *args)
    assert result.exit_code == 2 and message in result.output and "Traceback" not in result.output


@pytest.mark.parametrize("where", ["below_a_file", "a_folder"])
def test_an_unwritable_plot_path_is_refused_in_one_line(tmp_path, where):
    """A --plot below an existing file used to end in a FileExistsError traceback after the planning."""
    (tmp_path / "afile").write_text("keep")
    plot = tmp_path / "afile" / "p.svg" if where == "below_a_file" else tmp_path
    result = invoke("--model-params", "7B", "--plot", str(plot))
    assert result.exit_code == 2 and "--plot:" in result.output and "Traceback" not in result.output
    assert (tmp_path / "afile").read_text() == "keep"
