"""Calibration on recorded CPU runs: the simulator, fed each run's fitted phases, predicts the run's wall time
per step within 15 %.

The folders under ``recorded/`` are real runs of the quickstart workload (configs/quickstart.yaml, 16 steps,
loss decoupled_ppo), colocated and decoupled at η = 0, 1, 2 with 1 and 2 rollout workers, recorded with
``bench/plan_validate.py --fixtures`` on the shared 2-core machine (load average 15–17: phase times are
slow and noisy, which is what the calibration has to follow). Only the timing keys of each row are kept.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tandem.errors import ConfigError, DataError
from tandem.plan.calibrate import check, read_run
from tandem.plan.simulate import Layout

RUNS = Path(__file__).parent / "recorded"
NAMES = sorted(p.name for p in RUNS.iterdir() if p.is_dir())


def test_all_layouts_are_recorded():
    assert set(NAMES) == {
        "colocated",
        *(f"dec_eta{eta}_w{w}" for eta in (0, 1, 2) for w in (1, 2)),
    }


@pytest.mark.parametrize("name", NAMES)
def test_calibrated_prediction_is_within_15_percent(name):
    run = read_run(RUNS / name)
    result = check(run)
    assert abs(result.error) <= 0.15, (name, run.measured_step_s, result.predicted.step_s)
    assert max(result.predicted.lag) <= run.layout.staleness


@pytest.mark.parametrize("name", NAMES)
def test_the_run_layout_is_read_from_its_config(name):
    run = read_run(RUNS / name)
    if name == "colocated":
        assert run.layout == Layout()
    else:
        eta, workers = int(name[7]), int(name[-1])
        assert (run.layout.mode, run.layout.staleness, run.layout.workers) == ("decoupled", eta, workers)
    assert run.samples_per_step == 16 * 8
    assert run.phases.generate > 0 and run.phases.update > 0
    assert run.gen_tokens_per_s > 0


def test_predicted_lag_matches_the_measured_mode():
    """η = 2 with one worker: the worker runs ahead to the bound, as measured."""
    run = read_run(RUNS / "dec_eta2_w1")
    measured_mode = max(run.measured_lag, key=run.measured_lag.get)
    predicted = check(run).predicted.lag
    assert max(predicted, key=predicted.get) == measured_mode == 2


def test_errors_are_one_line(tmp_path):
    with pytest.raises(ConfigError, match="config.yaml not found: not a run folder"):
        read_run(tmp_path)
    shutil.copytree(RUNS / "colocated", tmp_path / "short")
    rows = (tmp_path / "short" / "metrics.jsonl").read_text().splitlines()[:4]
    (tmp_path / "short" / "metrics.jsonl").write_text("\n".join(rows) + "\n")
    with pytest.raises(DataError, match="4 timed steps; calibration needs at least 6"):
        read_run(tmp_path / "short")
    (tmp_path / "short" / "metrics.jsonl").write_text(rows[0] + "\n{oops\n")
    with pytest.raises(DataError, match=r"metrics.jsonl:2: not JSON"):
        read_run(tmp_path / "short")


def test_rows_without_timings_are_ignored(tmp_path):
    """Evaluation rows (no timing/step) interleave with step rows in real runs."""
    shutil.copytree(RUNS / "colocated", tmp_path / "run")
    path = tmp_path / "run" / "metrics.jsonl"
    rows = path.read_text().splitlines()
    path.write_text(
        json.dumps({"step": 0, "time": 1.0, "eval/accuracy": 0.3}) + "\n" + "\n".join(rows) + "\n"
    )
    assert read_run(tmp_path / "run").measured_step_s == pytest.approx(
        read_run(RUNS / "colocated").measured_step_s
    )
