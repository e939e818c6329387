"""``tandem demo`` run from another folder uses the shipped warm start instead of rebuilding it there."""

from __future__ import annotations

from typer.testing import CliRunner

from tandem.cli.main import app


def test_demo_from_another_folder_uses_the_shipped_warm_start(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = ["demo", "trainer.total_steps=1", "data.eval_size=4", "monitor.progress=false"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "building warm-start" not in result.output and not (tmp_path / "checkpoints").exists()
    assert (tmp_path / "runs" / "quickstart" / "summary.json").is_file()  # the run lands here, as documented
