"""A real W&B run (offline mode: no network, the run kept in the run folder) receives what the training
loop logs: the config, every metric row at its step, the samples, the exit code; a W&B that cannot start
stops the run before its first step and leaves no run folder. The run is read back from W&B's own
transaction log (``run-<id>.wandb``: its record framing, its protobuf records)."""

from __future__ import annotations

import json
import struct

import pytest

from tandem.config import build_config
from tandem.errors import ConfigError
from tandem.orchestration.runner import train

wandb_pb = pytest.importorskip("wandb.proto.wandb_internal_pb2")

BLOCK = 32768  # W&B's log: 32 KiB blocks of records framed as (crc32c u32, length u16, type u8)
FULL, FIRST, LAST = 1, 2, 4


def wandb_records(path):
    """Every record of a W&B transaction log, in order."""
    data = path.read_bytes()
    assert data[:4] == b":W&B"
    pos, buf = 7, b""
    while pos + 7 <= len(data):
        if BLOCK - pos % BLOCK < 7:  # a block's tail too short for a header is padding
            pos += BLOCK - pos % BLOCK
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        chunk = data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        buf = chunk if kind in (FULL, FIRST) else buf + chunk
        if kind in (FULL, LAST):
            record = wandb_pb.Record()
            record.ParseFromString(buf)
            yield record


def _offline(monkeypatch, tmp_path):
    import wandb

    wandb.teardown()  # W&B keeps its settings (offline, a login) per process: start from the environment
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    for var in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(var, str(tmp_path / "wandb-home"))
    monkeypatch.delenv("WANDB_API_KEY", raising=False)


def _cfg(tiny_model_dir, out, mode="colocated", **monitor):
    return build_config(
        {
            "architecture": {"mode": mode, "staleness": 0},
            "run": {"name": "tracked", "output_dir": str(out), "seed": 0},
            "model": {"path": str(tiny_model_dir)},
            "data": {"task": "arith", "prompts_per_step": 2, "eval_size": 4, "train_size": 16},
            "rollout": {"n": 2, "max_new_tokens": 3},
            "trainer": {"total_steps": 3, "lr": 1e-3},
            "monitor": {
                "eval_every": 1,
                "sample_every": 2,
                "num_samples": 2,
                "tensorboard": False,
                "progress": False,
                "report_to": ["wandb"],
                # fires at every step: each alert the run raises becomes a W&B alert
                "alerts": [{"name": "always", "metric": "reward/mean", "kind": "above", "threshold": -1.0}],
                **monitor,
            },
        }
    )


@pytest.mark.parametrize("mode", ["colocated", "decoupled"])
def test_a_wandb_run_holds_the_config_every_metric_row_and_the_samples(
    tiny_model_dir, tmp_path, monkeypatch, mode
):
    _offline(monkeypatch, tmp_path)
    cfg = _cfg(tiny_model_dir, tmp_path / "run", mode, group="sweep-1", tags=["t1"])
    result = train(cfg, progress=False)
    (log,) = (result.run_dir / "wandb").glob("offline-run-*/run-*.wandb")
    records = list(wandb_records(log))
    run = next(r.run for r in records if r.WhichOneof("record_type") == "run")
    assert (run.display_name, run.project, run.run_group, list(run.tags)) == (
        "tracked",
        "tandem",
        "sweep-1",
        ["t1"],
    )
    config = {u.key: json.loads(u.value_json) for u in run.config.update}
    assert config["trainer"]["total_steps"] == 3 and config["run"]["name"] == "tracked"

    rows = {}  # W&B's rows by Tandem's step; several W&B rows may share one (the samples, then the metrics)
    for r in records:
        if r.WhichOneof("record_type") == "history":
            row = {(i.key or "/".join(i.nested_key)): i.value_json for i in r.history.item}
            rows.setdefault(int(row["step"]), {}).update(row)
    logged = [json.loads(x) for x in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert sorted(rows) == sorted({r["step"] for r in logged}) == [0, 1, 2, 3]
    for mine in logged:
        theirs = rows[mine["step"]]
        numbers = {k: v for k, v in mine.items() if k not in ("step", "time") and isinstance(v, (int, float))}
        assert numbers and all(k in theirs for k in numbers), mine["step"]
        assert all(json.loads(theirs[k]) == pytest.approx(v) for k, v in numbers.items()), mine["step"]
    # samples at step 1 (always) and 2 (sample_every), as W&B tables of num_samples rows
    tables = {s: json.loads(row["samples/nrows"]) for s, row in rows.items() if "samples/nrows" in row}
    assert tables == {1: 2, 2: 2}
    alerts = [r.alert.text for r in records if r.WhichOneof("record_type") == "alert"]
    raised = [json.loads(x) for x in (result.run_dir / "alerts.jsonl").read_text().splitlines()]
    assert len(alerts) == len(raised) >= 1 and all(
        r["message"] in a for r, a in zip(raised, alerts, strict=True)
    )
    exits = [r.exit.exit_code for r in records if r.WhichOneof("record_type") == "exit"]
    assert exits == [0]


def test_a_wandb_that_cannot_start_stops_the_run_and_leaves_no_folder(tiny_model_dir, tmp_path, monkeypatch):
    _offline(monkeypatch, tmp_path)
    monkeypatch.setenv("WANDB_MODE", "online")  # online without an API key or login: W&B refuses at once
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("NETRC", str(tmp_path / "home" / ".netrc"))
    with pytest.raises(
        ConfigError, match=r"^monitor.report_to: W&B could not start a run: .*WANDB_MODE=offline"
    ):
        train(_cfg(tiny_model_dir, tmp_path / "run"), progress=False)
    assert not (tmp_path / "run").exists()
