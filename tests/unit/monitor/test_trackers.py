"""Experiment trackers (``monitor.report_to``): what the metrics logger hands them, and the checks that
stop a run before it starts. The real W&B run is tested in tests/integration/test_wandb_tracker.py."""

from __future__ import annotations

import math

import pytest

from tandem.config import build_config
from tandem.errors import ConfigError
from tandem.monitor import MetricsLogger
from tandem.monitor import trackers as trackers_mod
from tandem.monitor.trackers import check_trackers, open_trackers


class Recorder:
    """A tracker that keeps what it is told (a stand-in for a service, inside this unit test only)."""

    def __init__(self, run=None):
        self.run, self.rows, self.samples, self.closed, self.alerts = run, [], [], [], []

    def alert(self, message):
        self.alerts.append(message)

    def log(self, step, values):
        self.rows.append((step, dict(values)))

    def log_samples(self, step, rows):
        self.samples.append((step, [dict(r) for r in rows]))

    def close(self, *, failed=False):
        self.closed.append(failed)


def test_the_logger_hands_every_row_and_sample_to_its_trackers_and_closes_them(tmp_path):
    rec = Recorder()
    with MetricsLogger(tmp_path, total_steps=2, progress=False, tensorboard=False, trackers=[rec]) as log:
        log.log(0, {"eval/accuracy": 0.25})
        log.log_samples(1, [{"prompt": "1+1=", "completion": "2", "reward": 1.0}])
        log.log(1, {"reward/mean": 0.5, "actor/kl": float("nan"), "note": "text"})
        log.alert("grad spike at step 1")
    assert rec.rows[0] == (0, {"eval/accuracy": 0.25})
    step, row = rec.rows[1]
    assert step == 1 and row["reward/mean"] == 0.5 and math.isnan(row["actor/kl"]) and row["note"] == "text"
    assert rec.samples == [(1, [{"prompt": "1+1=", "completion": "2", "reward": 1.0}])]
    assert rec.alerts == [
        "actor/kl is nan at step 1",
        "grad spike at step 1",
    ]  # the non-finite one, then ours
    assert rec.closed == [False]
    log.close()  # twice is safe: the tracker's run is ended once
    assert rec.closed == [False]


def test_a_run_that_raises_closes_its_trackers_as_failed(tmp_path):
    rec = Recorder()
    logger = MetricsLogger(tmp_path, total_steps=2, progress=False, tensorboard=False, trackers=[rec])
    with pytest.raises(RuntimeError), logger:
        raise RuntimeError("step failed")
    assert rec.closed == [True]


def test_an_unknown_tracker_is_refused_with_the_valid_names():
    with pytest.raises(ConfigError, match="^monitor.report_to: unknown tracker 'wandbb'; valid: wandb"):
        check_trackers(["wandbb"])


def test_a_tracker_whose_package_is_missing_names_the_extra(monkeypatch):
    monkeypatch.setitem(trackers_mod.TRACKERS, "nowhere", ("x:Y", "no_such_package_here", "nowhere"))
    with pytest.raises(ConfigError, match="needs the no_such_package_here package") as err:
        check_trackers(["nowhere"])
    assert "pip install 'tandem-rl[nowhere]'" in str(err.value)


def test_trackers_started_before_one_that_fails_are_closed(monkeypatch):
    started = []

    class Fine(Recorder):
        def __init__(self, run):
            super().__init__(run)
            started.append(self)

    class Broken:
        def __init__(self, run):
            raise ConfigError("cannot start", where="monitor.report_to")

    monkeypatch.setattr(trackers_mod, "Fine", Fine, raising=False)
    monkeypatch.setattr(trackers_mod, "Broken", Broken, raising=False)
    monkeypatch.setitem(trackers_mod.TRACKERS, "fine", ("tandem.monitor.trackers:Fine", "pytest", "x"))
    monkeypatch.setitem(trackers_mod.TRACKERS, "broken", ("tandem.monitor.trackers:Broken", "pytest", "x"))
    with pytest.raises(ConfigError, match="cannot start"):
        open_trackers(["fine", "broken"], trackers_mod.TrackerRun(run_dir=None, name="r", config={}))
    assert [t.closed for t in started] == [[True]]


@pytest.mark.parametrize(("given", "expected"), [("wandb", ["wandb"]), ("none", []), (["wandb"], ["wandb"])])
def test_report_to_takes_trls_forms(given, expected, tiny_model_dir):
    cfg = build_config(
        {"model": {"path": str(tiny_model_dir)}, "data": {"task": "arith"}, "monitor": {"report_to": given}}
    )
    assert cfg.monitor.report_to == expected
