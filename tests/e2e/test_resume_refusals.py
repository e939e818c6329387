"""What ``--resume`` refuses, in one line and leaving the run folder as it was: a run folder that logged
steps but holds no complete checkpoint (it was retrained from step 0 under its old metrics and ``best/``), a
run that already finished (its summary was rewritten empty), a change of ``architecture.mode`` (a KeyError);
and SIGTERM, which stops a run as Ctrl-C does and says how to go on."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from run_checks import resume_config

from tandem.config import config_to_yaml
from tandem.errors import TandemError
from tandem.monitor import read_metrics
from tandem.orchestration.runner import train


def test_resume_of_finished_run_keeps_its_summary(tiny_model_dir, tmp_path, caplog):
    cfg = resume_config(tiny_model_dir, tmp_path / "run", trainer={"total_steps": 2, "lr": 1e-3})
    train(cfg, progress=False)
    before = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert before["eval_after"]
    with pytest.raises(TandemError, match="already finished at step 2"):
        train(cfg, resume=True, progress=False)
    assert json.loads((tmp_path / "run" / "summary.json").read_text()) == before
    longer = resume_config(tiny_model_dir, tmp_path / "run", trainer={"total_steps": 3, "lr": 1e-3})
    assert train(longer, resume=True, progress=False).steps == 3  # extending it still works
    said = " ".join(
        caplog.text.split()
    )  # the cosine schedule's horizon moved: the warning says the rate jumps
    assert "trainer.total_steps: 2 -> 3" in said and "so the rate jumps at step 2" in said


def test_resume_without_complete_checkpoint_does_not_start_over(tiny_model_dir, tmp_path):
    cfg = resume_config(tiny_model_dir, tmp_path / "run")
    train(cfg, progress=False)
    (tmp_path / "run" / "summary.json").unlink()  # as if killed after its last step
    for marker in (tmp_path / "run" / "checkpoints").glob("step-*/COMPLETE"):
        marker.unlink()  # e.g. every checkpoint folder damaged / copied without its marker
    rows_before = read_metrics(tmp_path / "run")
    with pytest.raises(TandemError, match="holds no complete checkpoint"):
        train(cfg, resume=True, progress=False)
    assert read_metrics(tmp_path / "run") == rows_before


def test_switching_architecture_on_resume_is_a_clear_error(tiny_model_dir, tmp_path, crash_at_step):
    cfg = resume_config(tiny_model_dir, tmp_path / "run")
    crash_at_step(cfg, 2)
    decoupled = resume_config(
        tiny_model_dir, tmp_path / "run", architecture={"mode": "decoupled", "staleness": 0}
    )
    config_before = (tmp_path / "run" / "config.yaml").read_text()
    with pytest.raises(
        TandemError,
        match="architecture.mode: decoupled, but the run's checkpoint was written by a colocated run",
    ):
        train(decoupled, resume=True, progress=False)
    assert (tmp_path / "run" / "config.yaml").read_text() == config_before


def test_sigterm_stops_a_run_as_ctrl_c_does_and_says_how_to_go_on(tiny_model_dir, tmp_path):
    """A scheduler's SIGTERM used to kill the CLI where it stood, silently. Now: exit 143, "terminated",
    and, for a run with no checkpoint yet (``checkpoint.every=0``: only at the end), the command that starts
    it over — ``--resume`` would be refused."""
    cfg = resume_config(
        tiny_model_dir, tmp_path / "run", trainer={"total_steps": 10_000, "lr": 1e-3}, checkpoint={"every": 0}
    )
    cfg_file = tmp_path / "cfg.yaml"
    cfg_file.write_text(config_to_yaml(cfg))
    cli = [sys.executable, "-c", "from tandem.cli.main import app; app()", "train", str(cfg_file)]
    proc = subprocess.Popen(
        cli, env={**os.environ, "OMP_NUM_THREADS": "1"}, stderr=subprocess.PIPE, text=True
    )
    metrics = tmp_path / "run" / "metrics.jsonl"
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and proc.poll() is None:
        if metrics.exists() and len(metrics.read_text().splitlines()) >= 2:
            break
        time.sleep(0.2)
    assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143 and "terminated" in err and "Traceback" not in err, err
    said = " ".join(err.split())
    assert f"start over with: tandem train {cfg_file} run.overwrite=true" in said, err
    with pytest.raises(TandemError, match="no complete checkpoint"):
        train(cfg, resume=True, progress=False)
