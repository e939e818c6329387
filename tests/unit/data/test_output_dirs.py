"""Which folders a Tandem command may replace (tandem.data.outputs): only missing, empty or earlier
outputs of the same kind; never an unrelated folder, a file, another kind's output, or a folder the
command reads (or one holding it) — local folders and s3:// URLs alike."""

from __future__ import annotations

import json
import os

import pytest

from tandem.data import storage
from tandem.data.outputs import (
    EXPORT_MARKER,
    KINDS,
    MODEL_MARKER,
    REWARD_MARKER,
    check_output_dir,
    check_output_file,
    is_output,
    output_folder,
)
from tandem.errors import ConfigError


def _make_output(folder, kind: str) -> None:
    folder.mkdir(parents=True)
    for name in KINDS[kind].files:
        (folder / name).write_text("{}")
    (folder / "weights.bin").write_bytes(b"\x00")


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_output_dir_refuses_an_unrelated_folder(tmp_path, kind):
    precious = tmp_path / "photos"
    precious.mkdir()
    (precious / "cat.jpg").write_bytes(b"\xff\xd8")
    with pytest.raises(ConfigError) as err:
        check_output_dir(precious, kind, where="--out")
    assert str(err.value).startswith(f"--out: {precious} is not empty and not a Tandem {KINDS[kind].label}")
    assert "\n" not in str(err.value) and [p.name for p in precious.iterdir()] == ["cat.jpg"]


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_output_dir_accepts_a_missing_an_empty_and_an_earlier_output_folder(tmp_path, kind):
    check_output_dir(tmp_path / "new", kind)
    (tmp_path / "empty").mkdir()
    check_output_dir(tmp_path / "empty", kind)
    _make_output(tmp_path / "earlier", kind)
    check_output_dir(tmp_path / "earlier", kind)
    assert is_output(tmp_path / "earlier", kind)


def test_output_dir_refuses_another_kinds_output(tmp_path):
    _make_output(tmp_path / "export", "export")
    _make_output(tmp_path / "rm", "reward")
    with pytest.raises(ConfigError, match=f"not a Tandem model folder \\(no {MODEL_MARKER}\\)"):
        check_output_dir(tmp_path / "export", "model")
    with pytest.raises(ConfigError, match=f"not a Tandem export folder \\(no {EXPORT_MARKER}\\)"):
        check_output_dir(tmp_path / "rm", "export")


def test_output_dir_refuses_its_source_a_folder_holding_it_and_a_link_to_it(tmp_path):
    source = tmp_path / "models" / "tiny"
    _make_output(source, "model")  # even a Tandem model folder: it is what the command reads
    (tmp_path / "link").symlink_to(source, target_is_directory=True)
    for out in (source, tmp_path / "models", tmp_path, tmp_path / "link"):
        with pytest.raises(ConfigError, match=r"is \(or holds\) the source folder"):
            check_output_dir(out, "model", sources=(None, source), where="--out")
    check_output_dir(tmp_path / "models" / "sft", "model", sources=(source,))  # a sibling is fine


def test_output_dir_refuses_a_file(tmp_path):
    target = tmp_path / "notes.txt"
    target.write_text("keep me")
    with pytest.raises(ConfigError, match="notes.txt is a file, not a folder"):
        check_output_dir(target, "model")
    assert target.read_text() == "keep me"


def test_output_dir_refuses_its_source_file_and_the_folder_holding_it(tmp_path):
    source = tmp_path / "split" / "train.jsonl"  # `tandem data split split/train.jsonl --out-dir split`
    source.parent.mkdir()
    source.write_text("{}\n")
    (tmp_path / "split" / "val.jsonl").write_text("{}\n")  # even an earlier split: it holds the input
    for out in (source.parent, source):
        with pytest.raises(ConfigError, match=r"is \(or holds\) the source file .*train.jsonl"):
            check_output_dir(out, "split", sources=(source,), where="--out-dir")
    assert source.read_text() == "{}\n"


def test_output_dir_refuses_a_path_below_a_file(tmp_path):
    (tmp_path / "prefs.jsonl").write_text("{}\n")
    with pytest.raises(ConfigError, match=r"^--out-dir: .*prefs.jsonl is a file, not a folder"):
        check_output_dir(tmp_path / "prefs.jsonl" / "split" / "deeper", "split", where="--out-dir")


def test_output_file_refuses_its_input_by_any_name(tmp_path):
    source = tmp_path / "prefs.jsonl"
    source.write_text("keep me")
    (tmp_path / "link.jsonl").symlink_to(source)
    os.link(source, tmp_path / "hard.jsonl")
    names = (source, tmp_path / "." / "prefs.jsonl", f"file://{source}", tmp_path / "link.jsonl")
    for out in (*names, tmp_path / "hard.jsonl"):
        with pytest.raises(ConfigError, match=r"^--out: .* is the input .*prefs.jsonl; writing there"):
            check_output_file(out, sources=(None, source), where="--out")
    check_output_file(tmp_path / "dedup.jsonl", sources=(source,), where="--out")  # a sibling is fine
    check_output_file(source, where="--out")  # an existing file that is not an input is replaced
    assert source.read_text() == "keep me"


def test_output_file_refuses_a_folder_and_a_path_below_a_file(tmp_path):
    (tmp_path / "dir").mkdir()
    (tmp_path / "prefs.jsonl").write_text("{}\n")
    with pytest.raises(ConfigError, match=r"^--out: .*dir is a folder, not a file \(choose another --out\)$"):
        check_output_file(tmp_path / "dir", where="--out")
    with pytest.raises(ConfigError, match=r"^--sidecar: .*prefs.jsonl is a file, not a folder"):
        check_output_file(tmp_path / "prefs.jsonl" / "bad.jsonl", where="--sidecar")


def test_output_file_compares_urls_as_text():
    with pytest.raises(ConfigError, match="s3://b/prefs.jsonl is the input"):
        check_output_file("s3://b/prefs.jsonl", sources=("s3://b/prefs.jsonl",), where="--out")
    check_output_file("s3://b/dedup.jsonl", sources=("s3://b/prefs.jsonl",), where="--out")


def test_markers_are_the_files_the_commands_write():
    from tandem.export import MANIFEST
    from tandem.monitor.metrics import METRICS_FILE
    from tandem.train.rm import STATS_FILE

    assert MANIFEST == EXPORT_MARKER and STATS_FILE == REWARD_MARKER
    assert KINDS["run"].files == ("config.yaml", METRICS_FILE)


def test_remote_out_refuses_an_unrelated_remote_folder_and_its_source(s3):
    s3.pipe("prefs/outputs-unit/photos/cat.jpg", b"\xff\xd8")
    with pytest.raises(ConfigError, match="s3://prefs/outputs-unit/photos is not empty and not a Tandem"):
        check_output_dir("s3://prefs/outputs-unit/photos", "export", where="--out")
    with pytest.raises(ConfigError, match=r"is \(or holds\) the source folder"):
        check_output_dir("s3://prefs/outputs-unit", "model", sources=("s3://prefs/outputs-unit/m/",))
    check_output_dir("s3://prefs/outputs-unit/new", "export")
    assert s3.cat("prefs/outputs-unit/photos/cat.jpg") == b"\xff\xd8"


def test_output_folder_replaces_an_earlier_remote_output_and_uploads_the_marker_last(s3, monkeypatch):
    url = "s3://prefs/outputs-unit/exp"
    s3.pipe("prefs/outputs-unit/exp/stale.onnx", b"old")
    s3.pipe(f"prefs/outputs-unit/exp/{EXPORT_MARKER}", b'{"format": "onnx"}')
    uploaded: list[str] = []
    put_file = s3.put_file
    monkeypatch.setattr(
        s3, "put_file", lambda lpath, rpath, **kw: (uploaded.append(rpath), put_file(lpath, rpath, **kw))
    )
    with output_folder(url, "export") as local:
        local.mkdir()
        (local / EXPORT_MARKER).write_text(json.dumps({"format": "hf"}))
        (local / "model.safetensors").write_bytes(b"new")
    assert storage.list_names(url) == ["model.safetensors", EXPORT_MARKER]
    assert json.loads(s3.cat(f"prefs/outputs-unit/exp/{EXPORT_MARKER}")) == {"format": "hf"}
    assert uploaded[-1].endswith(EXPORT_MARKER)


def test_output_folder_refuses_a_remote_folder_that_became_unrelated_meanwhile(s3):
    url = "s3://prefs/outputs-unit/race"
    with (
        pytest.raises(ConfigError, match="not a Tandem export folder"),
        output_folder(url, "export") as local,
    ):
        local.mkdir()
        (local / EXPORT_MARKER).write_text("{}")
        s3.pipe("prefs/outputs-unit/race/thesis.tex", b"years")  # someone else wrote there meanwhile
    assert storage.list_names(url) == ["thesis.tex"]
