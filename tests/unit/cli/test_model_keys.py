"""A model folder a command reads besides the one it builds is checked first, in one line naming the config
key that gave it: the loaders' own hint says ``model.path`` (a train config's key), which sent users of
``tandem rm``/``dpo``/``label`` (keys ``model``, ``ref_model``, ``policy``) to the wrong line, and ``tandem
train`` of a PPO-with-reward-model config spent minutes on its warm start before noticing the reward model
was missing."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from tandem.cli.main import app
from tandem.errors import ModelError
from tandem.models.loading import check_model_key


def _one_error_line(result, key: str) -> str:
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 2, result.output
    assert len(lines) == 1 and lines[0].startswith(f"error: {key}:"), result.output
    return lines[0]


def test_check_model_key_names_the_key_and_passes_urls_and_none(tmp_path, tiny_model_dir):
    with pytest.raises(
        ModelError, match=r"critic.path: .*nope: model folder does not exist \(check critic.path"
    ):
        check_model_key(str(tmp_path / "nope"), "critic.path")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelError, match="ref_model: .*no config.json"):
        check_model_key(str(tmp_path / "empty"), "ref_model")
    for fine in (None, "s3://bucket/model", str(tiny_model_dir)):
        check_model_key(fine, "model")


@pytest.mark.parametrize("command", ["rm", "dpo"])
def test_rlhf_commands_name_their_own_model_key(tmp_path, command):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        f"model: {tmp_path / 'missing'}\nout_dir: {tmp_path / 'out'}\ndata:\n  train_file: x.jsonl\n"
    )
    line = _one_error_line(CliRunner().invoke(app, [command, str(cfg)]), "model")
    assert "model folder does not exist" in line and "check model in the config" in line


def test_train_checks_the_reward_model_before_building_a_warm_start(tmp_path, monkeypatch):
    import tandem.train.sft as sft

    def built(*args, **kwargs):
        raise AssertionError("the warm start was built before the reward model was checked")

    monkeypatch.setattr(sft, "build_warm_start", built)
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        f"model:\n  path: {tmp_path / 'warm'}\n  warm_start_sft: {{task: arith, steps: 5}}\n"
        f"data:\n  task: arith\nreward:\n  model:\n    path: {tmp_path / 'no-rm'}\n"
    )
    line = _one_error_line(CliRunner().invoke(app, ["train", str(cfg)]), "reward.model.path")
    assert "no-rm: model folder does not exist" in line


def test_dpo_without_held_out_pairs_says_so_instead_of_an_empty_table(capsys):
    from tandem.cli.rlhf import _print_dpo

    _print_dpo({}, {}, None, None)
    said = capsys.readouterr().out
    assert "no held-out pairs" in said and "DPO held-out" not in said
