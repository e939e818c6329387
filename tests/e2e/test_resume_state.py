"""Resume keeps the state a run's future depends on, and refuses a damaged checkpoint in one line (QA
findings 2 and 4, /tmp/qa_resume.md).

- Alert rule history (growth baselines, streaks) and the rollback count are in the checkpoint: a resumed
  run raises the alerts an uninterrupted one raises, and ``monitor.max_rollbacks`` counts over the run.
  A checkpoint without alert state (an older version's) still resumes, with fresh alerts.
- A truncated or garbled file of the latest checkpoint is a one-line ModelError naming the file, whose hint
  names the previous complete checkpoint (no silent fall back: the steps in between are the user's call).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from run_checks import resume_config

from tandem.errors import ModelError, TandemError
from tandem.monitor import read_metrics
from tandem.monitor.alerts import read_alerts
from tandem.orchestration.alerting import AlertStopError
from tandem.orchestration.runner import train
from tandem.train.checkpoint import latest_checkpoint


def test_alert_history_survives_resume(tiny_model_dir, tmp_path, crash_at_step):
    # growth > ~0 x the mean of the first 3 rewards: fires from the 4th step on, if the history is kept
    rule = {"metric": "reward/mean", "kind": "growth", "threshold": 1e-6, "min_history": 3, "action": "skip"}
    extra = {
        "monitor": {
            "eval_every": 0,
            "sample_every": 0,
            "tensorboard": False,
            "progress": False,
            "alerts": [rule],
        }
    }
    full = train(resume_config(tiny_model_dir, tmp_path / "full", **extra), progress=False)
    crash_at_step(resume_config(tiny_model_dir, tmp_path / "part", **extra), 2)
    resumed = train(resume_config(tiny_model_dir, tmp_path / "part", **extra), resume=True, progress=False)

    def skipped(run):
        return [
            (r["step"], r.get("actor/skipped_by_alert")) for r in read_metrics(run.run_dir) if r["step"] >= 1
        ]

    assert skipped(resumed) == skipped(full)


def test_rollback_count_survives_resume(tiny_model_dir, tmp_path):
    """``actor/lr`` > 0 fires at every step. With ``max_rollbacks=1`` the first run rolls back once (to its
    step-0 checkpoint), then stops at step 1 with a checkpoint that remembers that rollback; the resumed
    run has none left, so its first alert (step 2) stops it. A count reset on resume would roll back again
    (to step 0) and stop at step 1."""
    rule = {"metric": "actor/lr", "kind": "above", "threshold": 0.0, "action": "rollback", "lr_scale": 1.0}
    monitor = {"alerts": [rule], "max_rollbacks": 1}
    cfg = resume_config(
        tiny_model_dir, tmp_path / "run", monitor=monitor, trainer={"lr_schedule": "constant"}
    )
    with pytest.raises(AlertStopError, match="at step 1"):
        train(cfg, progress=False)
    first = read_alerts(tmp_path / "run")
    assert [a["effect"].split(" (")[0] for a in first] == [
        "rolled back to the last good checkpoint",
        "no rollback left",
    ]
    with pytest.raises(AlertStopError, match="at step 2"):
        train(cfg, resume=True, progress=False)
    assert [(a["step"], a["effect"].split(" (")[0]) for a in read_alerts(tmp_path / "run")[2:]] == [
        (2, "no rollback left")
    ]


def test_checkpoint_without_alert_state_resumes_with_fresh_alerts(tiny_model_dir, tmp_path, crash_at_step):
    """A checkpoint written before alert state was saved (no ``extra_state.alerts``) resumes; its growth
    rule re-learns its baseline from the resumed steps (min_history 3: cannot fire in steps 3-4)."""
    rule = {"metric": "reward/mean", "kind": "growth", "threshold": 1e-6, "min_history": 3, "action": "skip"}
    cfg = resume_config(tiny_model_dir, tmp_path / "run", monitor={"alerts": [rule]})
    crash_at_step(cfg, 2)
    state_file = latest_checkpoint(tmp_path / "run" / "checkpoints") / "state.json"
    state = json.loads(state_file.read_text())
    del state["extra_state"]["alerts"]
    state_file.write_text(json.dumps(state))
    resumed = train(cfg, resume=True, progress=False)
    assert resumed.steps == 4
    assert [r.get("actor/skipped_by_alert", 0.0) for r in read_metrics(resumed.run_dir) if r["step"] > 2] == [
        0.0,
        0.0,
    ]


def _truncate(file: Path) -> None:
    file.write_bytes(file.read_bytes()[: file.stat().st_size // 2])


def _garble(file: Path) -> None:
    file.write_bytes(bytes(range(256)) + b"not a checkpoint file" * 10)


@pytest.mark.parametrize(
    ("name", "damage"),
    [("model/model.safetensors", _truncate), ("state.json", _truncate), ("rng.pt", _garble)],
)
def test_damaged_latest_checkpoint_is_one_line_naming_file_and_previous(
    tiny_model_dir, tmp_path, crash_at_step, name, damage
):
    """Checkpoints at steps 1 and 2; step 2's ``name`` is damaged. The resume stops with one line that names
    the file and says which folder to move away to resume from step 1, without falling back by itself."""
    cfg = resume_config(tiny_model_dir, tmp_path / "run", checkpoint={"every": 1})
    crash_at_step(cfg, 2)
    latest = latest_checkpoint(tmp_path / "run" / "checkpoints")
    assert latest is not None and latest.name == "step-00000002"
    damage(latest / name)
    with pytest.raises(ModelError) as err:
        train(cfg, resume=True, progress=False)
    said = str(err.value)
    assert "\n" not in said and said.startswith(f"{latest / name}: damaged or truncated file"), said
    assert f"remove or rename {latest} to resume from step-00000001" in said, said
    assert "weights_only" not in said  # torch's advice to unpickle anyway is wrong for a damaged file
    assert latest_checkpoint(tmp_path / "run" / "checkpoints") == latest  # nothing removed for the user


def test_truncated_checkpoint_weights_give_a_tandem_error(tiny_model_dir, tmp_path, crash_at_step):
    """The only checkpoint's weights are truncated: a TandemError naming the file (not a SafetensorError
    traceback), which says there is no earlier checkpoint to go back to."""
    cfg = resume_config(tiny_model_dir, tmp_path / "run")
    crash_at_step(cfg, 2)
    weights = latest_checkpoint(tmp_path / "run" / "checkpoints") / "model" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    with pytest.raises(TandemError) as err:
        train(cfg, resume=True, progress=False)  # no silent fall back to an older checkpoint
    assert str(err.value).startswith(f"{weights}: damaged or truncated file"), str(err.value)
    assert "no earlier complete one to resume from" in str(err.value)
