"""Object storage: preference data read from and outputs written to s3:// URLs on a local
S3-compatible server (moto in server mode on 127.0.0.1), through the same CLI commands."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from tandem.data import storage
from tandem.errors import DataError

pytest.importorskip("s3fs")
pytest.importorskip("moto.server")


ROWS = [
    {"prompt": f"q{i}?", "chosen": "yes", "rejected": "no", "category": "a" if i % 3 else "b"}
    for i in range(12)
]


def test_cli_reads_and_writes_s3(s3, tmp_path):
    from tandem.cli.main import app

    s3.pipe("prefs/in/train.jsonl", "".join(json.dumps(r) + "\n" for r in ROWS).encode())
    runner = CliRunner()
    result = runner.invoke(app, ["data", "validate", "s3://prefs/in/train.jsonl"])
    assert result.exit_code == 0 and "12 valid pairs" in result.output, result.output
    result = runner.invoke(
        app, ["data", "split", "s3://prefs/in/train.jsonl", "--out-dir", "s3://prefs/split"]
    )
    assert result.exit_code == 0, result.output
    train = s3.cat("prefs/split/train.jsonl").decode().splitlines()
    val = s3.cat("prefs/split/val.jsonl").decode().splitlines()
    assert len(train) + len(val) == 12 and val
    result = runner.invoke(app, ["data", "validate", "s3://prefs/in/missing.jsonl"])
    assert result.exit_code == 2 and "s3://prefs/in/missing.jsonl: object does not exist" in result.output


def test_folders_round_trip(s3, tmp_path):
    folder = tmp_path / "model"
    (folder / "sub").mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    (folder / "sub" / "w.bin").write_bytes(b"\x00\x01")
    storage.upload(folder, "s3://prefs/models/m")
    assert sorted(s3.find("prefs/models/m")) == ["prefs/models/m/config.json", "prefs/models/m/sub/w.bin"]
    with storage.local_input("s3://prefs/models/m") as local:
        assert (local / "sub" / "w.bin").read_bytes() == b"\x00\x01"
    with storage.local_output("s3://prefs/out/x.jsonl") as local:
        local.write_text("hi\n")
    assert s3.cat("prefs/out/x.jsonl") == b"hi\n"


def test_local_paths_do_not_touch_fsspec(tmp_path):
    assert not storage.is_remote(tmp_path / "a") and storage.is_remote("s3://b/k")
    with storage.local_input(f"file://{tmp_path}") as local:
        assert local == tmp_path
    assert storage.join_url("s3://b/x/", "t.jsonl") == "s3://b/x/t.jsonl"
    with (
        pytest.raises(DataError, match="object does not exist"),
        storage.local_input("memory://nothing/here"),
    ):
        pass


def test_reward_model_trains_from_and_saves_to_s3(s3, tiny_model_dir, tmp_path):
    """`tandem rm` with the starting model, the data and the output all on S3."""
    import yaml

    from tandem.cli.main import app

    storage.upload(tiny_model_dir, "s3://prefs/models/tiny")
    s3.pipe("prefs/rm/train.jsonl", "".join(json.dumps(r) + "\n" for r in ROWS).encode())
    cfg = tmp_path / "rm.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {
                "model": "s3://prefs/models/tiny",
                "out_dir": "s3://prefs/rm/out",
                "data": {"train_file": "s3://prefs/rm/train.jsonl", "val_fraction": 0.25},
                "epochs": 1,
                "batch_size": 8,
            }
        )  # fmt: skip
    )
    result = CliRunner().invoke(app, ["rm", str(cfg)])
    assert result.exit_code == 0, result.output
    files = {p.rsplit("/", 1)[-1] for p in s3.find("prefs/rm/out")}
    assert {"config.json", "model.safetensors", "tandem_reward.json", "tokenizer.json"} <= files


def test_cached_input_is_reused_and_refetched_when_the_remote_changes(s3, tmp_path):
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "a.txt").write_text("one")
    storage.upload(folder, "s3://prefs/cache/m")
    first = storage.cached_input("s3://prefs/cache/m")
    assert (first / "a.txt").read_text() == "one" and first.name == "m"
    assert storage.cached_input("s3://prefs/cache/m") == first  # same content: the same copy
    (folder / "a.txt").write_text("two!")  # another size: a new copy
    storage.upload(folder, "s3://prefs/cache/m")
    second = storage.cached_input("s3://prefs/cache/m")
    assert second != first and (second / "a.txt").read_text() == "two!"
    assert not [p for p in storage.cache_root().iterdir() if p.name.startswith(".")]  # no partial copies
    with pytest.raises(DataError, match="does not exist"):
        storage.cached_input("s3://prefs/cache/missing")
    assert storage.cached_input(str(folder)) == folder  # local paths are used as they are
