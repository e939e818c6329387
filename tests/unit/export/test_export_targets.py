"""`tandem export --out` never loses data: an unrelated folder, the source model folder (or a folder
holding it) are refused with one line naming the path; an earlier export folder is replaced atomically."""

from __future__ import annotations

import json
import shutil

import pytest
from typer.testing import CliRunner

from tandem.cli.main import app
from tandem.errors import ConfigError
from tandem.export import MANIFEST
from tandem.export.api import export_model


def test_export_refuses_unrelated_folder(tiny_model_dir, tmp_path):
    precious = tmp_path / "photos"
    precious.mkdir()
    (precious / "cat.jpg").write_bytes(b"\xff\xd8 not really a jpeg")
    result = CliRunner().invoke(
        app, ["export", str(tiny_model_dir), "--format", "hf", "--out", str(precious)]
    )
    assert result.exit_code == 2
    assert f"error: --out: {precious} is not empty and not a Tandem export folder" in result.output
    assert "Traceback" not in result.output
    assert [p.name for p in precious.iterdir()] == ["cat.jpg"]


def test_export_refuses_the_source_model_folder(tiny_model_dir, tmp_path):
    source = tmp_path / "model"
    shutil.copytree(tiny_model_dir, source)
    (source / "README.md").write_text("model card")
    for out in (source, tmp_path):  # the folder itself, and a folder holding it
        with pytest.raises(ConfigError, match=r"is \(or holds\) the source folder"):
            export_model(source, out, "hf")
    assert (source / "README.md").read_text() == "model card"


def test_export_refuses_a_file_as_out(tiny_model_dir, tmp_path):
    target = tmp_path / "notes.txt"
    target.write_text("keep me")
    with pytest.raises(ConfigError, match="notes.txt is a file, not a folder"):
        export_model(tiny_model_dir, target, "hf")
    assert target.read_text() == "keep me"


def test_export_replaces_an_earlier_export_and_an_empty_folder(tiny_model_dir, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    export_model(tiny_model_dir, empty, "hf")
    manifest = json.loads((empty / MANIFEST).read_text())
    assert manifest == {"format": "hf", "source": str(tiny_model_dir)}
    (empty / "stale.txt").write_text("from the previous export")
    export_model(tiny_model_dir, empty, "int8")  # an export folder: replaced as a whole
    assert (
        not (empty / "stale.txt").exists() and json.loads((empty / MANIFEST).read_text())["format"] == "int8"
    )
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temp folders left
