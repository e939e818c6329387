"""Object storage for RL runs, on a local S3-compatible server (moto on 127.0.0.1):

* the policy is read from an ``s3://`` model folder;
* ``checkpoint.remote_dir`` copies every checkpoint (marker last), ``metrics.jsonl`` and ``config.yaml``,
  keeping the last ``keep_last`` remotely too;
* ``--resume`` in an empty run folder (a fresh machine) fetches the newest remote checkpoint and continues
  from its step;
* ``tandem export`` reads a checkpoint from and writes the exported model to ``s3://`` URLs.
"""

from __future__ import annotations

import json

import pytest
from run_checks import step_rows
from typer.testing import CliRunner

from tandem.config import build_config
from tandem.data import storage
from tandem.orchestration.runner import train

pytest.importorskip("s3fs")
pytest.importorskip("moto.server")


def _cfg(model, out, steps):
    return build_config(
        {
            "run": {"name": "r1", "output_dir": str(out), "seed": 1},
            "model": {"path": model},
            "data": {"task": "arith", "prompts_per_step": 2, "eval_size": 0, "train_size": 16},
            "rollout": {"n": 4, "max_new_tokens": 4},
            "trainer": {"total_steps": steps, "lr": 1e-3},
            "checkpoint": {"every": 1, "keep_last": 2, "remote_dir": "s3://prefs/ckpts"},
            "monitor": {"eval_every": 0, "sample_every": 0, "tensorboard": False, "progress": False},
        }
    )


def test_s3_model_checkpoints_resume_and_export(s3, tiny_model_dir, tmp_path):
    storage.upload(tiny_model_dir, "s3://prefs/models/tiny")
    first = train(_cfg("s3://prefs/models/tiny", tmp_path / "a", 3))
    assert first.steps == 3
    remote = "prefs/ckpts/r1"
    names = sorted(p.rsplit("/", 1)[-1] for p in s3.ls(f"{remote}/checkpoints"))
    assert names == ["step-00000002", "step-00000003"]  # keep_last 2, remotely too
    for name in names:
        files = {p.rsplit("/", 1)[-1] for p in s3.find(f"{remote}/checkpoints/{name}")}
        assert {"COMPLETE", "state.json", "optimizer.pt", "model.safetensors"} <= files
    rows = [json.loads(line) for line in s3.cat(f"{remote}/metrics.jsonl").decode().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2, 3]  # as of the last checkpoint
    assert "remote_dir: s3://prefs/ckpts" in s3.cat(f"{remote}/config.yaml").decode()

    # a fresh machine: empty run folder, --resume continues from the remote step 3
    second = train(_cfg("s3://prefs/models/tiny", tmp_path / "b", 4), resume=True)
    assert second.steps == 4
    assert [r["step"] for r in step_rows(tmp_path / "b")] == [4]  # steps 1-3 were not trained again
    assert (tmp_path / "b" / "checkpoints" / "step-00000003" / "COMPLETE").is_file()
    names = sorted(p.rsplit("/", 1)[-1] for p in s3.ls(f"{remote}/checkpoints"))
    assert names == ["step-00000003", "step-00000004"]

    from tandem.cli.main import app

    result = CliRunner().invoke(
        app,
        [
            "export",
            f"s3://{remote}/checkpoints/step-00000004",
            "--format",
            "hf",
            "--out",
            "s3://prefs/exports/m",
        ],
    )
    assert result.exit_code == 0, result.output
    exported = {p.rsplit("/", 1)[-1] for p in s3.find("prefs/exports/m")}
    assert {"config.json", "model.safetensors"} <= exported


def test_resume_without_a_newer_remote_checkpoint_keeps_the_local_one(s3, tiny_model_dir, tmp_path):
    cfg = _cfg(str(tiny_model_dir), tmp_path / "run", 2).model_copy(deep=True)
    cfg.run.name = "r2"
    train(cfg)
    from tandem.orchestration.remote import fetch_newer_checkpoint

    assert fetch_newer_checkpoint(cfg, tmp_path / "run" / "checkpoints") is None  # local step 2 is current


def test_unwritable_remote_dir_is_one_line_before_training(s3, tiny_model_dir, tmp_path):
    from tandem.errors import DataError

    cfg = _cfg(str(tiny_model_dir), tmp_path / "run", 2).model_copy(deep=True)
    cfg.checkpoint.remote_dir = "s3://no-such-bucket/ckpts"
    with pytest.raises(
        DataError, match=r"checkpoint\.remote_dir.*cannot write to s3://no-such-bucket"
    ) as err:
        train(cfg)
    assert "\n" not in str(err.value), str(err.value)
    assert not (tmp_path / "run" / "checkpoints").exists()  # nothing trained


def test_remote_dir_must_be_a_url(tiny_model_dir, tmp_path):
    from tandem.errors import ConfigError

    raw = {"model": {"path": str(tiny_model_dir)}, "checkpoint": {"remote_dir": str(tmp_path / "x")}}
    with pytest.raises(ConfigError, match=r"checkpoint\.remote_dir: .* is not an object-storage URL"):
        build_config(raw)
